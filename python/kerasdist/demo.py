"""The main job, `kerasdist demo`: a real distributed run that is killed and resumes.

1. Split the CPU into 2 devices and let `select_strategy("auto")` pick MirroredStrategy.
2. Train a small CNN on the bundled UCI digits with `distributed_fit` in a child process, with
   checkpoints at every epoch end and every few steps; the child SIGKILLs itself mid-epoch.
3. Run the same `distributed_fit` call again here: it restores the newest checkpoint and
   continues at the next unseen batch, then reports the test accuracy and writes
   `curves.png` (loss and accuracy per epoch, the kill and the resume point marked).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kerasdist.validation import integer

TEST_SAMPLES = 297  # the last 297 of the 1,797 digits; the first 1,500 train
BATCH_SIZE = 64
EVERY_STEPS = 5
SEED = 1
VALIDATION_SPLIT = 0.1
TRAIN_SAMPLES = math.ceil((1797 - TEST_SAMPLES) * (1 - VALIDATION_SPLIT))  # as make_dataset splits
LOST_STEPS = 3  # the kill comes this many steps after the last mid-epoch checkpoint


def kerasdist_demo(
    run_dir: str | os.PathLike[str] = "runs/demo", epochs: int = 6, *, verbose: bool = True
) -> dict[str, Any]:
    """Run the demo: train, get killed mid-epoch, resume, evaluate, plot.

    Splits the CPU into 2 devices (`simulate_devices`), lets `select_strategy` pick
    MirroredStrategy and trains a small CNN on the bundled digits (`load_digits`) with
    `distributed_fit`, checkpointing at every epoch end and every few steps. The first run is a
    child process that SIGKILLs itself in the middle of an epoch, a few steps after a checkpoint;
    this process then makes the same `distributed_fit` call, which restores the newest checkpoint
    and continues at the next batch. It prints progress all along, then the test accuracy on the
    held-out digits, and writes `curves.png` (loss and accuracy per epoch, the kill and the resume
    point marked), `log.csv` and `result.json` in `run_dir`.

    Args:
        run_dir: directory for `checkpoints/`, `log.csv`, `curves.png` and `result.json`;
            its checkpoints are cleared first, so every demo starts from scratch.
        epochs: total epochs (at least 1); the kill happens in the middle of epoch
            `epochs // 2` (0-based).
        verbose: print the progress (default True).

    Returns:
        A dict, also written to `result.json`: `strategy`, `replicas`, `killed_at` and
        `resumed_from` (each an epoch, 0-based, and a step in it), `epochs`, `optimizer_steps`,
        `test_loss`, `test_accuracy`, `png` (the path of `curves.png`) and `wall_seconds`.
    """
    started = time.monotonic()
    epochs = integer("epochs", epochs, 1)
    run_dir = fresh_run_dir(run_dir)
    checkpoints = run_dir / "checkpoints"
    say = print if verbose else (lambda *a, **k: None)
    steps = steps_per_epoch()
    kill_epoch, kill_step = kill_point(epochs)
    say(f"== kerasdist demo: {epochs} epoch(s) of a CNN on the UCI digits, run directory {run_dir}")
    say(f"== run 1 (child process): will be killed with SIGKILL at epoch {kill_epoch + 1}, step {kill_step}")
    child = subprocess.Popen(
        [sys.executable, "-u", "-m", "kerasdist", "demo", "--run-dir", str(run_dir),
         "--epochs", str(epochs), "--kill-at", f"{kill_epoch}:{kill_step}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")},
    )
    assert child.stdout is not None
    for line in child.stdout:
        if not _noise(line):
            say(f"[run 1] {line.rstrip()}", flush=True)
    status = child.wait()
    killed = status == -signal.SIGKILL
    say(f"== run 1 ended: {'killed by SIGKILL' if killed else f'exit status {status}'}")
    if not killed:
        raise RuntimeError(f"the demo's training process was to be killed, but it ended with status {status}.")

    from kerasdist.checkpoint import latest_checkpoint
    from kerasdist.strategy import describe_strategy

    latest = latest_checkpoint(checkpoints)
    resume = {"epoch": latest.epoch, "step_in_epoch": latest.step_in_epoch, "global_step": latest.global_step} \
        if latest else {"epoch": 0, "step_in_epoch": 0, "global_step": 0}
    say(f"== run 2 (this process): newest checkpoint is epoch {resume['epoch'] + 1}, step "
        f"{resume['step_in_epoch']} (global step {resume['global_step']}): the {kill_step - resume['step_in_epoch']} "
        "steps after it were lost; training continues at the next batch")
    history, strategy = train(run_dir, epochs, resume=(resume["epoch"], resume["step_in_epoch"]), say=say)
    model = history.model
    x_test, y_test = test_data()
    loss, accuracy = (float(v) for v in model.evaluate(x_test, y_test, batch_size=BATCH_SIZE, verbose=0))
    say(f"== test accuracy {accuracy:.4f} (loss {loss:.4f}) on {TEST_SAMPLES} held-out digits")
    png = plot_curves(history.history, run_dir / "curves.png", steps=steps,
                      kill=(kill_epoch, kill_step), resume=(resume["epoch"], resume["step_in_epoch"]))
    result = {
        "strategy": describe_strategy(strategy).kind,
        "replicas": int(strategy.num_replicas_in_sync),
        "killed_at": {"epoch": kill_epoch, "step_in_epoch": kill_step},
        "resumed_from": resume,
        "epochs": len(history.epoch),
        "optimizer_steps": int(model.optimizer.iterations.numpy()),
        "test_loss": loss,
        "test_accuracy": accuracy,
        "png": str(png),
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    (run_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    say(f"== wrote {png} and {run_dir / 'result.json'}; {result['optimizer_steps']} optimizer steps in "
        f"{len(history.epoch)} epochs, {result['wall_seconds']} s in all")
    return result


def steps_per_epoch() -> int:
    """Training steps in one epoch of the demo (the last, smaller batch included)."""
    return -(-TRAIN_SAMPLES // BATCH_SIZE)


def kill_point(epochs: int) -> tuple[int, int]:
    """(epoch, step) at which the first run kills itself: in epoch `epochs // 2` (0-based), from
    its middle on, the first step `LOST_STEPS` steps after a mid-epoch checkpoint."""
    epochs = integer("epochs", epochs, 1)
    steps = steps_per_epoch()
    kill_epoch, kill_step = epochs // 2, steps // 2
    while (kill_epoch * steps + kill_step) % EVERY_STEPS != LOST_STEPS:  # mid-way between two saves
        kill_step += 1
    return kill_epoch, kill_step


def step_in_epoch(epoch: int, batch: int, resume: Sequence[int] = (0, 0)) -> int:
    """The 1-based step that 0-based `batch` ends; a resumed epoch's count on from its checkpoint."""
    return batch + 1 + (resume[1] if epoch == resume[0] else 0)


def step_line(epoch: int, step: int, logs: Mapping[str, float]) -> str | None:
    """The progress line after `step` of 0-based `epoch`, or None between every EVERY_STEPS."""
    if step % EVERY_STEPS != 0:
        return None
    return (f"epoch {epoch + 1} step {step:>2}  loss {logs.get('loss', float('nan')):.4f}  "
            f"accuracy {logs.get('accuracy', float('nan')):.4f}")


def kill_line(epoch: int, step: int) -> str:
    return f"epoch {epoch + 1} step {step:>2}  SIGKILL (no clean-up, no save)"


def epoch_line(epoch: int, logs: Mapping[str, float]) -> str:
    """The line at the end of 0-based `epoch`: training and validation loss and accuracy."""
    return (f"epoch {epoch + 1} done  loss {logs.get('loss', 0):.4f}  accuracy "
            f"{logs.get('accuracy', 0):.4f}  val_loss {logs.get('val_loss', 0):.4f}  "
            f"val_accuracy {logs.get('val_accuracy', 0):.4f}")


def build_model() -> Any:
    """A small CNN for 8x8x1 digits, compiled with built-in loss and metric names."""
    import keras

    keras.utils.set_random_seed(SEED)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.005), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def train_data():
    from kerasdist.datasets import load_digits

    x, y = load_digits()
    return x[:-TEST_SAMPLES], y[:-TEST_SAMPLES]


def test_data():
    from kerasdist.datasets import load_digits

    x, y = load_digits()
    return x[-TEST_SAMPLES:], y[-TEST_SAMPLES:]


def train(run_dir: Path, epochs: int, *, kill_at: tuple[int, int] | None = None,
          resume: tuple[int, int] = (0, 0), say=print):
    """One `distributed_fit` call: the same in the killed run and in the resumed one."""
    import keras

    from kerasdist.strategy import describe_strategy, select_strategy, simulate_devices
    from kerasdist.training import distributed_fit

    simulate_devices(2)
    strategy = select_strategy("auto")
    desc = describe_strategy(strategy)
    say(f"strategy {desc.kind} with {desc.num_replicas} replicas ({', '.join(desc.devices)}): "
        f"{desc.reason}", flush=True)
    x, y = train_data()
    callbacks = [progress_callback(say, kill_at, resume),
                 keras.callbacks.CSVLogger(str(run_dir / "log.csv"), append=True)]
    history = distributed_fit(
        build_model, x, y, epochs=epochs, checkpoint_dir=run_dir / "checkpoints", strategy=strategy,
        batch_size=BATCH_SIZE, seed=SEED, validation_split=VALIDATION_SPLIT, every_steps=EVERY_STEPS, keep=3,
        callbacks=callbacks, verbose=0,
    )
    return history, strategy


def _progress_class():
    import keras

    class Progress(keras.callbacks.Callback):
        """Prints a line every few steps and at each epoch end; optionally SIGKILLs this process."""

        def __init__(self, say, kill_at=None, resume=(0, 0)):
            super().__init__()
            self.say, self.kill_at, self.resume = say, kill_at, resume
            self.epoch = 0
            self.killing = False

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            self._kill_if_due()

        def on_train_batch_begin(self, batch, logs=None):
            self._kill_if_due()

        def _kill_if_due(self):
            # The step before is done and its checkpoint taken (the checkpoint callback runs after
            # this one); its background write is done by now on any machine but the most loaded:
            # wait for it so the demo resumes where it says.
            if self.killing:
                from kerasdist.checkpoint.background import wait_for_all

                wait_for_all()
                os.kill(os.getpid(), signal.SIGKILL)

        def on_train_batch_end(self, batch, logs=None):
            step = step_in_epoch(self.epoch, batch, self.resume)
            line = step_line(self.epoch, step, logs or {})
            if line is not None:
                self.say(line, flush=True)
            if self.kill_at == (self.epoch, step):
                self.say(kill_line(self.epoch, step), flush=True)
                self.killing = True  # at the next hook, once the checkpoint callback has run

        def on_epoch_end(self, epoch, logs=None):
            self.say(epoch_line(epoch, logs or {}), flush=True)

    return Progress


def progress_callback(say, kill_at=None, resume=(0, 0)):
    """The demo's `Progress` callback (its class is made on first use: keras imports late here)."""
    return _progress_class()(say, kill_at, resume)


def plot_curves(history: dict[str, list[float]], path: Path, *, steps: int,
                kill: tuple[int, int], resume: tuple[int, int]) -> Path:
    """Loss and accuracy per epoch (train and validation), the kill and the resume point marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # From R a one-epoch history arrives with scalars instead of lists.
    history = {k: list(v) if isinstance(v, (list, tuple)) else [v] for k, v in dict(history).items()}
    epochs = list(range(1, len(history.get("loss", [])) + 1))
    kill_x = kill[0] + kill[1] / steps
    resume_x = resume[0] + resume[1] / steps
    figure, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for axis, metric in zip(axes, ("loss", "accuracy"), strict=True):
        axis.plot(epochs, history.get(metric, []), "o-", label=f"train {metric}")
        if f"val_{metric}" in history:
            axis.plot(epochs, history[f"val_{metric}"], "s--", label=f"validation {metric}")
        axis.axvline(kill_x, color="red", linestyle=":", label=f"SIGKILL (epoch {kill[0] + 1}, step {kill[1]})")
        axis.axvline(resume_x, color="green", linestyle="-.", alpha=0.7,
                     label=f"resumed from checkpoint (epoch {resume[0] + 1}, step {resume[1]})")
        axis.set_xlabel("epoch")
        axis.set_ylabel(metric)
        axis.set_xlim(0, max(epochs or [1]) + 0.2)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("kerasdist demo: CNN on the UCI digits, MirroredStrategy on 2 CPU devices, killed and resumed")
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def fresh_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    """`run_dir`, created, without the checkpoints and outputs of an earlier demo."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"run_dir {str(run_dir)!r} is a file, not a directory.")
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    for name in ("log.csv", "curves.png", "result.json"):
        (run_dir / name).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def _noise(line: str) -> bool:
    """TensorFlow's start-up chatter that TF_CPP_MIN_LOG_LEVEL does not silence."""
    return line.startswith(("WARNING: All log messages", "I0000", "W0000")) or "cpu_feature_guard" in line \
        or line.startswith("To enable the following")


def run_child(run_dir: str, epochs: int, kill_at: str) -> int:
    """The killed run (`--kill-at EPOCH:STEP`, internal to the demo)."""
    epoch, step = (int(v) for v in kill_at.split(":"))
    train(Path(run_dir), epochs, kill_at=(epoch, step))
    return 1  # not reached when the kill happens
