"""Steps/s of a small fit fed by make_dataset, by the naive pipeline, and with no input at all.

- make_dataset: kerasdist.make_dataset(x, y, batch_size=B, seed=0): shuffled per epoch (pure
  function of seed and epoch), one endless stream, fit with steps_per_epoch.
- naive: tf.data.Dataset.from_tensor_slices((x, y)).batch(B): no shuffle at all.
- compute_only: one batch already in memory, repeated (from_tensors(batch).repeat()): the model
  stepping with no input work, the ceiling for any pipeline.

Each variant has its own model, compiled and warmed up once (tracing excluded); then REPS rounds,
interleaved (make_dataset, naive, compute_only, make_dataset, ...), each timing one fit of EPOCHS
epochs. Figures (bench/_common.py): per round, make_dataset's steps/s over compute_only's and over
naive's in that same round; median and spread over the rounds. Also the median steps/s of each.
Prints one JSON line and writes bench/results/data.json.

    .venv/bin/python bench/bench_data.py [--samples 20000] [--features 32] [--batch 256] [--epochs 3] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist  # noqa: E402
from _common import figure, write_result  # noqa: E402  (bench/ is the script's directory)


def build_model(features: int) -> keras.Model:
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.samples, args.features), dtype=np.float32)
    y = x.sum(axis=1, keepdims=True)
    steps = -(-args.samples // args.batch)

    start = time.perf_counter()
    ours = kerasdist.make_dataset(x, y, batch_size=args.batch, seed=0, repeat=True)
    build_s = time.perf_counter() - start
    assert kerasdist.dataset_info(ours).steps_per_epoch == steps
    naive = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)
    one = tf.data.Dataset.from_tensors((x[: args.batch], y[: args.batch])).cache().repeat()

    variants = {
        "make_dataset": (ours, {"steps_per_epoch": steps}),
        "naive": (naive, {}),
        "compute_only": (one, {"steps_per_epoch": steps}),
    }
    models = {}
    for name, (data, kwargs) in variants.items():
        keras.utils.set_random_seed(0)
        models[name] = build_model(args.features)
        models[name].fit(data, epochs=1, verbose=0, shuffle=False, **kwargs)  # trace, warm up

    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.reps):
        for name, (data, kwargs) in variants.items():
            t0 = time.perf_counter()
            models[name].fit(data, epochs=args.epochs, verbose=0, shuffle=False, **kwargs)
            rates[name].append(steps * args.epochs / (time.perf_counter() - t0))

    median = {name: statistics.median(r) for name, r in rates.items()}
    ours_rates = rates["make_dataset"]
    figures = [
        figure("make_dataset_vs_compute_only",
               [m / c for m, c in zip(ours_rates, rates["compute_only"], strict=True)], ">= 0.95",
               "steps/s fed by make_dataset / steps/s of the same fit on one in-memory batch repeated "
               "(no input work): the input pipeline within 5% of the compute-only limit"),
        figure("make_dataset_vs_naive",
               [m / n for m, n in zip(ours_rates, rates["naive"], strict=True)], None,
               "steps/s fed by make_dataset (shuffled per epoch) / steps/s fed by "
               "from_tensor_slices().batch() (no shuffle): context only, the naive feed does less "
               "work and is no limit; the target is the compute-only ceiling"),
    ]
    write_result(
        "data", figures,
        samples=args.samples, features=args.features, batch_size=args.batch,
        steps_per_fit=steps * args.epochs, reps=args.reps,
        steps_per_s_median={k: round(v, 1) for k, v in median.items()},
        steps_per_s_all={k: [round(v, 1) for v in r] for k, r in rates.items()},
        make_dataset_build_s=round(build_s, 3),
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, TF {tf.__version__}, Keras {keras.__version__}",
    )


if __name__ == "__main__":
    main()
