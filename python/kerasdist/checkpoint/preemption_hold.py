"""SIGTERM held by the checkpoint callback while a fit trains (`CheckpointOptions.handle_sigterm`):
a signal marks the fit preempted, and the callback saves at the next step end, stops training and
raises `PreemptedExit`. Under a multi-worker strategy, TensorFlow's agreement
(`preemption/agreement.py`) picks the step every worker stops at and calls the callback's
`save_agreed_step` and `stop_preempted` there."""

from __future__ import annotations

from typing import Any

from kerasdist.preemption import SigtermHold


class PreemptionHold:
    """One callback's hold on SIGTERM, taken at each fit's begin and given back at its end.

    Attributes:
        preempted: SIGTERM came during this fit (or the workers agreed to stop).
        agreement: the workers' agreement serving the callback (multi-worker), else None.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.preempted = False
        self.agreement: Any = None
        self._sigterm: SigtermHold | None = None

    def take(self, strategy: Any, callback: Any) -> None:
        """A fit under `strategy` begins: hold SIGTERM (with the agreement's handler, which tells
        the cluster, under a multi-worker strategy; off the main thread nothing is held)."""
        from kerasdist.preemption.agreement import agreement_for

        agreement = agreement_for(strategy) if self.enabled else None
        self.agreement = agreement.serve(callback) if agreement is not None else None
        self.preempted = False
        if self.enabled:
            handler = self.agreement.sigterm_handler if self.agreement is not None else self._on_sigterm
            self._sigterm = SigtermHold(handler)

    def give_back(self) -> None:
        """The fit ended: SIGTERM goes back to whoever held it before."""
        if self._sigterm is not None:
            self._sigterm.release()
            self._sigterm = None

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.preempted = True
