"""How the checkpoint callback saves: on the training thread, or a snapshot taken there and the
files written and committed in the background (`background.py`); then pruned as the
`SavePolicy` says. The time the training thread waited goes into `blocked_seconds`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from kerasdist.checkpoint.background import BackgroundWriter
from kerasdist.checkpoint.manager import CheckpointManager
from kerasdist.checkpoint.record import CheckpointInfo, Progress
from kerasdist.checkpoint.save_policy import SavePolicy
from kerasdist.checkpoint.snapshot import SaveMemory, take_snapshot


class Saver:
    """Writes the checkpoints of one callback through its manager, one in flight at a time.

    Attributes:
        saved: the checkpoints committed, oldest first.
        blocked_seconds: per save, how long the training thread waited.
        on_committed: called with each committed checkpoint and the seconds its write took (in
            the writer's thread for background saves), before pruning: the run log's recorder.
        held_elsewhere: the checkpoints someone else holds on to (Ray Train's reported ones,
            `ray_reporter.RayReporter`), which pruning spares.
    """

    def __init__(self, manager: CheckpointManager, policy: SavePolicy):
        self.manager = manager
        self.policy = policy
        self.saved: list[CheckpointInfo] = []
        self.blocked_seconds: list[float] = []
        self.on_committed: Callable[[CheckpointInfo, float], None] | None = None
        self.held_elsewhere: Callable[[], Iterable[CheckpointInfo]] = tuple
        self._writer = BackgroundWriter()
        # the copies of the values (and the file's buffer where files are not built as pieces),
        # reused from one background save to the next: memory this VM took back after a save freed
        # it costs seconds a GB to touch again (bench/README.md, "Checkpoints at the size people train")
        self._memory = SaveMemory()

    @property
    def busy(self) -> bool:
        """Whether a background save is being written."""
        return self._writer.busy

    def begin(self) -> None:
        """A fit begins: wait for a save a fit that raised left behind; count from now."""
        self.wait()
        self._writer.restart_clock()

    def prepare(self, model: Any) -> None:
        """Before the first save of a fit (on the chief, after its first step): the memory its
        saves reuse, sized for `model` and touched in a thread while training goes on (none for
        synchronous saves that build their files as pieces)."""
        self._memory.prepare(model, values=self.policy.options.async_save)

    def wait(self) -> None:
        """Wait for the background save in flight, if any; raise `BackgroundSaveError` if it (or
        one before it) failed."""
        self._writer.wait()

    def end(self) -> None:
        """Wait for the save in flight, then give back the snapshots' memory (also if it failed)."""
        try:
            self.wait()
        finally:
            self._memory.release()

    def save(self, model: Any, progress_now: Callable[[], Progress], in_background: bool) -> None:
        """Save `model` at `progress_now()` (made here: its time counts as blocked): snapshot now
        and write in the background, or (after the save in flight) write here."""
        started = time.perf_counter()
        try:
            progress = progress_now()
            if in_background:
                self._save_in_background(model, progress)
            else:
                self.wait()
                self._committed(*_timed(lambda: self.manager.save(model, progress, memory=self._memory)))
        finally:
            self.blocked_seconds.append(time.perf_counter() - started)

    def _save_in_background(self, model: Any, progress: Progress) -> None:
        self.wait()  # at most one in flight; its error is raised here
        self.manager.create()  # an unwritable directory fails here, on the training thread
        taken = take_snapshot(model, self._memory)
        self._writer.submit(
            lambda: self._committed(*_timed(lambda: self.manager.commit(taken, progress))),
            f"checkpoint ckpt-{taken.global_step} in {self.manager.directory}",
        )

    def _committed(self, info: CheckpointInfo, seconds: float) -> None:
        """After a checkpoint is committed (having taken `seconds`): note it, then prune."""
        if self.on_committed is not None:
            self.on_committed(info, seconds)
        self.saved.append(info)
        self.manager.prune(self.policy.options.keep, protect=(*self.policy.spared(info), *self.held_elsewhere()))


def _timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    return call(), time.perf_counter() - started
