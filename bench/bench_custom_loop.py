"""What custom_fit costs over TensorFlow's custom training loop tutorial, written by hand.

Both variants train the same small CNN (8x8x1 -> Conv 32 -> Conv 32 -> Dense 64 -> 10, Adam) on
the same pipeline (`from_tensor_slices((x, y)).shuffle(n, seed=0).batch(128)`, 16384 synthetic
samples, 3 epochs), from scratch, under one MirroredStrategy over 2 simulated CPU devices, with
the same per-replica step (tape, loss over the global batch, `optimizer.apply`), saving a
checkpoint at every epoch end:

- custom_fit: `kerasdist.custom_fit(build_model, data, step, epochs=E, checkpoint_dir=<fresh>,
  strategy=<mirrored>)`: the step through `strategy.run` in one `tf.function`, the loss summed
  over replicas and averaged over the epoch, Keras callbacks, crash-safe checkpoints (keep=3).
- hand-written: the tutorial's loop: `with strategy.scope(): model = build_model()`,
  `strategy.experimental_distribute_dataset(data)`, a `tf.function` running
  `strategy.run(step)` and `strategy.reduce("SUM")`, a Python loop over the batches that adds
  up the loss, and `tf.train.Checkpoint(model=..., optimizer=...).save()` at each epoch end.

One untimed warm-up call of each first, then the variants interleaved, each repetition with a
fresh model, the garbage collector run before each timed call and off during it. Figures:
steps/s of the whole call (total steps / wall time), custom_fit over hand-written (target >=
0.98, issue #13), and the same over the epochs after the first (steady state, from epoch end
times). Prints one JSON line and writes bench/results/custom_loop.json.

usage: .venv/bin/python bench/bench_custom_loop.py [--repeats 3] [--epochs 3] [--samples 16384]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time

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
    model.compile(optimizer="adam")
    return model


def step(model, optimizer, batch):
    """The per-replica step both variants run (kerasdist.scaled_loss is the tutorial's
    tf.nn.compute_average_loss with the global batch counted across replicas)."""
    x, y = batch
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        per_example = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        loss = kerasdist.scaled_loss(per_example, model=model)
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return {"loss": loss}


class EpochTimes(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.ends: list[float] = []

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.ends.append(time.perf_counter())


def run_custom_fit(strategy, data, epochs, checkpoint_dir) -> list[float]:
    timer = EpochTimes()
    kerasdist.custom_fit(build_model, data, step, epochs=epochs, checkpoint_dir=checkpoint_dir,
                         strategy=strategy, callbacks=[timer], verbose=0)
    return timer.ends


def run_hand_written(strategy, data, epochs, checkpoint_dir) -> list[float]:
    with strategy.scope():
        model = build_model()
        optimizer = model.optimizer
        optimizer.build(model.trainable_variables)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    distributed = strategy.experimental_distribute_dataset(data)

    @tf.function
    def train_step(batch):
        losses = strategy.run(lambda replica_batch: step(model, optimizer, replica_batch), args=(batch,))
        return strategy.reduce("SUM", losses["loss"], axis=None)

    ends = []
    for _ in range(epochs):
        total, batches = 0.0, 0
        for batch in distributed:
            total += train_step(batch)
            batches += 1
        float(total / batches)  # the epoch's mean loss, as the tutorial prints it
        checkpoint.save(os.path.join(checkpoint_dir, "ckpt"))
        ends.append(time.perf_counter())
    return ends


VARIANTS = {"custom_fit": run_custom_fit, "hand_written": run_hand_written}


def timed(run, strategy, data, epochs, tmp) -> tuple[float, float]:
    """(wall seconds of the call, seconds from the first epoch end to the last)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        ends = run(strategy, data, epochs, tempfile.mkdtemp(dir=tmp))
        wall = time.perf_counter() - start
    finally:
        gc.enable()
    return wall, ends[-1] - ends[0]


def ratios(rates: dict[str, list[float]]) -> list[float]:
    return [c / h for c, h in zip(rates["custom_fit"], rates["hand_written"], strict=True)]


def medians(rates: dict[str, list[float]]) -> dict[str, float]:
    return {name: round(statistics.median(r), 1) for name, r in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=16384)
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the steady-state figure needs epochs after the first)")

    rng = np.random.default_rng(0)
    x = rng.random((args.samples, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=args.samples).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(args.samples, seed=0).batch(BATCH)
    strategy = kerasdist.select_strategy("mirrored")
    steps = -(-args.samples // BATCH)

    whole = {name: [] for name in VARIANTS}
    steady = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for run in VARIANTS.values():
            run(strategy, data, 2, tempfile.mkdtemp(dir=tmp))  # warm-up, untimed
        for _ in range(args.repeats):
            for name, run in VARIANTS.items():
                wall, after_first = timed(run, strategy, data, args.epochs, tmp)
                whole[name].append(steps * args.epochs / wall)
                steady[name].append(steps * (args.epochs - 1) / after_first)

    figures = [
        figure("custom_fit_steps_per_s_ratio", ratios(whole), ">= 0.98",
               "steps/s of the whole call (total steps / wall time), custom_fit over the hand-written "
               "tutorial loop", steps_per_s=medians(whole)),
        figure("custom_fit_steady_steps_per_s_ratio", ratios(steady), None,
               "steps/s over the epochs after the first (epoch end times), custom_fit over hand-written",
               steps_per_s=medians(steady)),
    ]
    write_result(
        "custom_loop", figures,
        strategy=f"MirroredStrategy over {strategy.num_replicas_in_sync} simulated CPU devices",
        model=f"Conv2D 32 x2 + Dense 64 + Dense 10 on 8x8x1, Adam, {build_model().count_params()} parameters",
        samples=args.samples, batch_size=BATCH, epochs=args.epochs, steps_per_call=steps * args.epochs,
        repeats=args.repeats, order="warm-up of each once, then custom_fit, hand_written, ... interleaved",
        custom_fit=("kerasdist.custom_fit(build_model, data, step, epochs=E, checkpoint_dir=<fresh dir>, "
                    "strategy=<mirrored>): crash-safe checkpoint every epoch end (keep=3), Keras callbacks"),
        hand_written=("the tutorial loop: experimental_distribute_dataset, tf.function(strategy.run(step) + "
                      "strategy.reduce('SUM')), Python loop over batches, tf.train.Checkpoint.save each epoch"),
        versions=f"TF {tf.__version__}, Keras {keras.__version__}",
    )


if __name__ == "__main__":
    main()
