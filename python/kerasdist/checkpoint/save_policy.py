"""When the checkpoint callback saves and which checkpoints it keeps: the `CheckpointOptions`'
every_epoch / every_steps / every_seconds, keep, and keep_best by monitor and mode."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kerasdist.checkpoint.options import CheckpointOptions
from kerasdist.checkpoint.record import CheckpointInfo


class SavePolicy:
    """Decides, at a step end or an epoch end, whether to save; after a commit, which checkpoints
    pruning must spare (the best by `monitor`, when `keep_best`)."""

    def __init__(self, options: CheckpointOptions):
        self.options = options
        self.best: CheckpointInfo | None = None
        self._last_save_at = time.monotonic()  # every_seconds counts from here

    def begin(self, manager: Any) -> None:
        """A fit begins: time-based saves count from now; the best checkpoint is the manager's."""
        self._last_save_at = time.monotonic()
        self.best = manager.best(self.better) if self.options.keep_best else None

    def saving(self) -> None:
        """A save starts now (time-based saves count from it)."""
        self._last_save_at = time.monotonic()

    def due_at_step(self, global_step: Callable[[], int]) -> bool:
        """Whether a step end that is not its epoch's last saves: every `every_steps` optimizer
        steps (`global_step()`, read only then: a variable read per step costs), or
        `every_seconds` after the last save."""
        every_steps, every_seconds = self.options.every_steps, self.options.every_seconds
        return bool(every_steps and global_step() % every_steps == 0) or (
            every_seconds is not None and time.monotonic() - self._last_save_at >= every_seconds)

    def due_at_epoch_end(self) -> bool:
        return self.options.every_epoch

    def spared(self, committed: CheckpointInfo) -> tuple[CheckpointInfo | None, ...]:
        """After `committed`: what pruning keeps besides the `keep` newest (it, and the best)."""
        if self.options.keep_best and committed.step_in_epoch == 0 and self.better(committed, self.best):
            self.best = committed
        return self.best, committed

    def better(self, info: CheckpointInfo, best: CheckpointInfo | None) -> bool:
        """Whether `info`'s `monitor` value beats `best`'s (one without the value never does)."""
        monitor = self.options.monitor
        value = info.metrics.get(monitor)
        if value is None:
            return False
        if best is None or best.metrics.get(monitor) is None:
            return True
        return value < best.metrics[monitor] if self.options.mode == "min" else value > best.metrics[monitor]
