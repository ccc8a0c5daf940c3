"""Helpers for the R front end (not public API)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
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
