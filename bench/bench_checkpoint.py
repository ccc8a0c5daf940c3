"""Checkpoint overhead: fit with per-epoch checkpoints against the same fit without, side by side.

Prints one JSON line and writes bench/results/checkpoint.json. The variants are interleaved
(plain, checkpointed, plain, ...) so machine noise hits both; the figure is the median of the
per-repetition ratios (bench/_common.py). Also times one save and one restore of the checkpoint.
The model has 5.27M parameters, the size the < 1.05 target was set for; the ratio depends on how
long an epoch is against one save, so --samples should keep an epoch at several seconds.

usage: python bench/bench_checkpoint.py [--repeats 3] [--epochs 2] [--samples 16384]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist  # noqa: E402
from _common import figure, write_result  # noqa: E402  (bench/ is the script's directory)
from kerasdist.checkpoint import save_checkpoint  # noqa: E402

FEATURES, HIDDEN, CLASSES, BATCH = 512, 2048, 10, 128


def build_model() -> keras.Model:
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def timed_fit(model, data, epochs, callbacks) -> float:
    start = time.perf_counter()
    model.fit(data, epochs=epochs, callbacks=callbacks, verbose=0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=16384)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=args.samples)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).cache().prefetch(tf.data.AUTOTUNE)
    model = build_model()
    model.fit(data.take(2), epochs=1, verbose=0)  # trace and build before timing

    plain, checkpointed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            plain.append(timed_fit(model, data, args.epochs, []))
            callback = kerasdist.checkpoint_callback(Path(tmp) / f"r{repeat}", keep=1)
            checkpointed.append(timed_fit(model, data, args.epochs, [callback]))
        save_seconds = []
        for i in range(3):
            start = time.perf_counter()
            save_checkpoint(model, Path(tmp) / "timing", epoch=i)
            save_seconds.append(time.perf_counter() - start)
        start = time.perf_counter()
        kerasdist.make_or_restore_model(Path(tmp) / "timing", build_model)
        restore_seconds = time.perf_counter() - start
        size = sum(f.stat().st_size for f in Path(kerasdist.latest_checkpoint(Path(tmp) / "timing").path).iterdir())

    ratios = [c / p for p, c in zip(plain, checkpointed, strict=True)]
    figures = [figure(
        "checkpointed_vs_plain_fit_time", ratios, "< 1.05",
        f"seconds of a fit of {args.epochs} epoch(s) with a per-epoch checkpoint_callback (keep=1) / "
        f"the same fit with no callback, {model.count_params() / 1e6:.2f}M-parameter MLP with Adam, "
        f"per interleaved repetition",
        parameters=int(model.count_params()))]
    write_result(
        "checkpoint", figures,
        parameters=int(model.count_params()),
        epoch_seconds_median=round(statistics.median(plain) / args.epochs, 3),
        plain_seconds=[round(t, 3) for t in plain],
        checkpointed_seconds=[round(t, 3) for t in checkpointed],
        save_seconds_median=round(statistics.median(save_seconds), 3),
        save_seconds=[round(t, 3) for t in save_seconds],
        restore_seconds=round(restore_seconds, 3),
        checkpoint_megabytes=round(size / 1e6, 1),
        repeats=args.repeats, epochs_per_fit=args.epochs, samples=args.samples, batch_size=BATCH,
    )


if __name__ == "__main__":
    main()
