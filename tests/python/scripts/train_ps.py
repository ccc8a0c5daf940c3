"""Every task of a parameter-server cluster (TF_CONFIG set by the launcher, with num_ps > 0).

usage: train_ps.py OUT_JSON [--checkpoint-dir DIR] [--epochs E] [--steps S] [--validation]
                   [--direct] [--check-errors] [--die-after-epoch E] [--term-at EPOCH BATCH]
Worker and ps tasks serve (kerasdist.run_server) until the launcher stops them. The chief (the
coordinator) trains a small Keras 3 model with resume_fit (ps_fit with --direct) and writes
OUT_JSON: the strategy description, the history, the optimizer step and, with --check-errors,
the messages of calls that must fail on a real parameter-server model. With --die-after-epoch,
the chief kills itself with SIGKILL after that epoch (its checkpoint saved) on the first attempt;
with --term-at, it sends itself SIGTERM (preemption) after that batch is scheduled.
"""

import argparse
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasdist  # noqa: E402
from kerasdist.checkpoint import background  # noqa: E402

kerasdist.run_server()  # worker and ps tasks stop here

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

BATCH = 16


def build_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


def dataset_fn(input_context):
    rng = np.random.default_rng(input_context.input_pipeline_id)
    x = rng.normal(size=(128, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(128, seed=1).batch(BATCH)


class DieAfterEpoch(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):  # the epoch before done, its checkpoint taken
        if epoch >= self.epoch:
            background.wait_for_all()  # its checkpoint written (saves run in the background)
            os.kill(os.getpid(), signal.SIGKILL)


class TermAtBatch(keras.callbacks.Callback):
    """SIGTERM to this process after batch `batch` of epoch `epoch` has been scheduled."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.epoch, self.batch, self.current = epoch, batch, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.current == self.epoch and batch == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)


class StopAfterEpoch(keras.callbacks.Callback):
    """Stops training at the end of epoch `epoch` (1-based), as EarlyStopping would."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 >= self.epoch:
            self.model.stop_training = True


class CountBatches(keras.callbacks.Callback):
    """A callback with state (get_state/set_state): the batches it saw, earlier runs included."""

    def __init__(self):
        super().__init__()
        self.batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def get_state(self):
        return {"batches": self.batches}

    def set_state(self, state):
        self.batches = state["batches"]


def error_of(call):
    try:
        call()
    except ValueError as err:
        return str(err)
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_json")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--validation", action="store_true")
    parser.add_argument("--direct", action="store_true")
    parser.add_argument("--check-errors", action="store_true")
    parser.add_argument("--die-after-epoch", type=int)
    parser.add_argument("--term-at", type=int, nargs=2, metavar=("EPOCH", "BATCH"))
    parser.add_argument("--stop-after-epoch", type=int)
    args = parser.parse_args()
    keras.utils.set_random_seed(7)
    strategy = kerasdist.select_strategy()
    description = kerasdist.describe_strategy(strategy)
    validation = dict(validation_data=dataset_fn, validation_steps=4) if args.validation else {}
    errors = {}
    if args.direct:
        with strategy.scope():
            model = build_model()
        if args.check_errors:
            errors["no_steps"] = error_of(lambda: kerasdist.ps_fit(model, dataset_fn, 1))
            errors["no_validation_steps"] = error_of(
                lambda: kerasdist.ps_fit(model, dataset_fn, 1, steps_per_epoch=2, validation_data=dataset_fn))
            errors["every_steps"] = error_of(lambda: kerasdist.resume_fit(
                model, dataset_fn, 1, kerasdist.checkpoint_callback(args.out_json + ".ckpt", every_steps=5),
                steps_per_epoch=2))
        history = kerasdist.ps_fit(model, dataset_fn, args.epochs, steps_per_epoch=args.steps, verbose=0, **validation)
    else:
        model = kerasdist.make_or_restore_model(args.checkpoint_dir, build_model, strategy=strategy)
        print(json.dumps({"restored_step": int(model.optimizer.iterations.numpy())}), flush=True)
        counter = CountBatches()
        callbacks = [counter]
        if args.die_after_epoch and os.environ.get("KERASDIST_RESTART", "0") == "0":
            callbacks.append(DieAfterEpoch(args.die_after_epoch))
        if args.term_at and os.environ.get("KERASDIST_RESTART", "0") == "0":
            callbacks.append(TermAtBatch(*args.term_at))
        if args.stop_after_epoch:
            callbacks.append(StopAfterEpoch(args.stop_after_epoch))
        history = kerasdist.resume_fit(model, dataset_fn, args.epochs, args.checkpoint_dir, callbacks=callbacks,
                                       steps_per_epoch=args.steps, verbose=2, **validation)
    with open(args.out_json, "w") as out:
        json.dump({
            "kind": description.kind, "task": description.task, "chief": description.is_chief,
            "epoch": history.epoch, "history": history.history,
            "step": int(model.optimizer.iterations.numpy()), "errors": errors,
            "counted_batches": None if args.direct else counter.batches,
        }, out)


if __name__ == "__main__":
    sys.exit(main())
