"""What distributed_fit costs over the same training written by hand, tutorial style.

Both variants train the same small CNN (8x8x1 -> Conv 32 -> Conv 32 -> Dense 64 -> 10, Adam) on
the same synthetic data (16384 samples, global batch 128, as many epochs as make a hand-written
call last about 30 s, `--seconds`), from scratch, under a
MirroredStrategy over 2 simulated CPU devices, saving a checkpoint at every epoch end:

- distributed_fit: kerasdist.distributed_fit(build_model, x, y, strategy=<mirrored>, batch_size=128,
  epochs=E, checkpoint_dir=<fresh empty directory>, seed=0): make_dataset (reshuffled each epoch),
  crash-safe checkpoints (keep=3), resume logic.
- hand-written: `with strategy.scope(): model = build_model()`, then
  `from_tensor_slices((x, y)).shuffle(n, seed=0).batch(128)` (reshuffled each epoch, as
  distributed_fit does) and `model.fit(data, epochs=E, callbacks=[ModelCheckpoint(<fresh>.keras)])`.

One untimed warm-up call of each first (TensorFlow's one-time costs in this process), then the
variants interleaved (distributed_fit, hand-written, ...), each repetition with a fresh model,
the garbage collector run before each timed call and off during it (as timeit does).
Figures: total steps / wall time of the whole call, distributed_fit over hand-written (what a
user waits for), and the same over the epochs after the first (steady state, from epoch end
times). Prints one JSON line and writes bench/results/overhead.json.

usage: .venv/bin/python bench/bench_overhead.py [--repeats 3] [--seconds 30 | --epochs E] [--samples 16384]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasdist  # noqa: E402

kerasdist.simulate_devices(2)  # before TensorFlow initialises its devices

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from _common import figure, write_result  # noqa: E402

BATCH, CLASSES = 128, 10


def build_model() -> keras.Model:
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class EpochTimes(keras.callbacks.Callback):
    """perf_counter() at each epoch end."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[float] = []

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.ends.append(time.perf_counter())


def run_wrapper(strategy, x, y, epochs, checkpoint_dir, timer) -> None:
    kerasdist.distributed_fit(build_model, x, y, epochs=epochs, checkpoint_dir=checkpoint_dir,
                              strategy=strategy, batch_size=BATCH, seed=0, callbacks=[timer],
                              verbose=0)


def run_hand_written(strategy, x, y, epochs, checkpoint_dir, timer) -> None:
    with strategy.scope():
        model = build_model()
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).batch(BATCH)
    checkpoint = keras.callbacks.ModelCheckpoint(str(Path(checkpoint_dir) / "model.keras"))
    model.fit(data, epochs=epochs, callbacks=[checkpoint, timer], verbose=0)


VARIANTS = {"distributed_fit": run_wrapper, "hand_written": run_hand_written}


def timed(run, strategy, x, y, epochs, tmp) -> tuple[float, float]:
    """(wall seconds of the call, seconds from the first epoch end to the last).

    As timeit does, the garbage collector is run before and kept off during the call: a full
    collection of the earlier repetitions' models and graphs takes about 2 s here and otherwise
    lands inside whichever call happens to trigger it.
    """
    timer = EpochTimes()
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        run(strategy, x, y, epochs, tempfile.mkdtemp(dir=tmp), timer)
        wall = time.perf_counter() - start
    finally:
        gc.enable()
    return wall, timer.ends[-1] - timer.ends[0]


def ratios(rates: dict[str, list[float]]) -> list[float]:
    return [w / h for w, h in zip(rates["distributed_fit"], rates["hand_written"], strict=True)]


def medians(rates: dict[str, list[float]]) -> dict[str, float]:
    return {name: round(statistics.median(r), 1) for name, r in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=0,
                        help="epochs per timed call; 0 (default): as many as make a --seconds call")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="length of a timed call when --epochs is 0 (from a hand-written epoch's time)")
    parser.add_argument("--samples", type=int, default=16384)
    args = parser.parse_args()
    if args.epochs == 1 or args.epochs < 0:
        parser.error("--epochs must be at least 2 (the steady-state figure needs epochs after the first)")

    rng = np.random.default_rng(0)
    x = rng.random((args.samples, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=args.samples).astype(np.int32)
    strategy = kerasdist.select_strategy("mirrored")
    steps = -(-args.samples // BATCH)

    whole = {name: [] for name in VARIANTS}
    steady = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for run in VARIANTS.values():
            run(strategy, x, y, 1, tempfile.mkdtemp(dir=tmp), EpochTimes())  # warm-up, untimed
        if not args.epochs:  # a call of about --seconds: epochs from a hand-written epoch's time
            probe = EpochTimes()
            run_hand_written(strategy, x, y, 2, tempfile.mkdtemp(dir=tmp), probe)
            args.epochs = max(2, round(args.seconds / (probe.ends[1] - probe.ends[0])))
        for _ in range(args.repeats):
            for name, run in VARIANTS.items():
                wall, after_first = timed(run, strategy, x, y, args.epochs, tmp)
                whole[name].append(steps * args.epochs / wall)
                steady[name].append(steps * (args.epochs - 1) / after_first)

    figures = [
        figure("wrapper_steps_per_s_ratio", ratios(whole), ">= 1.0",
               f"steps/s of the whole call (total steps / wall time, {args.epochs} epochs: about "
               f"{args.seconds:.0f} s), distributed_fit over hand-written: the pipeline should win",
               steps_per_s=medians(whole)),
        figure("wrapper_steady_steps_per_s_ratio", ratios(steady), None,
               "steps/s over the epochs after the first (epoch end times), distributed_fit over hand-written",
               steps_per_s=medians(steady)),
    ]
    write_result(
        "overhead", figures,
        strategy=f"MirroredStrategy over {strategy.num_replicas_in_sync} simulated CPU devices",
        model=f"Conv2D 32 x2 + Dense 64 + Dense 10 on 8x8x1, Adam, {build_model().count_params()} parameters",
        samples=args.samples, batch_size=BATCH, epochs=args.epochs, steps_per_call=steps * args.epochs,
        repeats=args.repeats, order="warm-up of each once, then distributed_fit, hand_written, ... interleaved",
        distributed_fit=("kerasdist.distributed_fit(build_model, x, y, strategy=<mirrored>, batch_size=128, "
                         "seed=0, epochs=E, checkpoint_dir=<fresh empty dir>): make_dataset reshuffled "
                         "each epoch, checkpoint every epoch end (keep=3)"),
        hand_written=("with strategy.scope(): build_model(); "
                      "tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=0).batch(128) "
                      "(reshuffled each epoch, no cache/prefetch); model.fit(data, epochs=E, "
                      "callbacks=[keras.callbacks.ModelCheckpoint(<fresh dir>/model.keras)])"),
        versions=f"TF {tf.__version__}, Keras {keras.__version__}",
    )


if __name__ == "__main__":
    main()
