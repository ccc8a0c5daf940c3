"""Input pipelines: the Python twin of vignette("input-pipelines").

Global vs per-replica batch size, arrays (first axis = sample) and data frames, the seeded
per-epoch order, rebuilding the rest of an interrupted stream, and a validation split.

    python examples/input_pipelines.py
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import kerasdist  # noqa: E402


def labels(dataset) -> list[int]:
    return [int(v) for _, y in dataset for v in y.numpy()]


def main() -> None:
    kerasdist.simulate_devices(2)
    strategy = kerasdist.select_strategy()
    print(f"strategy {kerasdist.describe_strategy(strategy).kind} with "
          f"{strategy.num_replicas_in_sync} replicas")

    # Global vs per-replica batch size, worked out without building anything.
    print(kerasdist.batch_size_info(64, num_replicas=2, num_samples=1000))
    print(kerasdist.batch_size_info(per_replica_batch_size=64, num_replicas=2, num_samples=1000))
    try:
        kerasdist.batch_size_info(65, num_replicas=2, require_even_split=True)
    except ValueError as err:
        print(f"refused: {err}")

    # Arrays: the first axis is the sample.
    x = np.arange(1, 13, dtype="float32").reshape(3, 4).T   # R's matrix(1:12, 4): 4 samples
    ds = kerasdist.make_dataset(x, np.array([10, 20, 30, 40]), batch_size=2, shuffle=False,
                                epochs=1, strategy=strategy)
    features, targets = next(iter(ds))
    print("first batch:", features.numpy().tolist(), targets.numpy().tolist())

    images, digits = kerasdist.load_digits()
    ds = kerasdist.make_dataset(images, digits, per_replica_batch_size=32, seed=1, strategy=strategy)
    info = kerasdist.dataset_info(ds)
    print(f"digits {images.shape}: global batch {info.batch_size} "
          f"({info.per_replica_batch_size} per replica on {info.num_replicas} replicas), "
          f"{info.steps_per_epoch} steps per epoch, shard {info.shard_policy}")

    # A data frame, with the target named by its column.
    df = pd.DataFrame({"height": [1.2, 1.5, 1.7, 1.9], "weight": [20, 45, 60, 80],
                       "label": [0, 0, 1, 1]})
    info = kerasdist.dataset_info(kerasdist.make_dataset(df, "label", batch_size=2, strategy=strategy))
    print(f"data frame: source {info.source}, {info.num_samples} samples")

    # The order of each epoch is a pure function of (seed, epoch); 0-based in Python.
    print("epoch 0 order:", kerasdist.epoch_order(10, seed=1, epoch=0).tolist())
    print("epoch 1 order:", kerasdist.epoch_order(10, seed=1, epoch=1).tolist())

    # Rebuild the rest of a stream interrupted after 2 batches of epoch 1.
    x = np.arange(20, dtype="float32").reshape(20, 1)
    y = np.arange(1, 21)
    full = labels(kerasdist.make_dataset(x, y, batch_size=4, seed=7, epochs=2))
    rest = labels(kerasdist.make_dataset(x, y, batch_size=4, seed=7, epochs=2,
                                         initial_epoch=1, skip_batches=2))
    print(f"resumed stream matches the uninterrupted one: {full[-len(rest):] == rest}")

    # Validation split: the last 20% of the samples, held out before shuffling.
    train, validation = kerasdist.make_dataset_split(images, digits, validation_split=0.2, batch_size=64,
                                                     seed=1, strategy=strategy)
    print(f"validation split: {kerasdist.dataset_info(train).num_samples} train, "
          f"{kerasdist.dataset_info(validation).num_samples} validation samples")


if __name__ == "__main__":
    main()
