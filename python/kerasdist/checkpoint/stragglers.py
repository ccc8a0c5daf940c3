"""Naming a straggler from every worker's step times (`run_log.Event.STEP_TIMES`, recorded by
`step_times.StepTimes`): the worker the others persistently waited for in the all-reduces, how much
slower it was and the share of the training they spent waiting. Pure functions of the records, so
the live figures (`run_log.AttemptCounts.straggler`) and `kerasdist.goodput` agree."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A worker counts as an epoch's straggler when the others waited at least this long per step for
# it, and this share of a step; as the run's, when it was in this share of the epochs recorded.
STRAGGLER_MIN_SECONDS = 0.002
STRAGGLER_MIN_SHARE = 0.05
STRAGGLER_PERSISTENCE = 2 / 3


@dataclass(frozen=True)
class Straggler:
    """A worker whose steps are persistently slower than the others' (`straggler_of`).

    Attributes:
        worker: its task, e.g. "worker:1".
        slower_seconds: how much longer its part of a step took than the others' (the mean, over
            the epochs it was the slowest, of the seconds a step of the others waited for it).
        slower_ratio: the others' step time over what it would be without the wait (1.9: its pace
            made each step 1.9 times as long).
        waiting_share: the share of the training the other workers spent waiting for it.
        epochs: the epochs it was the slowest in; of_epochs: the epochs recorded.
    """

    worker: str
    slower_seconds: float
    slower_ratio: float
    waiting_share: float
    epochs: int
    of_epochs: int

    def __str__(self) -> str:
        return (f"{self.worker}: {self.slower_seconds * 1000:.1f} ms a step slower than the others "
                f"({self.slower_ratio:.2f}x their pace); they spent {self.waiting_share:.0%} of the training "
                f"waiting for it (the slowest in {self.epochs} of {self.of_epochs} epochs)")


def straggler_of(records: list[Mapping[str, Any]]) -> Straggler | None:
    """The straggler that STEP_TIMES events' fields `records` show, or None. In each epoch the
    worker that waited least in the all-reduces is the one the others waited for; it is that
    epoch's straggler when the others' median wait, less its own (and less the chief's save
    blocking, which the others waited for too), is at least `STRAGGLER_MIN_SECONDS` and
    `STRAGGLER_MIN_SHARE` of a step; the run's, when it is so in `STRAGGLER_PERSISTENCE` of the
    epochs."""
    lateness: dict[str, list[float]] = {}
    waited_seconds = trained_seconds = 0.0
    usable = 0
    for record in records:
        waits = _own_waits(record)
        if len(waits) < 2:
            continue
        usable += 1
        steps, step_seconds = int(record["steps"]), float(record["step_seconds"])
        slowest = min(waits, key=lambda task: (waits[task], task))
        late = statistics.median(w for task, w in waits.items() if task != slowest) - waits[slowest]
        trained_seconds += steps * step_seconds
        if late >= STRAGGLER_MIN_SECONDS and late >= STRAGGLER_MIN_SHARE * step_seconds:
            lateness.setdefault(slowest, []).append(late)
            waited_seconds += steps * late
    if not lateness:
        return None
    worker, lates = max(lateness.items(), key=lambda item: len(item[1]))
    if len(lates) < STRAGGLER_PERSISTENCE * usable:
        return None
    slower = statistics.fmean(lates)
    step = trained_seconds / sum(int(r["steps"]) for r in records if len(_own_waits(r)) >= 2)
    share = waited_seconds / trained_seconds if trained_seconds > 0 else 0.0
    return Straggler(worker, slower, step / max(step - slower, 1e-9), share, len(lates), usable)


def _own_waits(record: Mapping[str, Any]) -> dict[str, float]:
    """Per worker, the seconds a step waited in all-reduces for the others: the chief's save
    blocking taken out of the other workers' (they waited for the chief's saves as well)."""
    waited = record.get("waited") or {}
    blocked = float(record.get("save_blocked") or 0.0)
    chief = record.get("chief")
    return {task: max(0.0, float(w) - (0.0 if task == chief else blocked)) for task, w in waited.items()}
