"""The Slurm recipe's training (examples/slurm/train.py: the same model, data, seed and checkpoints,
so the same weights) with faults for the step watchdog's tests (test_hangs.py, test_slurm.py,
tools/hang_recovery.py): a task that stops stepping, or whose input is slow.

usage: train_hang.py --checkpoint-dir DIR --out-dir DIR [--hang KIND:TASK:STEP ...] [--hang-timeout T]
                     [--slow-input TASK:SECONDS] [--slow PHASE:SECONDS ...] [--epochs E] [--every-steps N]
                     [--step-seconds S] [--validate] [--sync-save] [--tensorboard DIR]

--hang python:worker:1:7 has task worker:1 block for good in a callback at the end of step 7
(`python`: time.sleep; `c`: a C sleep called through ctypes.PyDLL, which holds the GIL; `pipeline`:
from step 7 on, its input pipeline's Python map function blocks). Each --hang happens once per
run, in order: the first in the first attempt that reaches its step, the next in a later attempt
(a file in the checkpoint directory's folder, `hangs-done`, counts them, and the stuck process
appends "<index> <unix time>" to `hangs-at` as it blocks: the outside stopwatch's start). TASK
may be a Slurm task's "worker:K" (SLURM_PROCID) or the launcher's.
--slow-input worker:1:0.05 makes that task's input pipeline take 0.05 s more per batch (a
straggler); --tensorboard DIR trains along with a TensorBoard callback (kerasdist's run figures).
--slow first_step:20 (or restore, validation, save) stretches that phase by sleeping
(the first step: in the model's first call, while it is traced; restore: in the checkpoint
manager's restore; validation: in the validation data; save: in a callback's get_state, which
every checkpoint calls), to show the watchdog does not count them.
Prints "step N" after every step; each task writes its final weights to OUT_DIR/weights-task<K>.npz.
"""

import argparse
import ctypes
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasdist  # noqa: E402, I001
import keras  # noqa: E402, I001
import numpy as np  # noqa: E402, I001

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "slurm"))
import train as recipe  # noqa: E402  examples/slurm/train.py

_stall = threading.Event()  # set: the input pipeline's map function blocks
_one_at_a_time = threading.Lock()  # a slow input is slow whatever tf.data's parallelism


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--every-steps", type=int, default=1)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--hang", action="append", default=[])
    parser.add_argument("--hang-timeout", default="auto")
    parser.add_argument("--slow-input")
    parser.add_argument("--slow", action="append", default=[])
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--sync-save", action="store_true")
    parser.add_argument("--tensorboard")
    return parser.parse_args()


def this_task() -> str:
    if "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return f"worker:{os.environ['SLURM_PROCID']}"
    return f"{os.environ.get('KERASDIST_TASK_TYPE', 'worker')}:{os.environ.get('KERASDIST_TASK_INDEX', '0')}"


class Hang(keras.callbacks.Callback):
    """Blocks this task for good at the end of the step its --hang names (see the module docstring)."""

    def __init__(self, hangs: list[str], folder: Path):
        super().__init__()
        self.folder = folder
        done = (folder / "hangs-done").read_text().count("\n") if (folder / "hangs-done").exists() else 0
        self.index = done
        spec = hangs[done].split(":") if done < len(hangs) else None  # KIND:TASK_TYPE:INDEX:STEP
        self.kind, self.task, self.step = (spec[0], f"{spec[1]}:{spec[2]}", int(spec[3])) if spec else (None,) * 3

    def on_train_batch_end(self, batch, logs=None):
        if self.step is None or self.task != this_task():
            return
        if int(self.model.optimizer.iterations.numpy()) < self.step:
            return
        self.step = None
        if self.kind == "pipeline":
            _stall.set()
            return
        self.stuck()
        if self.kind == "python":
            time.sleep(10**6)
        else:  # C code that holds the GIL: no other Python thread runs
            ctypes.PyDLL(None).sleep(10**6)

    def stuck(self) -> None:
        with open(self.folder / "hangs-done", "a") as done:
            done.write(f"{self.index}\n")
        with open(self.folder / "hangs-at", "a") as at:
            at.write(f"{self.index} {time.time():.3f}\n")


def pipeline_map(hang: Hang, slow_input: float):
    import tensorflow as tf

    def python_part(x):
        if slow_input:
            with _one_at_a_time:
                time.sleep(slow_input / 32)  # per sample: the batch of 32 is `slow_input` slower
        if _stall.is_set():
            _stall.clear()
            hang.stuck()
            time.sleep(10**6)
        return x

    def map_fn(x, y):
        out = tf.py_function(python_part, [x], tf.float32)
        return tf.ensure_shape(out, x.shape), y

    return map_fn


class SlowSave(keras.callbacks.Callback):
    """Its state is saved in every checkpoint; getting it takes `seconds` (a slow save)."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def get_state(self):
        time.sleep(self.seconds)
        return {"calls": 0}

    def set_state(self, state):
        pass


def slowed(phases: dict[str, float]) -> None:
    if "restore" in phases:
        from kerasdist.checkpoint.manager import CheckpointManager

        restore = CheckpointManager.restore

        def slow_restore(self, *args, **kwargs):
            time.sleep(phases["restore"])
            return restore(self, *args, **kwargs)

        CheckpointManager.restore = slow_restore


def main() -> None:
    args = parse_args()
    strategy = kerasdist.select_strategy()
    import tensorflow as tf

    keras.utils.set_random_seed(recipe.SEED)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 4)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(4, 1))).astype("float32")

    folder = Path(args.checkpoint_dir).parent
    phases = {phase: float(seconds) for phase, seconds in (item.split(":") for item in args.slow)}
    slowed(phases)
    hang = Hang(args.hang, folder)
    slow_input = 0.0
    if args.slow_input:
        task, seconds = args.slow_input.rsplit(":", 1)
        slow_input = float(seconds) if task == this_task() else 0.0
    dataset_args = {"map_fn": pipeline_map(hang, slow_input)} if args.hang or args.slow_input else None

    def build():
        if "first_step" not in phases:
            return recipe.build_model()
        seconds = phases["first_step"]

        class SlowTrace(keras.layers.Layer):  # no weights: the same model as the recipe's
            def call(self, inputs):
                time.sleep(seconds)  # Python: runs while a step is traced
                return inputs

        model = keras.Sequential([keras.Input((4,)), SlowTrace(), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model

    callbacks = [recipe.Pace(args.step_seconds), hang]
    if "save" in phases:
        callbacks.append(SlowSave(phases["save"]))
    if args.tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(args.tensorboard))
    validation = None
    if args.validate:
        seconds = phases.get("validation", 0.0)
        vx, vy = x[:64], y[:64]
        validation = tf.data.Dataset.from_tensor_slices((vx, vy)).batch(32).map(
            lambda a, b: (tf.ensure_shape(tf.py_function(lambda v: (time.sleep(seconds / 2), v)[1], [a], tf.float32),
                                          a.shape), b))
    history = kerasdist.distributed_fit(
        build, x, y, epochs=args.epochs, checkpoint_dir=args.checkpoint_dir, strategy=strategy,
        batch_size=32, seed=recipe.SEED, every_steps=args.every_steps, keep=2, callbacks=callbacks, verbose=0,
        dataset_args=dataset_args, validation_data=validation, async_save=not args.sync_save,
        hang_timeout=None if args.hang_timeout == "none" else
        (args.hang_timeout if args.hang_timeout == "auto" else float(args.hang_timeout)))
    task = os.environ.get("SLURM_PROCID") or os.environ.get("KERASDIST_TASK_INDEX", "0")
    os.makedirs(args.out_dir, exist_ok=True)
    np.savez(os.path.join(args.out_dir, f"weights-task{task}.npz"), *history.model.get_weights())
    print(f"task {task} done: {strategy.num_replicas_in_sync} replicas", flush=True)


if __name__ == "__main__":
    main()
