"""One worker of a multi-worker run (TF_CONFIG set by the caller or the launcher).

usage: train_multi_worker.py OUT_PREFIX [--checkpoint-dir DIR] [--every-steps N] [--no-fixes]
                             [--epochs E] [--die-at-step S] [--per-worker-dir] [--load-only]
                             [--monitor DIR] [--link-down-at-step S --link DEV] [--user-callbacks]
                             [--stall TASK:STEP:SECONDS ...]
Writes OUT_PREFIX-<task index>.npz with the final weights. With --no-fixes the Keras multi-worker
patches are removed first, to show whether upstream fit works on its own. With --die-at-step,
worker 1 kills itself with SIGKILL after that step on the launcher's first attempt; with
--link-down-at-step, worker 1 sets its host's network link DEV down after that step instead (run
in a network namespace of its own: its peer sees no reset, only silence) and prints "link down"
(tools/lost_peer.py). With --per-worker-dir each worker uses DIR/worker-<index>, as hosts that
share no disk would; with --load-only the model is loaded from the checkpoint (no build_fn). With
--monitor, a CSVLogger (DIR/log.csv) and a TensorBoard (DIR/tb) train along, the worker writes
DIR/notes.txt through chief_path and prints run_context() as seen outside the strategy's scope.
With --user-callbacks, EarlyStopping (restore_best_weights; it stops after epoch 3),
ReduceLROnPlateau and a counter with get_state/set_state train along on every worker, and each
worker prints what they did ({"callbacks": ...}).
With --stall worker:0:5:6, worker 0 spends 6 s in Python (a busy loop holding the GIL, as a slow
step or save would) after step 5, while the others wait in the next all-reduce (any attempt).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist  # noqa: E402
from kerasdist import compat  # noqa: E402

GLOBAL_BATCH = 16


def build_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


class AtStep(keras.callbacks.Callback):
    """Runs `action(step_ended)` once, at the start of the first batch after optimizer step `step`
    (the checkpoint callback, after this one, has taken that step by then); `step_ended` is the
    `time.monotonic()` at which that step ended."""

    def __init__(self, step, action):
        super().__init__()
        self.step, self.action, self.done, self.step_ended = step, action, False, None

    def on_train_batch_end(self, batch, logs=None):
        if self.step_ended is None and int(self.model.optimizer.iterations.numpy()) >= self.step:
            self.step_ended = time.monotonic()

    def on_train_batch_begin(self, batch, logs=None):  # the step before done, its checkpoint taken
        if not self.done and int(self.model.optimizer.iterations.numpy()) >= self.step:
            self.done = True
            self.action(self.step_ended if self.step_ended is not None else time.monotonic())


class Counter(keras.callbacks.Callback):
    """A user's callback with state (get_state/set_state). It counts batches and epochs, not the
    losses: under multi-worker, the epoch a run resumes in logs the running means of its own
    batches only (the workers' metric variables are not in the chief's checkpoint)."""

    def __init__(self):
        super().__init__()
        self.batches, self.epochs = 0, []

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(epoch)

    def get_state(self):
        return {"batches": self.batches, "epochs": self.epochs}

    def set_state(self, state):
        self.batches, self.epochs = state["batches"], list(state["epochs"])


def user_callbacks():
    return [keras.callbacks.EarlyStopping(monitor="loss", patience=2, min_delta=10.0, restore_best_weights=True),
            keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=1, factor=0.5, min_delta=10.0),
            Counter()]


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def die_once_saved(chief_dir, step, step_ended, note):
    """SIGKILL this worker once the chief's checkpoint of `step` is committed: the chief writes it
    in the background, and a peer lost while that write is in flight may lose it (one step redone,
    RELIABILITY.md), which would move the resume point the test expects. Same machine, so the chief's
    folder is readable here even when the workers share no disk. Writes to `note` the seconds from
    the step's end to the kill (the chief counts its wait for the lost peer from that step's end)."""
    import warnings

    deadline = time.monotonic() + (60 if chief_dir else 0)
    while time.monotonic() < deadline:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            latest = kerasdist.latest_checkpoint(chief_dir)
        if latest is not None and latest.global_step >= step:
            break
        time.sleep(0.05)
    Path(note).write_text(f"{time.monotonic() - step_ended:.4f}")
    die()


def stall(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # Python bytecode, not a sleep: what a slow save or step does
        pass
    print(f"stalled {seconds} s", flush=True)


def link_down(link):
    subprocess.run(["ip", "link", "set", link, "down"], check=True)
    print("link down", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_prefix")
    parser.add_argument("--checkpoint-dir")
    parser.add_argument("--no-fixes", action="store_true")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--every-steps", type=int)
    parser.add_argument("--die-at-step", type=int)
    parser.add_argument("--link-down-at-step", type=int)
    parser.add_argument("--link")
    parser.add_argument("--per-worker-dir", action="store_true")
    parser.add_argument("--load-only", action="store_true")
    parser.add_argument("--monitor")
    parser.add_argument("--user-callbacks", action="store_true")
    parser.add_argument("--stall", action="append", default=[])
    args = parser.parse_args()
    keras.utils.set_random_seed(7)
    strategy = kerasdist.select_strategy()
    if args.no_fixes:
        compat.remove_keras_fixes()
    description = kerasdist.describe_strategy(strategy)
    print(json.dumps({"kind": description.kind, "task": description.task, "chief": description.is_chief,
                      "peer_timeout": compat.coordination_heartbeat_timeout_seconds()}), flush=True)
    index = description.task.split(":")[1] if description.task else "0"
    chief_dir = args.checkpoint_dir
    if args.checkpoint_dir and args.per_worker_dir:
        chief_dir = os.path.join(args.checkpoint_dir, "worker-0")
        args.checkpoint_dir = os.path.join(args.checkpoint_dir, f"worker-{index}")
    if args.checkpoint_dir:
        build = None if args.load_only else build_model
        model = kerasdist.make_or_restore_model(args.checkpoint_dir, build, strategy=strategy)
        print(json.dumps({"restored_step": int(model.optimizer.iterations.numpy())}), flush=True)
        callbacks = []
        first_attempt = os.environ.get("KERASDIST_RESTART", "0") == "0"
        if first_attempt and description.task == "worker:1":
            if args.die_at_step:
                callbacks.append(AtStep(args.die_at_step, lambda ended: die_once_saved(
                    chief_dir, args.die_at_step, ended, f"{args.out_prefix}-killed-after-step-end")))
            if args.link_down_at_step:
                callbacks.append(AtStep(args.link_down_at_step, lambda ended: link_down(args.link)))
        for task, step, seconds in (item.rsplit(":", 2) for item in args.stall):
            if task == description.task:
                callbacks.append(AtStep(int(step), lambda ended, seconds=float(seconds): stall(seconds)))
        if args.monitor:
            callbacks += [keras.callbacks.CSVLogger(os.path.join(args.monitor, "log.csv")),
                          keras.callbacks.TensorBoard(os.path.join(args.monitor, "tb"))]
            notes = kerasdist.chief_path(os.path.join(args.monitor, "notes.txt"))
            os.makedirs(os.path.dirname(notes), exist_ok=True)
            with open(notes, "w") as file:
                file.write(description.task)
            outside = kerasdist.run_context()
            print(json.dumps({"outside_scope": [outside.is_chief, outside.num_workers, outside.task],
                              "notes": notes}), flush=True)
        users = user_callbacks() if args.user_callbacks else []
        checkpoint = kerasdist.checkpoint_callback(args.checkpoint_dir, every_steps=args.every_steps, keep=100)
        history = kerasdist.resume_fit(model, data(), args.epochs, checkpoint, callbacks=[*users, *callbacks],
                                       verbose=0)
        if users:
            print(json.dumps({"callbacks": {
                "steps": int(model.optimizer.iterations.numpy()), "stopped_epoch": users[0].stopped_epoch,
                "learning_rate": float(model.optimizer.learning_rate.numpy()),
                "counter": users[2].get_state()}}), flush=True)
    else:
        with strategy.scope():
            model = build_model()
        history = model.fit(data(), epochs=args.epochs, verbose=0)
    np.savez(f"{args.out_prefix}-{index}.npz", *model.get_weights())
    print(json.dumps({"loss": [float(v) for v in history.history["loss"]]}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
