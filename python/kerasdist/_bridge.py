"""Helpers for the R front end (not public API)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any


def call_capturing_warnings(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Call fn and return (result, messages of the kerasdist warnings it raised), so R can
    re-raise them as R warnings instead of leaving them on Python's stderr."""
    from kerasdist.checkpoint import CheckpointWarning, RunLogWarning
    from kerasdist.data import ShortEpochWarning

    ours = (CheckpointWarning, RunLogWarning, ShortEpochWarning)
    with warnings.catch_warnings(record=True) as caught:
        for category in ours:
            warnings.simplefilter("always", category)
        result = fn(*args, **kwargs)
    messages = [str(w.message) for w in caught if issubclass(w.category, ours)]
    return result, messages


def at_r_exit() -> None:
    """What Python's exit handlers would do, for R, which ends without finalizing Python: the run
    logs' exit events, the other workers' temporary folders removed."""
    from kerasdist.checkpoint.run_log import close_logs
    from kerasdist.monitoring import remove_worker_folder

    close_logs()
    remove_worker_folder()


# The columns of R's checkpoint tables, in their order, each with the R type of its values:
# "time" is seconds since 1970 (UTC), what `CheckpointInfo.saved_at` holds, in both tables.
CHECKPOINT_TABLE_COLUMNS = {
    "path": "character", "global_step": "integer", "epoch": "integer", "step_in_epoch": "integer",
    "saved_at": "time", "size": "double", "writer": "character", "valid": "logical",
    "problem": "character", "restart": "logical",
}
CHECKPOINT_LIST_COLUMNS = ("path", "epoch", "step_in_epoch", "global_step", "saved_at", "size", "writer", "restart")

Column = tuple[str, str, list[Any]]


def checkpoint_columns(checkpoint_dir: str, *, storage_options: Any = None, every: bool = False) -> list[Column]:
    """R's `list_checkpoints()` (the valid checkpoints; the damaged ones warned about) or, with
    `every`, `checkpoint_table()` (valid or not), as columns: (name, R type, values); `restart`
    is True for the checkpoint a restart resumes from."""
    from kerasdist.checkpoint import checkpoint_table, list_checkpoints

    if every:
        rows = checkpoint_table(checkpoint_dir, storage_options=storage_options)
        for row in rows:
            row["saved_at"] = None if row["saved_at"] is None else datetime.fromisoformat(row["saved_at"]).timestamp()
        names: Sequence[str] = list(CHECKPOINT_TABLE_COLUMNS)
    else:
        infos = list_checkpoints(checkpoint_dir, storage_options=storage_options)
        rows = [{name: getattr(info, name) for name in CHECKPOINT_LIST_COLUMNS if name != "restart"}
                | {"restart": info is infos[-1]} for info in infos]
        names = CHECKPOINT_LIST_COLUMNS
    return _columns(rows, CHECKPOINT_TABLE_COLUMNS, names)


GOODPUT_COLUMNS = {"part": "character", "seconds": "double", "share": "double"}
ATTEMPT_COLUMNS = {
    "name": "character", "started": "time", "ended": "time", "status": "character", "restored_step": "integer",
    "first_step_at": "time", "last_step": "integer", "saves": "integer", "last_step_at": "time",
    "detection_seconds": "double", "recovery_seconds": "double", "workers": "integer",
    "redone_steps": "integer", "hang_seconds": "double", "hang_worker": "character", "hang_frame": "character",
}


def goodput_columns(report: Any) -> dict[str, list[Column]]:
    """R's `goodput()` tables as columns, (name, R type, values): `parts` (the report's rows: part,
    seconds, share) and `attempts` (one row per process start; its detection seconds, its
    recovery's total and, for one that hung, the hang's seconds, stuck worker and frame beside the
    `Attempt` fields)."""
    attempts = [{name: getattr(attempt, name) for name in ATTEMPT_COLUMNS if hasattr(attempt, name)}
                | {"detection_seconds": attempt.seconds.get("detection"),
                   "recovery_seconds": (attempt.recovery or {}).get("total")}
                | {f"hang_{name}": (attempt.hang or {}).get(name) for name in ("seconds", "worker", "frame")}
                for attempt in report.attempts]
    return {"parts": _columns(report.rows(), GOODPUT_COLUMNS), "attempts": _columns(attempts, ATTEMPT_COLUMNS)}


def _columns(rows: Sequence[dict[str, Any]], types: dict[str, str], names: Sequence[str] | None = None) -> list[Column]:
    return [(name, types[name], [row.get(name) for row in rows]) for name in (names or list(types))]
