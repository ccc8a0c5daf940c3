"""One worker of a 2-worker run: which samples does each worker's share of make_dataset hold?

usage: shard_probe.py DATA_DIR OUT_PREFIX CHECKPOINT_DIR
DATA_DIR holds part0.csv .. part3.csv (columns a, b, label; label = the sample's id). For three
pipelines, files sharded by file (FILE policy), in-memory arrays and files with per_worker=True, this
worker iterates one epoch of its own share, then trains one epoch on it with fit (the workers'
all-reduce runs only if both have the same number of steps). Writes OUT_PREFIX-<index>.json:
{mode: {"ids": [...], "shard_policy": ..., "epoch_order": ..., "steps": ..., "loss": ...}}.
Then a model built in the strategy's scope (not by make_or_restore_model: resume_fit restores it
from CHECKPOINT_DIR, the chief reading) trains one epoch of the in-memory per_worker data with
resume_fit, a checkpoint every 3 steps (the chief writes them), and resume_fit is called once more
(every worker must then agree that the model holds the store's state: no restore, nothing to train).
"""

import glob
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist  # noqa: E402

GLOBAL_BATCH = 8


def build_model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def local_ids(strategy, dataset, steps):
    """The labels (sample ids) of this worker's first `steps` batches."""
    if isinstance(dataset, tf.data.Dataset):  # per_worker pipelines come distributed already
        dataset = strategy.experimental_distribute_dataset(dataset)
    ids, batches = [], iter(dataset)
    for _ in range(steps):
        _, y = next(batches)
        for part in strategy.experimental_local_results(y):
            ids.extend(int(v) for v in np.asarray(part).ravel())
    return ids


def probe(strategy, dataset, model):
    info = kerasdist.dataset_info(dataset)
    ids = local_ids(strategy, dataset, info.steps_per_epoch)
    history = model.fit(dataset, epochs=1, steps_per_epoch=info.steps_per_epoch, verbose=0)
    return {"ids": ids, "shard_policy": info.shard_policy, "epoch_order": info.epoch_order,
            "steps": info.steps_per_epoch,
            "loss": float(history.history["loss"][-1])}


def main():
    data_dir, out_prefix, checkpoint_dir = sys.argv[1:4]
    strategy = kerasdist.select_strategy()
    with strategy.scope():
        model = build_model()
    files = sorted(glob.glob(os.path.join(data_dir, "part*.csv")))
    by_file = kerasdist.make_dataset(files, label_column="label", batch_size=GLOBAL_BATCH,
                                     strategy=strategy, seed=1, epochs=1)
    table = np.concatenate([np.loadtxt(f, delimiter=",", skiprows=1) for f in files])
    per_worker = kerasdist.make_dataset(table[:, :2].astype("float32"), table[:, 2], batch_size=GLOBAL_BATCH,
                                        strategy=strategy, seed=1, per_worker=True)
    files_per_worker = kerasdist.make_dataset(files, label_column="label", batch_size=GLOBAL_BATCH,
                                              strategy=strategy, seed=1, per_worker=True)
    result = {"files": probe(strategy, by_file, model), "per_worker": probe(strategy, per_worker, model),
              "files_per_worker": probe(strategy, files_per_worker, model)}
    with strategy.scope():
        checkpointed = build_model()
    for _ in range(2):
        kerasdist.resume_fit(checkpointed, per_worker, 1,
                             kerasdist.checkpoint_callback(checkpoint_dir, every_steps=3), verbose=0)
    index = os.environ["KERASDIST_TASK_INDEX"]
    with open(f"{out_prefix}-{index}.json", "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()
