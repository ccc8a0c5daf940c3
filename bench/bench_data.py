"""Steps/s of a small fit fed by make_dataset, by the naive pipeline, and with no input at all,
each with 1 step per call into the graph and with several (Keras's `steps_per_execution`).

- make_dataset: kerasdist.make_dataset(x, y, batch_size=B, seed=0, repeat=True): one stream of
  epochs, each reshuffled as a pure function of seed and epoch, fit with steps_per_epoch (what
  distributed_fit and resume_fit feed).
- make_dataset_one_epoch: the default one-epoch form (each pass the next epoch), as a user calls
  it: `model.fit(ds, epochs=E)`.
- naive: tf.data.Dataset.from_tensor_slices((x, y)).batch(B): no shuffle at all.
- compute_only: one batch already in memory, repeated (from_tensors(batch).repeat()): the model
  stepping with no input work, the ceiling for any pipeline.
- the same make_dataset and compute_only fits with N steps per call: N is what distributed_fit's
  steps_per_execution="auto" chooses for this model and epoch (`--spe` to force one). These fits
  run SPE_EPOCHS epochs (25 by default): N steps per call run about 5 times faster, and a fit of
  EPOCHS epochs would last only about 0.07 s, too short to time on a shared machine.

Each variant has its own model, compiled and warmed up once (tracing excluded); then REPS rounds,
interleaved, each timing one fit of EPOCHS epochs (SPE_EPOCHS at N steps per call). The variants
of a ratio run next to each other (make_dataset, compute_only, make_dataset_spe, compute_only_spe,
make_dataset_one_epoch, naive) and every other round in the reverse order, so that a ratio pairs
fits a fraction of a second apart and neither side always runs first (this machine's speed
drifts by 2x within seconds).
Figures (bench/_common.py), per round: make_dataset's steps/s over compute_only's (at 1 and at N
steps per call; the one-epoch form at 1), over naive's, and make_dataset at N over at 1 (the gain
of steps_per_execution); median and spread over the rounds. Also the median steps/s of each, and
the same pairing without a model: batches/s a graph loop reads from make_dataset and from the
repeated batch. Prints one JSON line and writes bench/results/data.json.

    .venv/bin/python bench/bench_data.py [--samples 20480] [--features 32] [--batch 256]
                                         [--epochs 3] [--spe-epochs 25] [--reps 15] [--spe auto]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist  # noqa: E402
from _common import figure, write_result  # noqa: E402  (bench/ is the script's directory)
from _training import medians, ratios  # noqa: E402


def build_model(features: int, steps_per_execution: int = 1) -> keras.Model:
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    return model


def auto_steps_per_execution(features: int, steps: int, batch: int) -> int:
    """What distributed_fit(steps_per_execution="auto") gives this model on one replica."""
    from kerasdist.context import run_context
    from kerasdist.training.speed import choose_steps_per_execution

    return choose_steps_per_execution("auto", build_model(features), run_context(), steps, batch)[0]


def graph_reader(dataset: tf.data.Dataset, count: int):
    """A function that reads `count` batches of `dataset` in one graph loop (no model) and
    returns the batches read per second: what the pipeline alone can hand to a step."""
    iterator = iter(dataset)

    @tf.function
    def read():
        total = tf.constant(0.0)
        for _ in tf.range(count):
            x, _ = next(iterator)
            total += x[0, 0]
        return total

    def timed() -> float:
        t0 = time.perf_counter()
        read()
        return count / (time.perf_counter() - t0)

    read()  # trace, warm up
    return timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=20480)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--spe-epochs", type=int, default=25, help="epochs of each fit at N steps per call")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--spe", default="auto", help="steps per call of the *_spe variants, or auto")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.samples, args.features), dtype=np.float32)
    y = x.sum(axis=1, keepdims=True)
    steps = -(-args.samples // args.batch)
    spe = auto_steps_per_execution(args.features, steps, args.batch) if args.spe == "auto" else int(args.spe)

    start = time.perf_counter()
    ours = kerasdist.make_dataset(x, y, batch_size=args.batch, seed=0, repeat=True)  # as distributed_fit feeds it
    build_s = time.perf_counter() - start
    assert kerasdist.dataset_info(ours).steps_per_epoch == steps
    one_epoch = kerasdist.make_dataset(x, y, batch_size=args.batch, seed=0)  # the default: a pass an epoch
    naive = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)
    one = tf.data.Dataset.from_tensors((x[: args.batch], y[: args.batch])).cache().repeat()
    stream = {"steps_per_epoch": steps}

    variants = {  # name: (data, fit arguments, steps per call, epochs), in the order of a round
        "make_dataset": (ours, stream, 1, args.epochs),
        "compute_only": (one, stream, 1, args.epochs),
        "make_dataset_spe": (ours, stream, spe, args.spe_epochs),
        "compute_only_spe": (one, stream, spe, args.spe_epochs),
        "make_dataset_one_epoch": (one_epoch, {}, 1, args.epochs),
        "naive": (naive, {}, 1, args.epochs),
    }
    models = {}
    for name, (data, kwargs, per_call, _) in variants.items():
        keras.utils.set_random_seed(0)
        models[name] = build_model(args.features, per_call)
        models[name].fit(data, epochs=1, verbose=0, shuffle=False, **kwargs)  # trace, warm up

    rates: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.reps):
        for name in list(variants)[:: 1 if round_ % 2 == 0 else -1]:
            data, kwargs, _, epochs = variants[name]
            t0 = time.perf_counter()
            models[name].fit(data, epochs=epochs, verbose=0, shuffle=False, **kwargs)
            rates[name].append(steps * epochs / (time.perf_counter() - t0))
    readers = {"make_dataset_read": graph_reader(ours, steps * args.epochs),
               "compute_only_read": graph_reader(one, steps * args.epochs)}
    for round_ in range(args.reps):
        for name in list(readers)[:: 1 if round_ % 2 == 0 else -1]:
            rates.setdefault(name, []).append(readers[name]())

    figures = [
        figure("make_dataset_vs_compute_only", ratios(rates, "make_dataset", "compute_only"), ">= 0.95",
               "steps/s fed by make_dataset (one stream of epochs, fit with steps_per_epoch: what "
               "distributed_fit and resume_fit feed) / steps/s of the same fit on one in-memory batch "
               "repeated (no input work), 1 step per call: the input pipeline within 5% of the compute-only limit"),
        figure("make_dataset_one_epoch_vs_compute_only", ratios(rates, "make_dataset_one_epoch", "compute_only"),
               None, "the same with make_dataset's default one-epoch form and fit(ds, epochs=E): Keras makes "
               "new iterators each epoch, and each new pass instantiates the epoch's pipeline"),
        figure("make_dataset_vs_compute_only_spe", ratios(rates, "make_dataset_spe", "compute_only_spe"), ">= 0.95",
               f"the same with {spe} steps per call (steps_per_execution) on both sides, where the per-call "
               "hand-off no longer hides the input work"),
        figure("steps_per_execution_gain", ratios(rates, "make_dataset_spe", "make_dataset"), None,
               f"steps/s fed by make_dataset with {spe} steps per call / with 1 (distributed_fit's "
               "steps_per_execution='auto' on one replica), the tiny model (fits of "
               f"{args.spe_epochs} and {args.epochs} epochs)"),
        figure("make_dataset_vs_naive", ratios(rates, "make_dataset", "naive"), None,
               "steps/s fed by make_dataset (shuffled per epoch) / steps/s fed by "
               "from_tensor_slices().batch() (no shuffle): context only, the naive feed does less "
               "work and is no limit; the target is the compute-only ceiling"),
        figure("make_dataset_read_vs_compute_only_read", ratios(rates, "make_dataset_read", "compute_only_read"),
               None, "batches/s a graph loop reads from make_dataset / from the one batch repeated, no model: "
               "the pipeline alone, as a step sees it"),
    ]
    write_result(
        "data", figures,
        samples=args.samples, features=args.features, batch_size=args.batch, steps_per_epoch=steps,
        steps_per_fit=steps * args.epochs, steps_per_fit_spe=steps * args.spe_epochs, reps=args.reps,
        steps_per_execution=spe,
        steps_per_s_median=medians(rates),
        steps_per_s_all={k: [round(v, 1) for v in r] for k, r in rates.items()},
        make_dataset_build_s=round(build_s, 3),
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, TF {tf.__version__}, Keras {keras.__version__}",
    )


if __name__ == "__main__":
    main()
