"""A seeded run with the callbacks users bring (EarlyStopping with its best weights,
ReduceLROnPlateau, ModelCheckpoint's best file, TensorBoard, CSVLogger, LearningRateScheduler,
TerminateOnNaN and a callback of the user's own with get_state/set_state), killed or preempted
and run again by the callback-state tests (tests/cases/callbacks.json).

usage: train_callbacks.py TRAINER RUN_DIR [--kill-at-step G] [--kill-after-epoch E] [--term-at-step G]
                          [--checkpoint-dir URL]

TRAINER: distributed_fit, model.fit (make_or_restore_model, then Keras's own fit with
checkpoint_callback last; it resumes at epoch boundaries only, so it saves at epoch ends) or
custom_fit. RUN_DIR holds ckpt/, logs/ (TensorBoard), history.csv and best.keras; a run that ends
writes result.json (steps, learning rate, the user callback's state, the newest checkpoint's
step) and weights.npz. --checkpoint-dir: checkpoints there instead (an object-store URL, reached
through the AWS_* environment variables).
--kill-at-step G: SIGKILL at the end of step G; --kill-after-epoch E: SIGKILL once the checkpoint of
epoch E's end is committed; --term-at-step G: SIGTERM at the start of step G (a preemption).
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist  # noqa: E402

SEED, SAMPLES, FEATURES, BATCH, EPOCHS = 7, 320, 6, 16, 8  # 20 steps an epoch


class UserCounter(keras.callbacks.Callback):
    """A callback of the user's own, with state: it opts in with get_state and set_state."""

    def __init__(self):
        super().__init__()
        self.batches = 0
        self.loss_sum = 0.0
        self.epoch_losses = np.zeros(EPOCHS, np.float32)

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        self.loss_sum += float(logs["loss"])

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_losses[epoch] = logs["loss"]

    def get_state(self):
        return {"batches": self.batches, "loss_sum": self.loss_sum, "epoch_losses": self.epoch_losses}

    def set_state(self, state):
        self.batches, self.loss_sum = state["batches"], state["loss_sum"]
        self.epoch_losses = np.array(state["epoch_losses"])


class Fault(keras.callbacks.Callback):
    """The failure the test asks for, at a chosen step."""

    def __init__(self, args, checkpoint_dir):
        super().__init__()
        self.args, self.checkpoint_dir = args, checkpoint_dir

    def _step(self):
        return int(self.model.optimizer.iterations.numpy())

    def on_train_batch_begin(self, batch, logs=None):
        if self.args.term_at_step is not None and self._step() + 1 == self.args.term_at_step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_batch_end(self, batch, logs=None):
        if self.args.kill_at_step is not None and self._step() == self.args.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_begin(self, epoch, logs=None):
        if self.args.kill_after_epoch is not None and epoch == self.args.kill_after_epoch + 1:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the epoch-end checkpoint, committed (in the background)
                latest = kerasdist.latest_checkpoint(self.checkpoint_dir)
                if latest is not None and latest.global_step == self._step():
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(0.02)


def build_model():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    return model


def user_callbacks(run_dir: Path):
    return [
        keras.callbacks.EarlyStopping(monitor="loss", patience=3, min_delta=10.0, restore_best_weights=True),
        keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=1, factor=0.5, min_delta=10.0),
        keras.callbacks.ModelCheckpoint(str(run_dir / "best.keras"), save_best_only=True, monitor="loss", mode="max"),
        keras.callbacks.TensorBoard(str(run_dir / "logs"), update_freq=5),
        keras.callbacks.CSVLogger(str(run_dir / "history.csv")),
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr),
        keras.callbacks.TerminateOnNaN(),
        UserCounter(),
    ]


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1)) + 0.1 * rng.normal(size=(SAMPLES, 1))).astype("float32")
    return x, y


def train(trainer, run_dir, callbacks, ckpt):
    x, y = data()
    if trainer == "distributed_fit":
        history = kerasdist.distributed_fit(build_model, x, y, epochs=EPOCHS, checkpoint_dir=ckpt, strategy="default",
                                            batch_size=BATCH, seed=SEED, every_steps=5, callbacks=callbacks,
                                            verbose=0)
        return history.model
    if trainer == "custom_fit":
        dataset = kerasdist.make_dataset(x, y, batch_size=BATCH, seed=SEED, epochs=None)
        history = kerasdist.custom_fit(build_model, dataset, epochs=EPOCHS, checkpoint_dir=ckpt, every_steps=5,
                                       callbacks=callbacks, verbose=0)
        return history.model
    model = kerasdist.make_or_restore_model(ckpt, build_model)
    latest = kerasdist.latest_checkpoint(ckpt)
    start = latest.epoch if latest is not None else 0
    stream = kerasdist.make_dataset(x, y, batch_size=BATCH, seed=SEED, initial_epoch=start, epochs=EPOCHS)
    model.fit(stream, epochs=EPOCHS, initial_epoch=start, steps_per_epoch=SAMPLES // BATCH, verbose=0,
              callbacks=[*callbacks, kerasdist.checkpoint_callback(ckpt)])
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trainer", choices=["distributed_fit", "model.fit", "custom_fit"])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--kill-at-step", type=int)
    parser.add_argument("--kill-after-epoch", type=int)
    parser.add_argument("--term-at-step", type=int)
    parser.add_argument("--checkpoint-dir")
    args = parser.parse_args()
    ckpt = args.checkpoint_dir or str(args.run_dir / "ckpt")
    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    callbacks = user_callbacks(args.run_dir)
    model = train(args.trainer, args.run_dir, [*callbacks, Fault(args, ckpt)], ckpt)
    counter = callbacks[-1]
    result = {"steps": int(model.optimizer.iterations.numpy()),
              "learning_rate": float(model.optimizer.learning_rate.numpy()),
              "stopped_epoch": callbacks[0].stopped_epoch,
              "counter": {"batches": counter.batches, "loss_sum": counter.loss_sum,
                          "epoch_losses": counter.epoch_losses.tolist()},
              "newest_checkpoint": kerasdist.latest_checkpoint(ckpt).global_step}
    np.savez(args.run_dir / "weights.npz", *model.get_weights())
    (args.run_dir / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
