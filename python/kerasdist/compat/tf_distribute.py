"""TensorFlow's MultiWorkerMirroredStrategy where it says too little or offers no argument: a
strategy made too late (`explain_late_multi_worker_strategy`, applied at `import kerasdist`) and
the coordination service's heartbeat timeout (`configure_coordination`), each gated on the
TensorFlow versions checked; and the service's key-value store and barriers, which TensorFlow
offers only through its private eager context (`coordination_key_exists`,
`wait_at_coordination_barrier`). Why and the canaries: docs/upstream.md."""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf

from kerasdist.compat.versions import version_within

# TensorFlow releases whose MultiWorkerMirroredStrategy, made too late, says only this (2.21 checked).
LATE_COLLECTIVES_VERSIONS = ((2, 0), (2, 22))
LATE_COLLECTIVES_MESSAGE = "Collective ops must be configured at program startup"
_original_multi_worker_init = tf.distribute.MultiWorkerMirroredStrategy.__init__


class MultiWorkerStrategyTooLate(RuntimeError):
    """A MultiWorkerMirroredStrategy was made after TensorFlow's runtime had started."""

    __module__ = "kerasdist.compat"  # the name users and R's conditions see (docs/multi-worker.md)

    def __init__(self) -> None:
        super().__init__(
            "MultiWorkerMirroredStrategy must be created before TensorFlow runs anything in this "
            f"process (TensorFlow: '{LATE_COLLECTIVES_MESSAGE}'). Create it first, before any "
            "dataset, tensor, model or make_dataset(); or call select_strategy() first, which "
            "creates it. From R, keras3 starts TensorFlow as soon as Python's keras is imported: "
            "create it before library(keras3), or call kerasdist::select_strategy(\"multi_worker\") "
            "before any keras3 function."
        )


def explain_late_multi_worker_strategy() -> bool:
    """Make a MultiWorkerMirroredStrategy created too late raise `MultiWorkerStrategyTooLate`;
    idempotent. Returns whether the explanation is in place."""
    strategy_class = tf.distribute.MultiWorkerMirroredStrategy
    if not version_within(tf.__version__, LATE_COLLECTIVES_VERSIONS):
        return False
    if strategy_class.__init__ is not _original_multi_worker_init:
        return True

    @functools.wraps(_original_multi_worker_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            _original_multi_worker_init(self, *args, **kwargs)
        except RuntimeError as err:
            if LATE_COLLECTIVES_MESSAGE not in str(err):
                raise
            raise MultiWorkerStrategyTooLate() from None

    strategy_class.__init__ = __init__
    return True


# TensorFlow releases whose MultiWorkerMirroredStrategy configures the coordination service only
# when none is configured yet, with the default heartbeat timeout (10 s: a SIGKILLed peer was seen
# after 9.5 s) and no argument to change it (2.21 checked).
COORDINATION_CONFIG_VERSIONS = ((2, 0), (2, 22))


def configure_coordination(cluster_spec: Any, heartbeat_timeout_seconds: float) -> bool:
    """Before a MultiWorkerMirroredStrategy is made: configure TensorFlow's coordination service
    as the strategy would (standalone, its leader, the chief and worker jobs), with a heartbeat
    timeout of `heartbeat_timeout_seconds`, so the strategy keeps it. The service declares a task
    dead when it has sent no heartbeat for that long; heartbeats come from a C++ thread (every
    half timeout), so a long step or save that holds Python's GIL does not stop them. Returns
    whether it configured (False on other TensorFlow versions, or when a service is configured
    already). tests/python/test_multi_worker.py fails when the strategy stops keeping it."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    if not version_within(tf.__version__, COORDINATION_CONFIG_VERSIONS) or context.context().coordination_service:
        return False
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker") if job in cluster_spec.jobs]
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=max(1, round(heartbeat_timeout_seconds * 1000)))
    return True


def coordination_heartbeat_timeout_seconds() -> float | None:
    """The heartbeat timeout of the coordination service configured in this process, or None."""
    from tensorflow.python.eager import context

    config = context.context().coordination_service
    return config.heartbeat_timeout_in_ms / 1000 if config and config.heartbeat_timeout_in_ms else None


def coordination_key_exists(key: str, timeout_ms: int) -> bool:
    """Whether the coordination service's key-value store holds `key`, waiting at most
    `timeout_ms` for it (False also when the store cannot be reached)."""
    from tensorflow.python.eager import context

    try:
        context.context().get_config_key_value(key, timeout_in_ms=timeout_ms)
    except tf.errors.OpError:
        return False
    return True


def wait_at_coordination_barrier(barrier: str, timeout_ms: int) -> None:
    """Wait until every task of the cluster got to `barrier` (the coordination service's barrier),
    at most `timeout_ms`; raises when they do not come in time."""
    from tensorflow.python.eager import context

    context.context().wait_at_barrier(barrier, timeout_in_ms=timeout_ms)


# TensorFlow releases whose eager context reaches the coordination service's key-value store only
# through its private methods (set/get/delete_config_key_value; 2.21 checked). kerasdist's step
# watchdog and step times use it to tell the other workers of a hang, a pause and their figures.
COORDINATION_STORE_VERSIONS = ((2, 0), (2, 22))


class CoordinationStore:
    """The coordination service's key-value store (it lives in the leader task, worker 0 or the
    chief, and serves from C++ threads: a call from a thread of ours works while the training
    thread waits in a collective). Every method gives up quietly: the store is for reports and
    hints, never in training's way."""

    def __init__(self, context: Any):
        self._context = context

    def put(self, key: str, value: str) -> bool:
        """Store `value` under `key` if the key is new; whether it was stored."""
        try:
            self._context.set_config_key_value(key, value)
            return True
        except Exception:  # noqa: BLE001 - taken already, or the service is gone
            return False

    def get(self, key: str, timeout_seconds: float) -> str | None:
        """The value under `key`, waiting up to `timeout_seconds` for it to appear; None without."""
        try:
            return self._context.get_config_key_value(key, max(1, round(timeout_seconds * 1000)))
        except Exception:  # noqa: BLE001 - not there (DeadlineExceeded), or the service is gone
            return None

    def delete(self, key: str) -> None:
        try:
            self._context.delete_config_key_value(key)
        except Exception:  # noqa: BLE001 - gone already
            pass


def coordination_store() -> CoordinationStore | None:
    """This process's coordination-service store, or None: another TensorFlow, or no service (one
    worker, a strategy without one)."""
    from tensorflow.python.eager import context

    if not version_within(tf.__version__, COORDINATION_STORE_VERSIONS):
        return None
    current = context.context()
    if not current.coordination_service or not hasattr(current, "get_config_key_value"):
        return None
    return CoordinationStore(current)
