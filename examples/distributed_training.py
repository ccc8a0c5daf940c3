"""Distributed training step by step: the Python twin of vignette("distributed-training").

Splits the CPU into 2 devices, lets kerasdist pick MirroredStrategy, builds a small model inside
its scope (or restores it from the newest checkpoint), trains on the bundled digits with
checkpoints, evaluates, then does the same in one call with distributed_fit().

    python examples/distributed_training.py [--run-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasdist  # noqa: E402


def build_model():
    """A compiled Keras model; built-in loss and metric names, as replica threads need."""
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input(shape=(64,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def main(run_dir: str) -> None:
    # 1. Two replicas on one CPU: before TensorFlow sets up its devices.
    kerasdist.simulate_devices(2)

    # 2. Choose the strategy, and say why.
    strategy = kerasdist.select_strategy()
    print(kerasdist.describe_strategy(strategy))

    # 3. Build (or restore) the model inside the strategy's scope.
    checkpoints = os.path.join(run_dir, "checkpoints")
    with strategy.scope():
        model = kerasdist.make_or_restore_model(checkpoints, build_model)

    # 4. Data: the bundled UCI digits; the last 297 are the test set.
    x, y = kerasdist.load_digits(flatten=True)
    x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]

    def epoch_data(epoch: int):
        return kerasdist.make_dataset(x_train, y_train, batch_size=64, strategy=strategy, seed=1,
                                      initial_epoch=epoch, epochs=epoch + 1)

    print(kerasdist.dataset_info(epoch_data(0)))

    # 5. Train to 3 epochs in total, checkpointing every epoch and every 10 steps.
    checkpoint = kerasdist.checkpoint_callback(checkpoints, every_steps=10, keep=3)
    history = kerasdist.resume_fit(model, epoch_data, epochs=3, checkpoint=checkpoint, verbose=0)
    print("accuracy per epoch:", [round(a, 3) for a in history.history["accuracy"]])
    latest = kerasdist.latest_checkpoint(checkpoints)
    print(f"latest checkpoint: epoch {latest.epoch}, step {latest.step_in_epoch}, "
          f"global step {latest.global_step}")

    # 6. Evaluate on the held-out digits.
    test_data = kerasdist.make_dataset(x_test, y_test, batch_size=64, shuffle=False, epochs=1)
    scores = model.evaluate(test_data, verbose=0, return_dict=True)
    print(f"step by step: test accuracy {scores['accuracy']:.3f}")

    # 7. All of it in one call; run it again after a crash and it continues.
    history = kerasdist.distributed_fit(
        build_model, x_train, y_train, epochs=3, checkpoint_dir=os.path.join(run_dir, "one-call"),
        batch_size=64, validation_split=0.1, every_steps=10, verbose=0,
    )
    print("val_accuracy per epoch:", [round(a, 3) for a in history.history["val_accuracy"]])
    scores = history.model.evaluate(test_data, verbose=0, return_dict=True)
    print(f"distributed_fit: test accuracy {scores['accuracy']:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="directory for checkpoints (default: a temporary one)")
    args = parser.parse_args()
    if args.run_dir:
        main(args.run_dir)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
