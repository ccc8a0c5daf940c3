"""kerasdist: distributed, fault-tolerant Keras 3 training on TensorFlow, from Python and R."""

from kerasdist import preemption, startup

preemption.signals.install()  # first: a cluster task preempted while TensorFlow starts exits with 75
startup.import_tensorflow_quietly()  # before any module below imports TensorFlow

from kerasdist import about, compat, strategy
from kerasdist.about import kerasdist_info
from kerasdist.advisor import StrategyBenchmark, StrategyTiming, bench_strategies
from kerasdist.checkpoint import (
    BackgroundSaveError,
    CheckpointCallback,
    CheckpointInfo,
    CheckpointManager,
    CheckpointOptions,
    CheckpointWarning,
    RunLogWarning,
    checkpoint_callback,
    checkpoint_table,
    latest_checkpoint,
    list_checkpoints,
    make_or_restore_model,
)
from kerasdist.cluster import ClusterInfo, parse_tf_config
from kerasdist.context import RunContext, run_context
from kerasdist.data import (
    BatchSizeInfo,
    DatasetInfo,
    DatasetSplit,
    InputWarning,
    batch_size_info,
    dataset_info,
    epoch_order,
    make_dataset,
    make_dataset_split,
    plan_dataset,
    resume_rule,
)
from kerasdist.datasets import load_digits
from kerasdist.demo import kerasdist_demo
from kerasdist.evaluation import distributed_evaluate, distributed_predict
from kerasdist.goodput import GoodputReport, goodput, plot_goodput
from kerasdist.launch import LaunchResult, TaskFailure, launch
from kerasdist.loss_scaling import scaled_loss
from kerasdist.monitoring import chief_path
from kerasdist.preemption import (
    HUNG_EXIT_CODE,
    PEER_LOST_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    PeerLostExit,
    PreemptedExit,
)
from kerasdist.ray_train import ray_checkpoint_dir
from kerasdist.strategy import (
    StrategyDescription,
    StrategyPlan,
    describe_strategy,
    plan_strategy,
    select_strategy,
    simulate_devices,
)
from kerasdist.training import (
    check_step_functions,
    custom_fit,
    distributed_fit,
    fit_step,
    ps_fit,
    resume_fit,
    run_server,
)

__version__ = about.VERSION  # the one definition is about.py's (hatch and the CLI read it there)
strategy.apply_requested_devices()
# Keras 3's multi-worker fit, a batch split unevenly over mirrored replicas, and optimizer variables
# made in a user's traced step (keras#23085), for strategies users make too (each a no-op where not
# in use); a multi-worker strategy made too late says why.
compat.apply_keras_fixes()
compat.explain_late_multi_worker_strategy()
preemption.signals.ignore_while_exiting()  # after TensorFlow's import: runs before its exit handlers
startup.exit_without_last_collections()

# Aliases under the names issue #13 gives them, kept out of __all__: the public names are
# distributed_* (as distributed_fit), which R shares, since evaluate()/predict() there would mask
# keras3's generics.
evaluate = distributed_evaluate
predict = distributed_predict

__all__ = [
    # strategy selection
    "ClusterInfo",
    "RunContext",
    "StrategyDescription",
    "StrategyPlan",
    "describe_strategy",
    "parse_tf_config",
    "plan_strategy",
    "run_context",
    "select_strategy",
    "simulate_devices",
    # checkpoints and resuming
    "PREEMPTED_EXIT_CODE",
    "PreemptedExit",
    "PEER_LOST_EXIT_CODE",
    "PeerLostExit",
    "HUNG_EXIT_CODE",
    "CheckpointCallback",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointOptions",
    "BackgroundSaveError",
    "CheckpointWarning",
    "RunLogWarning",
    "checkpoint_callback",
    "checkpoint_table",
    "latest_checkpoint",
    "list_checkpoints",
    "make_or_restore_model",
    "resume_fit",
    # what failures cost
    "GoodputReport",
    "goodput",
    "plot_goodput",
    # monitoring from several workers
    "chief_path",
    # input pipelines
    "BatchSizeInfo",
    "DatasetInfo",
    "DatasetSplit",
    "batch_size_info",
    "dataset_info",
    "epoch_order",
    "make_dataset",
    "make_dataset_split",
    "plan_dataset",
    # the data users bring, resumed
    "InputWarning",
    "resume_rule",
    # training
    "check_step_functions",
    "custom_fit",
    "distributed_fit",
    "fit_step",
    "ps_fit",
    "run_server",
    "scaled_loss",
    # evaluation and prediction
    "distributed_evaluate",
    "distributed_predict",
    # Ray Train
    "ray_checkpoint_dir",
    # clusters on one machine
    "LaunchResult",
    "TaskFailure",
    "launch",
    # measuring the strategies on this machine
    "StrategyBenchmark",
    "StrategyTiming",
    "bench_strategies",
    # data, demo, info
    "load_digits",
    "kerasdist_demo",
    "kerasdist_info",
]
