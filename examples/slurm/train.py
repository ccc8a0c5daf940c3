"""The Python training script of the Slurm recipe: every task of the job step runs this file.

    sbatch examples/slurm/train.sbatch python examples/slurm/train.py --checkpoint-dir /shared/ckpt

select_strategy() sees the Slurm step (more than one task) and picks "multi_worker";
distributed_fit restores the newest checkpoint in --checkpoint-dir (or builds the model), trains
to --epochs in total (or to --stop-after-step steps) and saves a checkpoint every --every-steps
steps (the chief writes). On SIGTERM (preemption, the time-limit warning, scancel --signal=TERM)
every task stops after one agreed step, the chief saves it, and every task exits 75: train.sbatch
then requeues the job, which resumes at the next batch. Each task writes its final weights to
--out-dir/weights-task<SLURM_PROCID>.npz. A tiny regression model on seeded data (320 samples,
global batch 32: 10 steps an epoch); run without Slurm it trains the same global batches in one
process. Its R twin is train.R.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# kerasdist first: from its import on, a SIGTERM before training exits 75 at once (nothing to save)
import kerasdist  # noqa: E402, I001
import keras  # noqa: E402, I001
import numpy as np  # noqa: E402, I001

SEED = 2026


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", default="ckpt", help="where checkpoints live (default ckpt)")
    parser.add_argument("--out-dir", default=".", help="where each task writes weights-task<K>.npz")
    parser.add_argument("--epochs", type=int, default=3, help="epochs in total, earlier runs included")
    parser.add_argument("--every-steps", type=int, default=1, help="a checkpoint every N steps")
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="sleep this long after each step (stretches a demo so a signal lands mid-run)")
    parser.add_argument("--stop-after-step", type=int, default=None,
                        help="end this job once N steps are trained in total, earlier jobs included (a "
                             "checkpoint is saved there; run without it, or with a larger N, to go on)")
    return parser.parse_args()


def build_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


class Pace(keras.callbacks.Callback):
    """Prints each optimizer step ("step N") and sleeps `seconds` after it (at the next step's
    start: kerasdist's checkpoint callback, which runs after this one at a step's end, has then
    taken the step)."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        print(f"step {int(self.model.optimizer.iterations.numpy())}", flush=True)

    def on_train_batch_begin(self, batch, logs=None):
        if self.seconds:
            time.sleep(self.seconds)


class StopAfterStep(keras.callbacks.Callback):
    """Ends fit once the optimizer has taken `step` steps in total: kerasdist saves that step, and
    a later fit on the same checkpoint directory goes on at the next batch."""

    def __init__(self, step: int):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) >= self.step:
            self.model.stop_training = True


def main() -> None:
    args = parse_args()
    strategy = kerasdist.select_strategy()  # first: multi-worker must be set up before TensorFlow runs an op
    import tensorflow as tf

    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 4)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(4, 1))).astype("float32")

    callbacks = [Pace(args.step_seconds)]
    if args.stop_after_step is not None:
        callbacks.append(StopAfterStep(args.stop_after_step))
    history = kerasdist.distributed_fit(
        build_model, x, y, epochs=args.epochs, checkpoint_dir=args.checkpoint_dir, strategy=strategy,
        batch_size=32, seed=SEED, every_steps=args.every_steps, keep=2, callbacks=callbacks, verbose=0)
    task = os.environ.get("SLURM_PROCID", "0")
    os.makedirs(args.out_dir, exist_ok=True)
    np.savez(os.path.join(args.out_dir, f"weights-task{task}.npz"), *history.model.get_weights())
    print(f"task {task} done: {strategy.num_replicas_in_sync} replicas", flush=True)


if __name__ == "__main__":
    main()
