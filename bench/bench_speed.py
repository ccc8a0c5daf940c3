"""Mixed precision and XLA against plain float32 training on this machine, for information.

Three variants of the same `kerasdist.distributed_fit` call train the same small CNN
(8x8x1 -> Conv 32 -> Conv 32 -> Dense 64 -> 10, Adam; built fresh each time) on the same
synthetic data (8192 samples, global batch 128, 3 epochs, a checkpoint every epoch end) under
the default strategy (one device: the CPU here, the GPU on a GPU machine):

- plain: float32, no XLA;
- mixed_precision: `mixed_precision=True` (`mixed_bfloat16` on a CPU, `mixed_float16` on a GPU);
- jit_compile: `jit_compile=True` (the training step compiled by XLA).

One untimed warm-up call of each first, then the variants interleaved (plain, mixed_precision,
jit_compile, ...), the garbage collector run before each timed call and off during it. Figures
(no target: a CPU without bfloat16 units gains nothing from bfloat16, and XLA's gain depends on
the model): steps/s of each option over plain, over the whole call (compilation included) and
over the epochs after the first (steady state). Prints one JSON line and writes
bench/results/speed.json.

usage: .venv/bin/python bench/bench_speed.py [--repeats 3] [--epochs 3] [--samples 8192]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist  # noqa: E402
from _common import figure, write_result  # noqa: E402

BATCH, CLASSES = 128, 10
VARIANTS = {"plain": {}, "mixed_precision": {"mixed_precision": True}, "jit_compile": {"jit_compile": True}}


def build_model() -> keras.Model:
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        # float32 outputs under mixed precision, as Keras's guide advises
        keras.layers.Dense(CLASSES, dtype="float32"),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class EpochTimes(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.ends: list[float] = []

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.ends.append(time.perf_counter())


def run(options, x, y, epochs, checkpoint_dir) -> list[float]:
    timer = EpochTimes()
    kerasdist.distributed_fit(build_model, x, y, epochs=epochs, checkpoint_dir=checkpoint_dir,
                              strategy="default", batch_size=BATCH, seed=0, callbacks=[timer],
                              verbose=0, **options)
    return timer.ends


def timed(options, x, y, epochs, tmp) -> tuple[float, float]:
    """(wall seconds of the call, seconds from the first epoch end to the last)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        ends = run(options, x, y, epochs, tempfile.mkdtemp(dir=tmp))
        wall = time.perf_counter() - start
    finally:
        gc.enable()
    return wall, ends[-1] - ends[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8192)
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the steady-state figure needs epochs after the first)")

    rng = np.random.default_rng(0)
    x = rng.random((args.samples, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=args.samples).astype(np.int32)
    steps = -(-args.samples // BATCH)

    whole = {name: [] for name in VARIANTS}
    steady = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for options in VARIANTS.values():
            run(options, x, y, 2, tempfile.mkdtemp(dir=tmp))  # warm-up, untimed
        for _ in range(args.repeats):
            for name, options in VARIANTS.items():
                wall, after_first = timed(options, x, y, args.epochs, tmp)
                whole[name].append(steps * args.epochs / wall)
                steady[name].append(steps * (args.epochs - 1) / after_first)

    figures = []
    for option in ("mixed_precision", "jit_compile"):
        for label, rates, what in (("", whole, "the whole call (compilation included)"),
                                   ("_steady", steady, "the epochs after the first")):
            values = [o / p for o, p in zip(rates[option], rates["plain"], strict=True)]
            figures.append(figure(
                f"{option}{label}_steps_per_s_ratio", values, None,
                f"steps/s over {what}, distributed_fit with {option}=True over plain float32",
                steps_per_s={name: round(statistics.median(rates[name]), 1) for name in ("plain", option)},
            ))
    write_result(
        "speed", figures,
        strategy="default (one device)", policy_of_mixed_precision=kerasdist.training.speed.precision_policy_name(),
        model=f"Conv2D 32 x2 + Dense 64 + Dense 10 on 8x8x1, Adam, {build_model().count_params()} parameters",
        samples=args.samples, batch_size=BATCH, epochs=args.epochs, steps_per_call=steps * args.epochs,
        repeats=args.repeats, order="warm-up of each once, then plain, mixed_precision, jit_compile, ... interleaved",
        versions=f"TF {tf.__version__}, Keras {keras.__version__}",
    )


if __name__ == "__main__":
    main()
