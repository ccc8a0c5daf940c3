"""What the training benchmarks share: the tutorial CNN, synthetic 8x8 digits, epoch timing, the
interleaved repetitions and the steps/s ratios (bench_overhead, bench_custom_loop, bench_speed).

Import it after `kerasdist.simulate_devices(...)`: it imports Keras and TensorFlow.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable

import keras
import numpy as np

BATCH, CLASSES = 128, 10
MODEL_TEXT = "Conv2D 32 x2 + Dense 64 + Dense 10 on 8x8x1, Adam"

# A variant trains `epochs` epochs from scratch into a fresh checkpoint directory and returns
# perf_counter() at each epoch end.
Variant = Callable[[int, str], list[float]]


def tutorial_cnn(with_loss: bool = True, float32_output: bool = False) -> keras.Model:
    """The small CNN of TensorFlow's distributed-training tutorials, compiled with Adam."""
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        # float32 outputs under mixed precision, as Keras's guide advises
        keras.layers.Dense(CLASSES, dtype="float32" if float32_output else None),
    ])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True) if with_loss else None
    model.compile(optimizer="adam", loss=loss)
    return model


def synthetic_digits(samples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.random((samples, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=samples).astype(np.int32)
    return x, y


class EpochTimes(keras.callbacks.Callback):
    """perf_counter() at each epoch end."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[float] = []

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.ends.append(time.perf_counter())


def parser(epochs: int, samples: int) -> argparse.ArgumentParser:
    result = argparse.ArgumentParser()
    result.add_argument("--repeats", type=int, default=3)
    result.add_argument("--epochs", type=int, default=epochs)
    result.add_argument("--samples", type=int, default=samples)
    return result


def check_epochs(arguments: argparse.ArgumentParser, epochs: int) -> None:
    if epochs < 2:
        arguments.error("--epochs must be at least 2 (the steady-state figure needs epochs after the first)")


def timed(variant: Variant, epochs: int, directory: str) -> tuple[float, float]:
    """(wall seconds of the call, seconds from the first epoch end to the last).

    As timeit does, the garbage collector is run before and kept off during the call: a full
    collection of the earlier repetitions' models and graphs takes about 2 s here and otherwise
    lands inside whichever call happens to trigger it.
    """
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        ends = variant(epochs, directory)
        wall = time.perf_counter() - start
    finally:
        gc.enable()
    return wall, ends[-1] - ends[0]


def interleaved(variants: dict[str, Variant], repeats: int, epochs: int, steps: int,
                warm_up_epochs: int = 2) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """One untimed warm-up call of each variant, then `repeats` rounds of each in turn (every other
    round in the reverse order, so that no variant always runs first): steps/s of each whole call
    and of its epochs after the first, by variant."""
    whole: dict[str, list[float]] = {name: [] for name in variants}
    steady: dict[str, list[float]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in variants.values():
            variant(warm_up_epochs, tempfile.mkdtemp(dir=tmp))
        for round_ in range(repeats):
            for name in list(variants)[:: 1 if round_ % 2 == 0 else -1]:
                wall, after_first = timed(variants[name], epochs, tempfile.mkdtemp(dir=tmp))
                whole[name].append(steps * epochs / wall)
                steady[name].append(steps * (epochs - 1) / after_first)
    return whole, steady


def ratios(rates: dict[str, list[float]], over: str, under: str) -> list[float]:
    return [a / b for a, b in zip(rates[over], rates[under], strict=True)]


def medians(rates: dict[str, list[float]], names: tuple[str, ...] | None = None) -> dict[str, float]:
    return {name: round(statistics.median(rates[name]), 1) for name in names or tuple(rates)}


def epoch_ends(train: Callable[[list[keras.callbacks.Callback]], object]) -> list[float]:
    """Run `train(callbacks)` with an epoch timer among the callbacks; its epoch end times."""
    timer = EpochTimes()
    train([timer])
    return timer.ends


def whole_and_steady_figures(name: str, whole: dict[str, list[float]], steady: dict[str, list[float]],
                             over: str, under: str, target: str | None, what: str) -> list[dict]:
    """The two figures of a comparison: steps/s of the whole call (against `target`) and of the
    epochs after the first, `over` / `under`."""
    from _common import figure

    return [
        figure(f"{name}_steps_per_s_ratio", ratios(whole, over, under), target,
               f"steps/s of the whole call (total steps / wall time), {what}", steps_per_s=medians(whole)),
        figure(f"{name}_steady_steps_per_s_ratio", ratios(steady, over, under), None,
               f"steps/s over the epochs after the first (epoch end times), {what}", steps_per_s=medians(steady)),
    ]


def arguments_and_data(arguments: argparse.ArgumentParser) -> tuple[argparse.Namespace, np.ndarray, np.ndarray, int]:
    """The parsed arguments (at least 2 epochs), the synthetic data and the steps of an epoch."""
    args = arguments.parse_args()
    check_epochs(arguments, args.epochs)
    x, y = synthetic_digits(args.samples)
    return args, x, y, -(-args.samples // BATCH)


def run_details(model: keras.Model, args: argparse.Namespace, steps: int, order: str) -> dict:
    """What every training benchmark records about its run beside its figures."""
    import tensorflow as tf

    return dict(model=f"{MODEL_TEXT}, {model.count_params()} parameters", samples=args.samples,
                batch_size=BATCH, epochs=args.epochs, steps_per_call=steps * args.epochs,
                repeats=args.repeats,
                order=f"warm-up of each once, then {order}, ... interleaved, every other round reversed",
                versions=f"TF {tf.__version__}, Keras {keras.__version__}")
