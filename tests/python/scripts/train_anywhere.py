"""The same seeded run under any strategy: resume across hardware, strategies agree, chaos tests.

usage: train_anywhere.py CHECKPOINT_DIR OUT.npz [--strategy auto|default|mirrored] [--devices N]
                         [--batch-size 32] [--epochs 2] [--every-steps 1]
                         [--kill-at-step S] [--kill-task TASK] [--kill-signal KILL|TERM]
                         [--pause-before-kill SECONDS] [--kill-in-step-end] [--sync-save]
                         [--api distributed_fit|resume_fit]
distributed_fit on 320 samples (a Dense model, global batch 32: 10 steps an epoch), a checkpoint
every step. `--devices 2 --strategy mirrored` splits the CPU into 2 replicas; under the launcher
`--strategy auto` gives multi-worker. `--api resume_fit` trains the same
run through make_or_restore_model + make_dataset + resume_fit.
Prints "step G" after every optimizer step (flushed).
`--kill-at-step S` sends the process itself `--kill-signal` once step S is checkpointed (its
background write done; `--pause-before-kill` seconds later, so the run log's heartbeat has step S; on the
launcher's first attempt only, and only on `--kill-task`, e.g. worker:1, when given; with
`--kill-in-step-end`, inside a callback at the end of step S instead, before kerasdist's callback
has taken the step, as a user's callback killed there would be); comma lists
(`--kill-at-step 3,9 --kill-task worker:0,worker:1`) kill on attempt k at the k-th step and task. The chief
(or the only process) writes its final weights to OUT.npz, any other worker to OUT-<task>.npz.
"""

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kerasdist  # noqa: E402
from kerasdist.checkpoint import background  # noqa: E402
from kerasdist.context import run_context  # noqa: E402
from kerasdist.training.resume_point import EpochRange  # noqa: E402

SEED = 2026
SAMPLES, FEATURES = 320, 4


def build_model():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


class PrintAndKill(keras.callbacks.Callback):
    def __init__(self, kill_at: int | None, sig: int, pause: float = 0.0, in_step_end: bool = False):
        super().__init__()
        self.kill_at, self.sig, self.pause, self.in_step_end = kill_at, sig, pause, in_step_end

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        print(f"step {step}", flush=True)
        if self.in_step_end and self.kill_at is not None and step >= self.kill_at:
            os.kill(os.getpid(), self.sig)  # kerasdist's callback, after this one, has not taken the step

    def on_train_batch_begin(self, batch, logs=None):  # the step before done, its checkpoint taken
        step = int(self.model.optimizer.iterations.numpy())
        if not self.in_step_end and self.kill_at is not None and step >= self.kill_at:
            self.kill_at = None
            time.sleep(self.pause)
            background.wait_for_all()  # "once step S is checkpointed": its background write done
            os.kill(os.getpid(), self.sig)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint_dir")
    parser.add_argument("out")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--every-steps", type=int, default=1)
    parser.add_argument("--kill-at-step")
    parser.add_argument("--kill-task")
    parser.add_argument("--kill-signal", default="KILL", choices=["KILL", "TERM"])
    parser.add_argument("--pause-before-kill", type=float, default=0.0)
    parser.add_argument("--kill-in-step-end", action="store_true")
    parser.add_argument("--sync-save", action="store_true", help="save on the training thread (async_save=False)")
    parser.add_argument("--api", default="distributed_fit", choices=["distributed_fit", "resume_fit"])
    args = parser.parse_args()
    if args.devices > 1:
        kerasdist.simulate_devices(args.devices)
    strategy = kerasdist.select_strategy(args.strategy)  # multi-worker must come before any op
    import tensorflow as tf

    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(FEATURES, 1))).astype("float32")

    context = run_context(strategy)
    attempt = int(os.environ.get("KERASDIST_RESTART", "0"))
    steps = [int(s) for s in args.kill_at_step.split(",")] if args.kill_at_step else []
    tasks = args.kill_task.split(",") if args.kill_task else [None] * len(steps)
    kill = steps[attempt] if attempt < len(steps) and tasks[attempt] in (None, context.task) else None
    callbacks = [PrintAndKill(kill, getattr(signal, f"SIG{args.kill_signal}"), args.pause_before_kill,
                              args.kill_in_step_end)]
    if args.api == "distributed_fit":
        model = kerasdist.distributed_fit(
            build_model, x, y, epochs=args.epochs, checkpoint_dir=args.checkpoint_dir, strategy=strategy,
            batch_size=args.batch_size, seed=SEED, every_steps=args.every_steps, keep=2,
            callbacks=callbacks, verbose=0, async_save=not args.sync_save,
        ).model
    else:
        def epochs_data(first, last, skip):
            return kerasdist.make_dataset(x, y, batch_size=args.batch_size, strategy=strategy, seed=SEED,
                                          initial_epoch=first, epochs=last, skip_batches=skip)

        model = kerasdist.make_or_restore_model(args.checkpoint_dir, build_model, strategy=strategy)
        checkpoint = kerasdist.checkpoint_callback(args.checkpoint_dir, every_steps=args.every_steps, keep=2,
                                                   async_save=not args.sync_save)
        kerasdist.resume_fit(model, EpochRange(epochs_data, args.batch_size), args.epochs, checkpoint,
                             callbacks=callbacks, verbose=0)
    out = args.out if context.is_chief else args.out.replace(".npz", f"-{context.task.replace(':', '')}.npz")
    np.savez(out, *model.get_weights())
    print(f"done replicas={context.num_replicas} workers={context.num_workers}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
