"""The table of every checkpoint in a store, valid or not: what `kerasdist checkpoints` prints and
R's `checkpoint_table()` makes a data frame of."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from kerasdist.checkpoint.layout import step_of
from kerasdist.checkpoint.manager import CheckpointManager
from kerasdist.checkpoint.record import CheckpointInfo, CheckpointWarning


def checkpoint_table(checkpoint_dir: str | os.PathLike[str], *,
                     storage_options: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every checkpoint in `checkpoint_dir`, valid or not, oldest first, as plain rows (what
    `kerasdist checkpoints` prints and R's `checkpoint_table()` makes a data frame of).

    Each row: `path`, `global_step`, `epoch`, `step_in_epoch`, `saved_at` (ISO 8601, UTC), `size`
    (bytes), `writer`, `valid`, `problem` (why a damaged or partial one cannot be used, else None)
    and `restart` (True for the one a restart would resume from). A damaged checkpoint's step is
    read from its name, its other fields are None. Reads only; warns about nothing.
    """
    manager = CheckpointManager(checkpoint_dir, storage_options=storage_options, create=False)
    if manager.store.is_local and not manager.directory.is_dir():
        raise ValueError(f"checkpoint_dir {str(checkpoint_dir)!r} does not exist (or is not a directory).")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        valid = manager.checkpoints()
    rows = [_row_of(info, restart=info is valid[-1]) for info in valid]
    rows += [_damaged_row(path, problem) for path, problem in manager.damaged().items()]
    return sorted(rows, key=lambda row: (row["global_step"] if row["global_step"] is not None else -1,
                                         row["valid"], row["path"]))


def _row_of(info: CheckpointInfo, restart: bool) -> dict[str, Any]:
    saved_at = None if info.saved_at is None else \
        datetime.fromtimestamp(info.saved_at, timezone.utc).isoformat(timespec="seconds")
    return {"path": info.path, "global_step": info.global_step, "epoch": info.epoch,
            "step_in_epoch": info.step_in_epoch, "saved_at": saved_at, "size": info.size,
            "writer": info.writer, "valid": True, "problem": None, "restart": restart}


def _damaged_row(path: str, problem: str) -> dict[str, Any]:
    return {"path": path, "global_step": step_of(path.rstrip("/").rsplit("/", 1)[-1]), "epoch": None,
            "step_in_epoch": None, "saved_at": None, "size": None, "writer": None, "valid": False,
            "problem": problem, "restart": False}
