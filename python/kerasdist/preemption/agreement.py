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
which then exits with `PREEMPTED_EXIT_CODE`.

One handler per process: it holds a watcher thread and coordination-service keys for the whole
life of the cluster, so it is made on the first multi-worker fit and kept; each fit points it at
its callback and installs its SIGTERM handler only while it runs.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from kerasdist import compat


class WorkerAgreement:
    """The process's PreemptionCheckpointHandler and the callback it currently serves."""

    def __init__(self, strategy: Any):
        self.callback: Any = None
        previous = signal.getsignal(signal.SIGTERM)
        self.handler = compat.preemption_checkpoint_handler(strategy, self._save, self._stop)
        self.sigterm_handler = signal.getsignal(signal.SIGTERM)  # TensorFlow's: tells the cluster
        signal.signal(signal.SIGTERM, previous)  # installed by the callback while a fit runs

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
