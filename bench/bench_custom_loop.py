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

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasdist  # noqa: E402

kerasdist.simulate_devices(2)  # before TensorFlow initialises its devices

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import _training as bench  # noqa: E402
from _common import write_result  # noqa: E402


def build_model() -> keras.Model:
    return bench.tutorial_cnn(with_loss=False)


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


def with_custom_fit(strategy, data):
    def run(epochs: int, checkpoint_dir: str) -> list[float]:
        return bench.epoch_ends(lambda callbacks: kerasdist.custom_fit(
            build_model, data, step, epochs=epochs, checkpoint_dir=checkpoint_dir, strategy=strategy,
            callbacks=callbacks, verbose=0))
    return run


def hand_written(strategy, data):
    def run(epochs: int, checkpoint_dir: str) -> list[float]:
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
    return run


def main() -> None:
    args, x, y, steps = bench.arguments_and_data(bench.parser(epochs=3, samples=16384))
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(args.samples, seed=0).batch(bench.BATCH)
    strategy = kerasdist.select_strategy("mirrored")
    variants = {"custom_fit": with_custom_fit(strategy, data), "hand_written": hand_written(strategy, data)}
    whole, steady = bench.interleaved(variants, args.repeats, args.epochs, steps)

    figures = bench.whole_and_steady_figures("custom_fit", whole, steady, "custom_fit", "hand_written", ">= 0.98",
                                             "custom_fit over the hand-written tutorial loop")
    write_result(
        "custom_loop", figures,
        strategy=f"MirroredStrategy over {strategy.num_replicas_in_sync} simulated CPU devices",
        **bench.run_details(build_model(), args, steps, "custom_fit, hand_written"),
        custom_fit=("kerasdist.custom_fit(build_model, data, step, epochs=E, checkpoint_dir=<fresh dir>, "
                    "strategy=<mirrored>): crash-safe checkpoint every epoch end (keep=3), Keras callbacks"),
        hand_written=("the tutorial loop: experimental_distribute_dataset, tf.function(strategy.run(step) + "
                      "strategy.reduce('SUM')), Python loop over batches, tf.train.Checkpoint.save each epoch"),
    )


if __name__ == "__main__":
    main()
