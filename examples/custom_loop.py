"""TensorFlow's custom training loop tutorial, ported to kerasdist: the Python twin of the
"Your own training step" section of vignette("distributed-training").

The tutorial ("Custom training with tf.distribute.Strategy") writes the loop by hand: a
`train_step` with `tf.GradientTape`, `strategy.run` and `strategy.reduce` in a `tf.function`,
the loss divided by the global batch (`tf.nn.compute_average_loss`) and the regularization by
the replicas, a `tf.train.Checkpoint`. Here the step is the only hand-written part:
`kerasdist.scaled_loss` divides correctly (also on a partial last batch), `custom_fit` runs the
step on every replica, logs like Keras, checkpoints and resumes at the next unseen batch, and
`distributed_evaluate` scores the model restored from the newest checkpoint on the test set.

A small CNN on the bundled digits, mirrored on 2 CPU devices:

    python examples/custom_loop.py [--run-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasdist  # noqa: E402


def build_model():
    """The tutorial's CNN, sized for 8x8 digits; compiled so that checkpoints hold the optimizer
    and `distributed_evaluate` knows the loss and metric."""
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input(shape=(8, 8, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-4)),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.005),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def train_step(model, optimizer, batch):
    """One replica's step, as in the tutorial: it runs on every replica through strategy.run."""
    import keras
    import tensorflow as tf

    images, labels = batch
    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        per_example = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        # this replica's share of the global mean, plus its share of the L2 term
        loss = kerasdist.scaled_loss(per_example, model=model)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(gradients, model.trainable_variables)
    correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=labels.dtype), labels), tf.float32)
    # per-replica shares of the global means: custom_fit sums them over the replicas
    return {"loss": loss, "accuracy": kerasdist.scaled_loss(correct)}


def main(run_dir: str) -> None:
    kerasdist.simulate_devices(2)  # before TensorFlow sets up its devices
    strategy = kerasdist.select_strategy()
    print(kerasdist.describe_strategy(strategy))

    x, y = kerasdist.load_digits()  # (1797, 8, 8, 1) images; the last 297 are the test set
    x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]
    data = kerasdist.make_dataset(x_train, y_train, batch_size=64, strategy=strategy, seed=1)

    # Train 3 epochs, checkpointing every epoch and every 10 steps. The same call after a
    # crash restores the newest checkpoint and continues at the next unseen batch.
    checkpoints = os.path.join(run_dir, "checkpoints")
    history = kerasdist.custom_fit(build_model, data, train_step, epochs=3, checkpoint_dir=checkpoints,
                                   strategy=strategy, every_steps=10, verbose=0)
    print("train accuracy per epoch:", [round(a, 3) for a in history.history["accuracy"]])

    # Asking for 4 epochs in total trains one more; the history holds all 4.
    history = kerasdist.custom_fit(build_model, data, train_step, epochs=4, checkpoint_dir=checkpoints,
                                   strategy=strategy, every_steps=10, verbose=0)
    print(f"epochs in the history: {len(history.epoch)}")
    latest = kerasdist.latest_checkpoint(checkpoints)
    print(f"latest checkpoint: {os.path.basename(latest.path)}, epoch {latest.epoch}, "
          f"global step {latest.global_step}")

    # The tutorial's last part: restore the checkpoint into a new model, evaluate on the test set.
    with strategy.scope():
        restored = kerasdist.make_or_restore_model(checkpoints)
    scores = kerasdist.distributed_evaluate(restored, x_test, y_test, batch_size=64)
    print(f"restored from {os.path.basename(latest.path)}: test loss {scores['loss']:.3f}")
    print(f"custom_fit: test accuracy {scores['accuracy']:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="directory for checkpoints (default: a temporary one)")
    args = parser.parse_args()
    if args.run_dir:
        main(args.run_dir)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
