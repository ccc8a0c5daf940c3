"""The run log's recorder: what the checkpoint callback sees during a fit (the restores before it,
its begin, step ends, saves, commits, validation, every worker's step times, a hang, its end)
written as the chief's run-log events (`run_log.Event`), and the run's figures for TensorBoard
from the recorder's own counts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from kerasdist.checkpoint.record import CheckpointInfo
from kerasdist.checkpoint.run_log import Event, RunLog, Status, run_log_for


class RunRecorder:
    """One callback's events in its store's run log, from `open` (the chief, at a fit's begin) to
    `close`; every method does nothing while no log is open (other workers, between fits)."""

    def __init__(self) -> None:
        self.log: RunLog | None = None
        self._last_log: RunLog | None = None  # the log of the last fit: a hang between two fits goes there
        self._store: Any = None
        self._first_step_logged = False
        self._eval_started: float | None = None
        self._epoch_started = 0.0  # perf_counter time
        self._epoch_blocked = 0.0  # seconds saves blocked training this epoch

    @property
    def is_open(self) -> bool:
        return self.log is not None

    @property
    def epoch_blocked(self) -> float:
        """Seconds saves blocked training this epoch."""
        return self._epoch_blocked

    def open(self, store: Any, context: Any, managers: Iterable[Any], step_of: Callable[[], int]) -> None:
        """The chief's run log in `store`: the restores the `managers` made since the last fit,
        then this fit's begin at `step_of()`, which it follows."""
        self.log, self._store = run_log_for(store, context), store
        self._last_log = self.log
        for manager in managers:
            for finished, seconds, info in manager.restores:
                self.log.event(Event.RESTORED, at=finished, seconds=round(seconds, 4),
                               checkpoint=store.entry_of(info.path) if info else None,
                               step=info.global_step if info else 0)
            manager.restores.clear()
        self._first_step_logged = False
        self.log.event(Event.TRAIN_BEGIN, step=step_of())
        self.log.follow_steps(step_of)

    def steps_ended(self, count: int, step_of: Callable[[], int]) -> None:
        """`count` more steps ended (on disk now: exact after a SIGKILL); the fit's first is an event."""
        if self.log is None:
            return
        self.log.steps_ended(count)
        if not self._first_step_logged:
            self._first_step_logged = True
            self.log.event(Event.FIRST_STEP, step=step_of())

    def step_began(self) -> None:
        """The next step begins (its record: a failure before its end leaves it to redo)."""
        if self.log is not None:
            self.log.step_began()

    def epoch_began(self) -> None:
        self._epoch_started, self._epoch_blocked = time.perf_counter(), 0.0

    def saved(self, step: int, blocked: float) -> None:
        """A save at `step` left the training thread after `blocked` seconds."""
        self._epoch_blocked += blocked
        if self.log is not None:
            self.log.event(Event.SAVE, step=step, blocked=round(blocked, 4))

    def committed(self, info: CheckpointInfo, seconds: float) -> None:
        """`info` was committed, its write having taken `seconds` (the writer's thread, maybe)."""
        log = self.log
        if log is not None:
            log.event(Event.COMMITTED, step=info.global_step, checkpoint=self._store.entry_of(info.path),
                      write=round(seconds, 4), bytes=info.size)

    def eval_began(self) -> None:
        self._eval_started = time.perf_counter()

    def eval_ended(self) -> None:
        if self.log is not None and self._eval_started is not None:
            self.log.event(Event.EVAL, seconds=round(time.perf_counter() - self._eval_started, 4))
        self._eval_started = None

    def step_times(self, **fields: Any) -> None:
        """An epoch's steps on every worker (`step_times.StepTimes`, maybe from another thread)."""
        log = self.log
        if log is not None:
            log.event(Event.STEP_TIMES, **fields)

    def hung(self, **fields: Any) -> None:
        """The step watchdog found the fit hung (from its thread; the process exits 77 next, without
        its exit handlers: the log is closed here), also between a trainer's two fits."""
        log = self.log or self._last_log
        if log is not None:
            log.event(Event.HANG, **fields)
            log.close()

    def stacks_file(self) -> int | None:
        """The file the watchdog's backstop dumps into on the chief (`RunLog.stacks_file`)."""
        return self.log.stacks_file() if self.log is not None else None

    def figures(self, batches: int) -> dict[str, Any]:
        """The epoch's figures: seconds per step (over `batches`), seconds saves blocked training,
        this attempt's goodput so far (the log's counts: productive time over the time since the
        process started) and, under a multi-worker strategy, each worker's seconds a step waited
        for the others (the last epoch gathered) and the straggler, if any, named (text)."""
        figures: dict[str, Any] = {"step_seconds": (time.perf_counter() - self._epoch_started) / max(batches, 1),
                                   "save_blocked_seconds": self._epoch_blocked}
        if self.log is not None:
            counts = self.log.counts
            figures["goodput"] = counts.goodput(self.log.started, time.time())
            if counts.step_times:
                for task, waited in (counts.step_times[-1].get("waited") or {}).items():
                    figures[f"waited_seconds/{task.replace(':', '_')}"] = float(waited)
            straggler = counts.straggler()
            if straggler is not None:
                figures["straggler_slower_seconds"] = straggler.slower_seconds
                figures["straggler_waiting_share"] = straggler.waiting_share
                figures["straggler"] = str(straggler)
        return figures

    def close(self, ended: bool, status: Status, step_of: Callable[[], int]) -> None:
        """The fit's end; one whose last save failed (`ended` False) did not end: its attempt
        reads as crashed, by its exit event."""
        if self.log is not None:
            broken = status is Status.PEER_LOST
            self.log.stop_following(recount=not broken)
            if ended:
                step = self.log.last_step if broken and self.log.last_step is not None else step_of()
                self.log.event(Event.TRAIN_END, step=step, status=status.value)
            self.log = None
