"""Preemption under multi-worker: on SIGTERM to any worker, every worker stops after one agreed
step, the chief saves that step's checkpoint, and every worker exits with status 75.

A signal reaches the workers of a cluster at different steps (or only one of them), and a worker
that stops alone leaves the others waiting in an all-reduce. The agreement is TensorFlow's own
`tf.distribute.experimental.PreemptionCheckpointHandler`, which works with Keras 3 `fit` when it
is asked at each batch end (`save_checkpoint_if_preempted`): the signalled worker publishes, in
the coordination service MultiWorkerMirroredStrategy runs, the step after the one it has just
finished, waits until every worker has acknowledged it, and each worker stops when its own step
count reaches it (workers are at most one step apart: every step ends in an all-reduce). Checking
costs no collective and no message while no signal has come (a flag read per step); the exchange
happens once, on preemption. TensorFlow's checkpoint writing is replaced (`save_fn`) by the
`CheckpointCallback`'s own save (the chief writes), and its exit by the callback stopping `fit`,
which then raises `PreemptedExit`.

One handler per process: it holds a watcher thread and coordination-service keys for the whole
life of the cluster, so it is made on the first multi-worker fit and kept; each fit points it at
its callback and holds SIGTERM with TensorFlow's handler only while it runs.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from kerasdist import compat

# TensorFlow's coordination agent publishes a SIGTERM it caught under this key (tsl's
# preemption_sync_manager; tf.distribute.experimental.PreemptionWatcher reads it too).
PREEMPTION_NOTICE_KEY = "TF_DEFAULT_PREEMPTION_NOTICE_KEY"
# How long a worker waits for that notice right after the cluster formed: TensorFlow's handler only
# sets a flag, which its listener thread polls once a second (tsl preemption_notifier.cc,
# kListenInterval) before publishing, plus room. Every multi-worker start waits this long.
NOTICE_WAIT_MS = 1500


class WorkerAgreement:
    """The process's PreemptionCheckpointHandler and the callback it currently serves."""

    def __init__(self, strategy: Any):
        self.callback: Any = None
        previous = signal.getsignal(signal.SIGTERM)
        self.handler = _preemption_checkpoint_handler(strategy, self._save, self._stop)
        self.sigterm_handler = signal.getsignal(signal.SIGTERM)  # TensorFlow's: tells the cluster
        signal.signal(signal.SIGTERM, previous)  # held by the callback while a fit runs

    def serve(self, callback: Any) -> WorkerAgreement:
        """Save and stop through `callback` (the current fit's) on the agreed step."""
        self.callback = callback
        return self

    def check(self) -> None:
        """At every batch end, on every worker: save and stop if this is the agreed step."""
        compat.save_if_preempted(self.handler)

    def _save(self) -> None:
        self.callback.save_agreed_step()

    def _stop(self) -> None:
        self.callback.stop_preempted()


_agreement: WorkerAgreement | None = None


def agreement_for(strategy: Any) -> WorkerAgreement | None:
    """The agreement for a multi-worker `strategy`, made once per process; None when the
    strategy is not multi-worker or this is not the main thread (signals are the caller's then)."""
    global _agreement
    if not compat.is_multi_worker(strategy) or threading.current_thread() is not threading.main_thread():
        return None
    if _agreement is None:
        _agreement = WorkerAgreement(strategy)
    return _agreement


def noticed_by_tensorflow(wait_ms: int = NOTICE_WAIT_MS) -> bool:
    """Whether TensorFlow's own SIGTERM handler, which its coordination agent installs while a
    multi-worker strategy forms the cluster, caught a signal on any worker (`signals`).
    Waits at most `wait_ms` for the cluster's key-value store."""
    return compat.coordination_key_exists(PREEMPTION_NOTICE_KEY, wait_ms)


def meet_every_worker(barrier: str, timeout_seconds: float = 30.0) -> None:
    """Wait until every worker got to `barrier` (the coordination service's barrier) before
    exiting: the chief hosts that service, and a worker that left at once would fail the others'
    reads and collectives. A worker that does not come (gone meanwhile) only ends the wait."""
    try:
        compat.wait_at_coordination_barrier(barrier, int(timeout_seconds * 1000))
    except Exception:  # noqa: BLE001 - the decision is taken; this only keeps the others' calls whole
        pass


def _preemption_checkpoint_handler(strategy: Any, save_fn: Callable[[], None],
                                   exit_fn: Callable[[], None]) -> Any:
    """TensorFlow's PreemptionCheckpointHandler for a multi-worker `strategy`, saving with
    `save_fn` and stopping with `exit_fn` (the Keras callback does both), its own SIGTERM handler
    installed. Its tf.train.Checkpoint is an empty one in a private temporary directory: it is
    never written (`save_fn` replaces it), and a non-chief handler deletes the parent of its
    directory when it stops."""
    config = tf.distribute.experimental.TerminationConfig(exit_fn=exit_fn, save_fn=save_fn)
    directory = os.path.join(tempfile.mkdtemp(prefix="kerasdist-preemption-"), "unused")
    with compat.gce_metadata_probe_off():
        return tf.distribute.experimental.PreemptionCheckpointHandler(
            strategy.cluster_resolver, tf.train.Checkpoint(), directory, config)
