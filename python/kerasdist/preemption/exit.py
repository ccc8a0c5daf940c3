"""What a preempted process ends with: status 75, and during a fit what it saved."""

from __future__ import annotations

import os
import sys

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "preempted, restart me"; schedulers' recipes requeue on it


class PreemptedExit(SystemExit):
    """Raised when a fit stopped on SIGTERM after saving: the process exits with 75, and code that
    catches it (R's front end, a notebook) reads what was saved instead of working it out.

    Attributes:
        code: 75 (`PREEMPTED_EXIT_CODE`), the exit status.
        checkpoint: the path or URL of the checkpoint this process saved, or None where another
            process writes them (a worker that is not the chief).
        global_step: the training step the checkpoint holds, on every worker.
    """

    def __init__(self, checkpoint: str | None = None, global_step: int | None = None) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)
        self.checkpoint = checkpoint
        self.global_step = global_step


def exit_preempted(signum: int | None = None, frame: object = None) -> None:
    """SIGTERM outside training: say why, flush what was printed, and end the process with 75
    without running exit handlers (TensorFlow's may wait for tasks that are gone)."""
    try:
        sys.stdout.flush()
        sys.stderr.write("kerasdist: SIGTERM outside training, nothing to save: exiting with 75.\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    os._exit(PREEMPTED_EXIT_CODE)
