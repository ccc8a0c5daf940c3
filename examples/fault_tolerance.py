"""Fault tolerance: the Python twin of vignette("fault-tolerance").

Starts a training job in a child process, kills it with SIGKILL in the middle of its second
epoch, resumes it here from the newest checkpoint, then truncates the newest checkpoint's
model.keras to show that restore skips it with a warning and falls back to the previous one.

    python examples/fault_tolerance.py [--run-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasdist  # noqa: E402


def build_model():
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


def train_job(checkpoint_dir: str, slow: bool = False):
    """The whole job: 3 epochs in total, checkpoints every epoch and every 5 steps.

    `slow` pauses after each batch, only so that the kill lands in the middle of the run.
    """
    import keras

    x, y = kerasdist.load_digits(flatten=True)
    callbacks = []
    if slow:
        callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: time.sleep(0.1)))
    return kerasdist.distributed_fit(
        build_model, x[:1500], y[:1500], epochs=3, checkpoint_dir=checkpoint_dir, batch_size=64,
        seed=1, every_steps=5, keep=3, callbacks=callbacks, verbose=0,
    )


def saved_steps(checkpoint_dir: str) -> list[int]:
    if not os.path.isdir(checkpoint_dir):
        return []
    return sorted(int(name[5:]) for name in os.listdir(checkpoint_dir)
                  if name.startswith("ckpt-") and name[5:].isdigit())


def main(run_dir: str) -> None:
    checkpoints = os.path.join(run_dir, "checkpoints")

    # 1. Start the job in a child process; SIGKILL it once a checkpoint past step 30 exists.
    job = subprocess.Popen([sys.executable, __file__, "--train", checkpoints, "--slow"])
    deadline = time.monotonic() + 120
    while job.poll() is None and max(saved_steps(checkpoints), default=0) < 30 \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    if job.poll() is not None:
        raise SystemExit(f"the job ended (status {job.returncode}) before it could be killed")
    os.kill(job.pid, signal.SIGKILL)
    print(f"killed the job: status {job.wait()}; checkpoints left: {saved_steps(checkpoints)}")

    # 2. Where training resumes (epoch is 0-based).
    latest = kerasdist.latest_checkpoint(checkpoints)
    print(f"resuming from epoch {latest.epoch}, step {latest.step_in_epoch} "
          f"(global step {latest.global_step})")

    # 3. Resume: the same call, here in this process.
    history = train_job(checkpoints)
    model = history.model
    print(f"resumed run done: {len(history.epoch)} epochs, "
          f"{int(model.optimizer.iterations.numpy())} optimizer steps, "
          f"accuracy {[round(a, 3) for a in history.history['accuracy']]}")

    # 4. Damage the newest checkpoint: cut its model.keras in half.
    newest = kerasdist.latest_checkpoint(checkpoints).path
    model_file = os.path.join(newest, "model.keras")
    with open(model_file, "r+b") as f:
        f.truncate(os.path.getsize(model_file) // 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", kerasdist.CheckpointWarning)
        fallback = kerasdist.latest_checkpoint(checkpoints)
        with kerasdist.select_strategy().scope():
            restored = kerasdist.make_or_restore_model(checkpoints)
    for warning in caught:
        if issubclass(warning.category, kerasdist.CheckpointWarning):
            print(f"warning: {warning.message}")
    print(f"fallback: {os.path.basename(newest)} is damaged, restored "
          f"{os.path.basename(fallback.path)} at step {int(restored.optimizer.iterations.numpy())}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", help="directory for checkpoints (default: a temporary one)")
    parser.add_argument("--train", metavar="CHECKPOINT_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--slow", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train:
        train_job(args.train, slow=args.slow)
    elif args.run_dir:
        main(args.run_dir)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
