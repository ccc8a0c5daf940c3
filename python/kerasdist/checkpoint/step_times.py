"""Every worker's step times, so that a straggler can be named: synchronous training runs at the
pace of its slowest worker, and every other worker waits for it in the step's all-reduces.

Each worker of a multi-worker fit sums the seconds its all-reduces took in a sample of its steps
(`compat.CollectiveWaits`: a clock read before and after each all-reduce, in the step's graph; a
step every `SAMPLE_SECONDS` at most, so the clock's cost stays near nothing whatever the step
time) and, at each epoch end, gives the chief its mean per sampled step through the coordination
service (`peers`); the chief's
run log records them all (`run_log.Event.STEP_TIMES`, from a background thread: the training
thread never waits for them). A worker that arrives late at the all-reduces (a slow input
pipeline, slow callbacks, a slow host) waits least; the others wait for it. `stragglers.straggler_of`
turns the records into the straggler `kerasdist.goodput` and the TensorBoard figures name.
Not measured: one worker (nothing to wait for), parameter servers (the coordinator schedules each
step on a free worker), steps compiled with XLA (no timestamps inside).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from kerasdist import compat
from kerasdist.checkpoint.peers import Peers

GATHER_SECONDS = 10.0  # the chief waits this long for another worker's figures of an epoch
SAMPLE_SECONDS = 0.25  # a step's all-reduces are timed when the last timed step began this long ago
_STEPS = "steps"


class StepTimes:
    """One checkpoint callback's step times (see the module docstring): `start` at a fit's begin,
    then per epoch `epoch_began`, `step_began`/`steps_ended` around each step (execution),
    `epoch_ended`; `stop` at the fit's end."""

    def __init__(self) -> None:
        self._waits: Any = None  # compat.CollectiveWaits, made once (its variable outlives fits)
        self._peers: Peers | None = None
        self._record: Callable[..., None] | None = None
        self._fits = 0
        self._gathering: list[Future[None]] = []
        self._gatherer: ThreadPoolExecutor | None = None
        self._epoch_waits = self._epoch_started = self._last_sample = 0.0
        self._sampled = 0  # steps timed this epoch
        self._sampling = False

    @property
    def measuring(self) -> bool:
        return self._peers is not None

    def start(self, peers: Peers | None, jit_compile: bool, record: Callable[..., None] | None) -> None:
        """A fit begins: time this worker's all-reduces when it has peers and its steps run
        without XLA; `record(**fields)` (the chief's) writes an epoch's figures."""
        self._fits += 1
        self._peers, self._record = None, None
        if peers is None or jit_compile:
            return
        if self._waits is None:
            self._waits = compat.CollectiveWaits()
        if compat.time_collectives(self._waits):
            self._peers, self._record = peers, record

    def epoch_began(self) -> None:
        if self.measuring:
            self._epoch_waits, self._epoch_started, self._sampled = self._waits.seconds(), time.monotonic(), 0

    def step_began(self) -> None:
        """A step (an execution of steps) begins: timed when the last timed one is old enough."""
        if self.measuring and time.monotonic() - self._last_sample >= SAMPLE_SECONDS:
            self._last_sample, self._sampling = time.monotonic(), True
            self._waits.sample(True)

    def steps_ended(self, count: int) -> None:
        if self._sampling:
            self._sampling = False
            self._waits.sample(False)
            self._sampled += count

    def epoch_ended(self, epoch: int, steps: int, save_blocked: float) -> None:
        """Epoch `epoch` ended after `steps` steps on this worker (the chief: `save_blocked`
        seconds of them in saves): its figures to the chief, or (the chief) everyone's into the log."""
        if not self.measuring or steps <= 0 or self._sampled == 0:
            return
        peers = self._peers
        assert peers is not None
        waited = (self._waits.seconds() - self._epoch_waits) / self._sampled
        seconds = (time.monotonic() - self._epoch_started) / steps
        name = f"{_STEPS}/{self._fits}/{epoch}"
        if peers.task != peers.chief:
            peers.put_later(f"{name}/{peers.task}", round(waited, 6))
            return
        mine = {"epoch": epoch, "steps": steps, "step_seconds": round(seconds, 6), "chief": peers.task,
                "save_blocked": round(save_blocked / steps, 6)}
        self._gathering.append(self._background().submit(self._gather, peers, name, mine, round(waited, 6)))

    def stop(self, wait_seconds: float = 5.0) -> None:
        """The fit ended: stop timing; the chief waits up to `wait_seconds` for figures still coming."""
        if self._sampling:
            self._sampling = False
            self._waits.sample(False)
        compat.time_collectives(None)
        deadline = time.monotonic() + wait_seconds
        for gathering in self._gathering:
            try:
                gathering.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - a worker that never sent its figures: recorded without
                continue
        self._gathering.clear()
        self._peers = None

    def _gather(self, peers: Peers, name: str, mine: dict[str, Any], waited: float) -> None:
        """(The chief's background thread) every worker's figures of an epoch, into the run log."""
        workers = {peers.task: waited}
        for task in peers.others:
            theirs = peers.get(f"{name}/{task}", GATHER_SECONDS)
            if isinstance(theirs, (int, float)):
                workers[task] = float(theirs)
        record = self._record
        if record is not None:
            record(**mine, waited=workers)

    def _background(self) -> ThreadPoolExecutor:
        if self._gatherer is None:
            self._gatherer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kerasdist-step-times")
        return self._gatherer
