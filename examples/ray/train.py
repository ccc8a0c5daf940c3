"""kerasdist on Ray Train: the driver, and the training function every Ray worker runs.

    python examples/ray/train.py --address 10.0.0.1:6379 --storage-path /shared/ray --name digits

Ray's `TensorflowTrainer` starts --workers workers (a Ray actor each, spread over the cluster's
nodes) and writes each one's TF_CONFIG; in each, `distributed_fit` sees the multi-worker cluster,
restores the newest checkpoint in `ray_checkpoint_dir()` (the run's folder in --storage-path,
which every node must reach: a shared disk, or s3:// / gs://) or builds the model, and trains to
--epochs in total, saving every --every-steps steps (the chief writes). kerasdist reports each
epoch's metrics to Ray and its newest checkpoint as the Ray checkpoint (nothing copied). When a
worker dies or a node is lost, Ray restarts the worker group (`FailureConfig(max_failures)`) and it
resumes at the next unseen batch; running this again with the same --name and --storage-path (a
new driver) resumes the same way. --workers MIN-MAX lets Ray go on with fewer workers when a node
is lost (Ray Train's elastic training). Each worker appends its pid and each step to
--out-dir/rank<R>.log and writes its final weights to --out-dir/weights-rank<R>.npz. A tiny
regression model on seeded data (320 samples, global batch 32: 10 steps an epoch), as the Slurm
recipe's. R drives the same run with train.R.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

SEED = 2026


def train_fn(config: dict[str, Any]) -> None:
    """One Ray worker's training (Ray runs it in every worker of the group)."""
    import ray.train

    import kerasdist  # first: from its import on, TensorFlow starts quietly and Keras is fixed for multi-worker

    strategy = kerasdist.select_strategy()  # TF_CONFIG from Ray: "multi_worker" (one worker: "default")
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(SEED)
    tf.config.experimental.enable_op_determinism()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 4)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(4, 1))).astype("float32")

    rank = ray.train.get_context().get_world_rank()
    log = worker_log(os.path.join(config["out_dir"], f"rank{rank}.log"), config["step_seconds"])
    history = kerasdist.distributed_fit(
        build_model, x, y, epochs=config["epochs"], checkpoint_dir=kerasdist.ray_checkpoint_dir(),
        strategy=strategy, batch_size=32, seed=SEED, every_steps=config["every_steps"], keep=2,
        callbacks=[log], verbose=0)
    np.savez(os.path.join(config["out_dir"], f"weights-rank{rank}.npz"), *history.model.get_weights())
    log.write(f"done {strategy.num_replicas_in_sync} replicas")


def build_model():
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def worker_log(path: str, seconds: float):
    """A Keras callback that appends "pid P" when made and "step N" after each optimizer step to
    `path`, and sleeps `seconds` before each step (stretches a demo so a failure lands mid-run)."""
    import keras

    class WorkerLog(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.write(f"pid {os.getpid()}")

        def write(self, line: str) -> None:
            with open(path, "a") as log:
                log.write(f"{line}\n")

        def on_train_batch_begin(self, batch, logs=None):
            if seconds:
                time.sleep(seconds)

        def on_train_batch_end(self, batch, logs=None):
            self.write(f"step {int(self.model.optimizer.iterations.numpy())}")

    return WorkerLog()


def run(storage_path: str, name: str = "kerasdist-ray", *, address: str | None = None,
        node_ip_address: str | None = None, workers: int | tuple[int, int] = 2, epochs: int = 3,
        max_failures: int = 3, every_steps: int = 5, step_seconds: float = 0.0, out_dir: str = "out",
        placement: str = "SPREAD", tune: bool = False) -> Any:
    """Fit `train_fn` on a Ray cluster with a `TensorflowTrainer`; returns Ray's `Result`
    (`result.metrics`: the last epoch's; `result.checkpoint`: kerasdist's newest epoch-end
    checkpoint). The same `storage_path` and `name` resume a run that stopped. `workers`: a count,
    or (min, max) for Ray's elastic training. With `tune`, the trainer runs as the one trial of a
    Ray Tune experiment, which gets its metrics (`checkpoint_path`: the checkpoint's); returns the
    trial's Tune `Result`."""
    import ray
    import ray.cloudpickle
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    if __name__ != "__main__":  # imported (train.R): ship this file's functions, workers need not import it
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address=address, _node_ip_address=node_ip_address, log_to_driver=False)
    out_dir = os.path.abspath(out_dir)  # Ray runs the function in a working directory of its own
    os.makedirs(out_dir, exist_ok=True)

    def fit(callbacks: list[Any]) -> Any:
        return TensorflowTrainer(
            train_fn,
            train_loop_config={"epochs": epochs, "every_steps": every_steps, "step_seconds": step_seconds,
                               "out_dir": out_dir},
            scaling_config=ScalingConfig(num_workers=workers, placement_strategy=placement),
            run_config=RunConfig(name=name, storage_path=storage_path, callbacks=callbacks,
                                 failure_config=FailureConfig(max_failures=max_failures)),
        ).fit()

    if not tune:
        return fit([])
    from ray import tune as ray_tune
    from ray.tune.integration.ray_train import TuneReportCallback

    def trial(config: dict[str, Any]) -> None:  # Tune's trial: the trainer's driver
        fit([TuneReportCallback()])

    # the trial holds one CPU of its own (Tune's default; Ray refuses none) besides the workers'
    tuner = ray_tune.Tuner(trial, run_config=ray_tune.RunConfig(name=f"{name}-tune", storage_path=storage_path))
    return tuner.fit()[0]


def _workers(text: str) -> int | tuple[int, int]:
    low, _, high = text.partition("-")
    return (int(low), int(high)) if high else int(low)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="the Ray cluster (default: RAY_ADDRESS or a local one)")
    parser.add_argument("--node-ip-address", default=None,
                        help="this node's address (ray start --node-ip-address), if not the one Ray guesses")
    parser.add_argument("--storage-path", required=True, help="Ray's storage: a directory every node reaches, or s3://")
    parser.add_argument("--name", default="kerasdist-ray", help="the run's name: the same name resumes it")
    parser.add_argument("--workers", type=_workers, default=2, help="N, or MIN-MAX to go on with fewer (elastic)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs in total, earlier runs included")
    parser.add_argument("--max-failures", type=int, default=3, help="worker-group restarts Ray allows")
    parser.add_argument("--every-steps", type=int, default=5, help="a checkpoint every N steps")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep before each step (demos)")
    parser.add_argument("--out-dir", default="out", help="each worker's log and final weights")
    parser.add_argument("--placement", default="SPREAD", help="Ray's placement strategy (SPREAD, PACK)")
    parser.add_argument("--tune", action="store_true", help="run the trainer as the one trial of a Ray Tune run")
    args = parser.parse_args(argv)
    result = run(args.storage_path, args.name, address=args.address, node_ip_address=args.node_ip_address,
                 workers=args.workers, epochs=args.epochs,
                 max_failures=args.max_failures, every_steps=args.every_steps, step_seconds=args.step_seconds,
                 out_dir=args.out_dir, placement=args.placement, tune=args.tune)
    if args.tune:  # the trial's metrics: the last report's, the checkpoint's path among them (and Tune's own)
        print(f"metrics {json.dumps({name: result.metrics[name] for name in ('loss', 'epoch')})}", flush=True)
        print(f"checkpoint {result.metrics['checkpoint_path']}", flush=True)
        return
    print(f"metrics {json.dumps(result.metrics)}", flush=True)
    print(f"checkpoint {result.checkpoint.path if result.checkpoint else None}", flush=True)


if __name__ == "__main__":
    main()
