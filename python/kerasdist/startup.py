"""What happens once, when kerasdist is imported: TensorFlow starts quietly, logical CPU
devices asked for before the import (by R's simulate_devices) are set up in time, and the
process's exit skips the interpreter's last garbage collections.

TensorFlow 2.21 writes its start-up lines ("All log messages before absl::InitializeLog() ...",
"oneDNN custom operations are on ...", "cpu_feature_guard ...") to file descriptor 2 while it is
imported, whatever TF_CPP_MIN_LOG_LEVEL says. They reach every console, R's included, so the
import runs with descriptor 2 captured and only those lines are dropped; anything else it writes
(a real warning or error) is passed on. KERASDIST_VERBOSE=1 keeps them all.
"""

from __future__ import annotations

import atexit
import gc
import os
import re
import sys
import tempfile

VERBOSE_VARIABLE = "KERASDIST_VERBOSE"

_START_UP_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} [\d:. ]+\d+ port\.cc:\d+\] oneDNN custom operations are on"
    r"|I\d{4} [\d:. ]+\d+ cpu_feature_guard\.cc:\d+\] "
    r"|To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.)"
)


def verbose() -> bool:
    return os.environ.get(VERBOSE_VARIABLE, "").lower() in ("1", "true", "yes")


def import_tensorflow_quietly() -> None:
    """Import TensorFlow (and through it Keras) with its start-up lines left out."""
    if "tensorflow" in sys.modules or verbose():
        import tensorflow  # noqa: F401
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # INFO lines only; warnings stay
    with tempfile.TemporaryFile(mode="w+b") as captured:
        saved = _redirect_stderr(captured.fileno())
        try:
            import tensorflow  # noqa: F401
        finally:
            _restore_stderr(saved)
            captured.seek(0)
            _pass_on(captured.read().decode("utf-8", errors="replace"))


def _redirect_stderr(target: int) -> int | None:
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(target, 2)
        return saved
    except (OSError, ValueError, AttributeError):  # no descriptor 2 (embedded or closed)
        return None


def _restore_stderr(saved: int | None) -> None:
    if saved is None:
        return
    try:
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    os.dup2(saved, 2)
    os.close(saved)


def is_start_up_noise(line: str) -> bool:
    """Whether `line` is one of TensorFlow's start-up lines (never, under KERASDIST_VERBOSE=1).
    The launcher drops them from its workers' output too: a worker script that imports
    TensorFlow before kerasdist prints them whatever TF_CPP_MIN_LOG_LEVEL says."""
    return not verbose() and bool(_START_UP_NOISE.match(line))


def _pass_on(text: str) -> None:
    kept = [line for line in text.splitlines() if line.strip() and not is_start_up_noise(line)]
    if kept:
        sys.stderr.write("\n".join(kept) + "\n")
        sys.stderr.flush()


def exit_without_last_collections() -> None:
    """At the interpreter's exit, after this process's exit handlers: freeze the objects instead
    of collecting them. With TensorFlow loaded, Python's last collections walk every object it
    made, about a second of CPU at each exit (RELIABILITY.md), which a restart waits for (a worker
    whose peer was lost, a preempted task). Python never promises finalizers at exit; everything
    kerasdist writes is closed before, and objects outside reference cycles are still freed."""
    atexit.register(gc.freeze)
