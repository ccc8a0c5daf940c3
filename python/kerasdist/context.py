"""Where this process trains: `RunContext` (replicas, workers, this task, chief or not), decided
once per strategy (`context_of`, what kerasdist's own functions use) or, outside any strategy's
scope, from the cluster the environment describes (`run_context`, what users ask). A strategy the
user made is adopted here on kerasdist's first call on it.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from kerasdist.cluster import ClusterInfo, cluster_from_environment, cluster_of_resolver

# Strategies kerasdist built (strategy.select_strategy), with the plan that chose them (weak: a
# dropped strategy is freed).
_PLANS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
# When kerasdist first had each strategy formed (built, or the user's seen): a reused strategy
# keeps its time, so a run log's "ready" is the cluster's, not the latest call's.
_FORMED_AT: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def remember_plan(strategy: Any, plan: Any) -> None:
    """`strategy` was built (or reused) from `plan` (a `strategy.StrategyPlan`): its context is
    decided anew from it."""
    _PLANS[strategy] = plan
    _FORMED_AT.setdefault(strategy, time.time())
    _CONTEXTS.pop(strategy, None)


def plan_of(strategy: Any) -> Any:
    """The plan `strategy` was built from, or None for a strategy kerasdist did not build."""
    return _PLANS.get(strategy)


@dataclass(frozen=True)
class RunContext:
    """Where this process is, decided once per strategy by `context_of` and passed down, so the
    data pipeline, checkpoints and parameter-server training read it instead of re-deriving it.

    Attributes:
        strategy: the `tf.distribute.Strategy` training runs under.
        kind: its kind ("default", "mirrored", "multi_worker", "parameter_server", ...).
        num_replicas: replicas in sync (all workers together).
        num_workers: tasks that run training steps and read data: workers, plus the chief except
            under parameter servers, where the chief only coordinates (`ClusterInfo.num_workers`).
        task_type: "chief", "worker", ... or None outside a cluster.
        task_index: the index within `task_type`, or None.
        is_chief: whether this process writes checkpoints and logs.
        formed_at: Unix time kerasdist first saw the strategy formed (its cluster, if any, up).
    """

    strategy: Any
    kind: str
    num_replicas: int
    num_workers: int = 1
    task_type: str | None = None
    task_index: int | None = None
    is_chief: bool = True
    formed_at: float = field(default_factory=time.time, compare=False)

    @property
    def task(self) -> str | None:
        """"worker:0", "chief:0", ... or None outside a cluster."""
        return f"{self.task_type}:{self.task_index}" if self.task_type else None

    @property
    def is_parameter_server(self) -> bool:
        return self.kind == "parameter_server"


# Contexts decided so far, one per strategy (weak: a dropped strategy is freed).
_CONTEXTS: weakref.WeakKeyDictionary[Any, RunContext] = weakref.WeakKeyDictionary()


def run_context(strategy: Any = None) -> RunContext:
    """Where this process trains: replicas, workers, this task, whether it is the chief.

    With a strategy (or inside a strategy's scope), that strategy's context. With neither, this
    process's place in the cluster its environment describes (TF_CONFIG, Slurm, `kerasdist
    launch`) with the default strategy's replicas, so outside any scope `run_context().is_chief`
    is True on one worker only: the test for chief-only work (logs, exports, plots).

    Args:
        strategy: a `tf.distribute.Strategy`; None: the active one, as above.
    """
    import tensorflow as tf

    if strategy is None and not tf.distribute.has_strategy():
        return _outside_any_scope(tf.distribute.get_strategy())
    return context_of(strategy)


def _outside_any_scope(default: Any) -> RunContext:
    cluster = cluster_from_environment()
    return RunContext(strategy=default, kind="default", num_replicas=int(default.num_replicas_in_sync),
                      num_workers=cluster.num_workers, task_type=cluster.task_type,
                      task_index=cluster.task_index, is_chief=cluster.is_chief)


def context_of(strategy: Any = None) -> RunContext:
    """The run context of `strategy` (default: the strategy whose scope is active, the default
    strategy outside any scope); a `RunContext` is returned as it is.

    The one place kerasdist asks TensorFlow for the active strategy and works out the replicas,
    the workers, this task and whether it is the chief; what kerasdist's own functions use (a
    default strategy is one process, whatever the environment says).
    """
    import tensorflow as tf

    if isinstance(strategy, RunContext):
        return strategy
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.Strategy):
        raise ValueError(f"strategy must be a tf.distribute.Strategy, got {type(strategy).__name__}.")
    context = _CONTEXTS.get(strategy)
    if context is None:
        plan = _PLANS.get(strategy)
        if plan is None:
            _adopt(strategy)
        cluster = plan.cluster if plan else _cluster_of(strategy)
        context = RunContext(
            strategy=strategy,
            kind=plan.kind if plan else _kind_of(strategy),
            num_replicas=int(strategy.num_replicas_in_sync),
            num_workers=cluster.num_workers,
            task_type=cluster.task_type,
            task_index=cluster.task_index,
            is_chief=cluster.is_chief,
            formed_at=_FORMED_AT.setdefault(strategy, time.time()),
        )
        _CONTEXTS[strategy] = context
    return context


def _adopt(strategy: Any) -> None:
    """What `select_strategy` does after making a strategy, for one the user made: a multi-worker
    one left SIGTERM with TensorFlow's coordination agent, which noted any signal while the
    cluster formed (`preemption.signals.ClusterStartHold`). Each worker reads that notice; a
    signalled cluster stops every worker that read it with 75 before training, the workers meeting
    first (the chief hosts the store the others read it from). There is no vote here: a worker
    that reads no notice (its first kerasdist call 1.5 s after the others', or a signal the hold
    recorded on another worker) trains on, and loses its peers (76). The Keras fixes are in place
    since `import kerasdist` (`compat`)."""
    from kerasdist.compat import is_multi_worker

    if is_multi_worker(strategy):
        from kerasdist.preemption.agreement import meet_every_worker
        from kerasdist.preemption.signals import ClusterStartHold

        with ClusterStartHold() as hold:
            hold.any_noticed = hold.noticed()
            if hold.any_noticed:
                meet_every_worker("kerasdist-preempted-when-adopted")


def _kind_of(strategy: Any) -> str:
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):  # CollectiveAllReduceStrategy
        return "multi_worker"
    name = type(strategy).__name__
    for pattern, kind in (
        ("MultiWorker", "multi_worker"), ("ParameterServer", "parameter_server"),
        ("TPU", "tpu"), ("OneDevice", "one_device"), ("Mirrored", "mirrored"),
    ):
        if pattern in name:
            return kind
    return "default"


def _cluster_of(strategy: Any) -> ClusterInfo:
    resolver = getattr(strategy, "cluster_resolver", None)
    try:
        return cluster_of_resolver(resolver) if resolver is not None else ClusterInfo()
    except (ValueError, AttributeError, NotImplementedError):
        return ClusterInfo()
