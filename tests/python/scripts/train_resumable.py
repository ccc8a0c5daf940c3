"""A seeded training run that can be killed at any point and restarted (fault-injection tests).

usage: train_resumable.py CHECKPOINT_DIR OUT.npz [--every-steps N] [--epochs E] [--kill-during-upload G]
                          [--sync-save] [--slow-write SECONDS] [--keep K]
Prints "step G" after every optimizer step (flushed) so a test can kill it at a chosen step,
and writes the final weights to OUT.npz when training completes. CHECKPOINT_DIR may be an
object-store URL (configured by the AWS_* or STORAGE_EMULATOR_HOST environment variables); with
--kill-during-upload the run SIGKILLs itself while saving the checkpoint of step G, after its files
are uploaded and before its completion record is. --sync-save writes checkpoints on the training thread
(async_save=False). --slow-write holds every local checkpoint write for SECONDS once its files are
in the temporary directory and before its record is written, printing "writing ckpt-G" first, so
a test can kill it in the middle of a (background) write. --keep: how many checkpoints to keep (2).
"""

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402,F401

import kerasdist  # noqa: E402

SEED = 1234
SAMPLES, FEATURES, BATCH = 192, 8, 16


def build_model():
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def epoch_data(x, y):
    """Each epoch's batches, shuffled as a pure function of (seed, epoch) by make_dataset."""
    def data(epoch):
        return kerasdist.make_dataset(x, y, batch_size=BATCH, seed=SEED, initial_epoch=epoch, epochs=epoch + 1)
    return data


def say(line):
    """One line in one write: lines from the checkpoint writer's thread do not split it."""
    sys.stdout.write(f"{line}\n")
    sys.stdout.flush()


class PrintSteps(keras.callbacks.Callback):
    def __init__(self, step_seconds=0.0):
        super().__init__()
        self.step_seconds = step_seconds  # pacing, so a test's signal lands before the epoch ends

    def on_train_batch_end(self, batch, logs=None):
        say(f"step {int(self.model.optimizer.iterations.numpy())}")
        time.sleep(self.step_seconds)


def hold_writes(seconds):
    """Fault injection: each checkpoint write pauses between its files and its record."""
    from kerasdist.checkpoint import layout
    from kerasdist.checkpoint.store import local

    write = local.write_durably

    def slow(path, data):
        if path.name == layout.RECORD_FILE:  # written last: the other files are in place
            step = path.parent.name.removeprefix(layout.TEMP_PREFIX).split("-")[0]
            say(f"writing ckpt-{step}")  # from the writer's thread
            time.sleep(seconds)
        return write(path, data)

    local.write_durably = slow


def kill_during_upload(step):
    """SIGKILL this process when the completion record of checkpoint `step` is about to go up."""
    from kerasdist.checkpoint import layout
    from kerasdist.checkpoint.store import ObjectStore

    commit = ObjectStore.commit

    def killing_commit(self, global_step, files, marker):
        if global_step == step:
            pipe = self.fs.pipe_file

            def pipe_or_die(path, data, **kwargs):
                if path.endswith("/" + layout.RECORD_FILE):
                    os.kill(os.getpid(), signal.SIGKILL)
                return pipe(path, data, **kwargs)

            self.fs.pipe_file = pipe_or_die
        return commit(self, global_step, files, marker)

    ObjectStore.commit = killing_commit


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint_dir")
    parser.add_argument("out")
    parser.add_argument("--every-steps", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill-during-upload", type=int, default=None)
    parser.add_argument("--sync-save", action="store_true")
    parser.add_argument("--slow-write", type=float, default=0.0)
    parser.add_argument("--keep", type=int, default=2)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    args = parser.parse_args()
    if args.slow_write:
        hold_writes(args.slow_write)
    if args.kill_during_upload is not None:
        kill_during_upload(args.kill_during_upload)

    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    y = (x @ rng.normal(size=(FEATURES, 1))).astype("float32")

    model = kerasdist.make_or_restore_model(args.checkpoint_dir, build_model)
    checkpoint = kerasdist.checkpoint_callback(args.checkpoint_dir, every_steps=args.every_steps, keep=args.keep,
                                             async_save=not args.sync_save)
    history = kerasdist.resume_fit(
        model, epoch_data(x, y), args.epochs, checkpoint, callbacks=[PrintSteps(args.step_seconds)], verbose=0
    )
    np.savez(args.out, *model.get_weights())
    print(f"done epochs={len(history.epoch)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
