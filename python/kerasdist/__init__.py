"""kerasdist: distributed, fault-tolerant Keras 3 training on TensorFlow, from Python and R."""

from kerasdist.about import kerasdist_info
from kerasdist.checkpoint import (
    PREEMPTED_EXIT_CODE,
    CheckpointCallback,
    CheckpointInfo,
    CheckpointWarning,
    checkpoint_callback,
    latest_checkpoint,
    list_checkpoints,
    make_or_restore_model,
)
from kerasdist.cluster import ClusterInfo, parse_tf_config
from kerasdist.data import (
    BatchSizeInfo,
    DatasetInfo,
    batch_size_info,
    dataset_info,
    epoch_order,
    make_dataset,
)
from kerasdist.fit import resume_fit
from kerasdist.strategy import (
    StrategyDescription,
    StrategyPlan,
    describe_strategy,
    plan_strategy,
    select_strategy,
    simulate_devices,
)

__version__ = "0.1.0"

__all__ = [
    "BatchSizeInfo",
    "DatasetInfo",
    "batch_size_info",
    "dataset_info",
    "epoch_order",
    "make_dataset",
    "PREEMPTED_EXIT_CODE",
    "CheckpointCallback",
    "CheckpointInfo",
    "CheckpointWarning",
    "checkpoint_callback",
    "latest_checkpoint",
    "list_checkpoints",
    "make_or_restore_model",
    "resume_fit",
    "ClusterInfo",
    "StrategyDescription",
    "StrategyPlan",
    "describe_strategy",
    "kerasdist_info",
    "parse_tf_config",
    "plan_strategy",
    "select_strategy",
    "simulate_devices",
]

from kerasdist.launch import LaunchResult, TaskFailure, launch  # noqa: E402

__all__ += ["LaunchResult", "TaskFailure", "launch"]

from kerasdist.ps import ps_fit, run_server  # noqa: E402

__all__ += ["ps_fit", "run_server"]

from kerasdist.datasets import load_digits  # noqa: E402
from kerasdist.train import check_step_functions, distributed_fit  # noqa: E402

__all__ += ["check_step_functions", "distributed_fit", "load_digits"]
