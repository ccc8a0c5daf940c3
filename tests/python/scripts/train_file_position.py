"""resume_fit on make_dataset's own TFRecord files (of unequal lengths), under 2 CPU replicas.

usage: train_file_position.py ROOT [--kill-at STEP] [--then ROOT [--kill-at STEP] ...]

Trains 3 epochs of 10 steps, a checkpoint every 3 steps, into ROOT/ckpt;
writes ROOT/result.npz (the weights and losses). --kill-at SIGKILLs the process once that
optimizer step's checkpoint is written. The roots after --then train one after the other in this
one process (a process costs TensorFlow's and the strategy's set-up)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import kerasdist

kerasdist.simulate_devices(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from kerasdist.checkpoint import background  # noqa: E402

tf.config.experimental.enable_op_determinism()
FILE_RECORDS = (40, 9, 31, 3, 22, 17, 28, 6)  # 156 records: 10 batches of 16 an epoch (batches run on over epoch ends)
BATCH, EPOCHS, EVERY, PADDING = 16, 3, 3, 2000  # PADDING: bytes of each record's unused feature


def write_files(folder: Path) -> None:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for part, n in enumerate(FILE_RECORDS):
        with tf.io.TFRecordWriter(str(folder / f"part-{part}.tfrecord")) as writer:
            for _ in range(n):
                x = rng.random(4, dtype=np.float32)
                feature = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x.sum() * 1.5) % 3])),
                    "pad": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(PADDING)])),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def build_model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class Interrupt(keras.callbacks.Callback):
    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_train_batch_end(self, batch, logs=None):
        if self.at is not None and int(self.model.optimizer.iterations.numpy()) == self.at:
            background.wait_for_all()
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    while "--then" in argv:
        train(argv[:argv.index("--then")])
        argv = argv[argv.index("--then") + 1:]
    train(argv)


def train(argv: list[str]) -> None:
    root = Path(argv[0])
    kill_at = int(argv[argv.index("--kill-at") + 1]) if "--kill-at" in argv else None
    if not (root / "files").exists():
        write_files(root / "files")
    features = {"x": [4], "y": tf.io.FixedLenFeature([], tf.int64)}
    data = kerasdist.make_dataset(str(root / "files" / "*.tfrecord"), label_column="y", features=features,
                                  batch_size=BATCH, seed=5)
    strategy = kerasdist.select_strategy()
    with strategy.scope():
        model = kerasdist.make_or_restore_model(root / "ckpt", build_model)
    checkpoint = kerasdist.checkpoint_callback(root / "ckpt", every_steps=EVERY, keep=100)
    history = kerasdist.resume_fit(model, data, EPOCHS, checkpoint, callbacks=[Interrupt(kill_at)], verbose=0)
    np.savez(root / "result.npz", *model.get_weights(), loss=np.array(history.history["loss"]))


if __name__ == "__main__":
    main(sys.argv[1:])
