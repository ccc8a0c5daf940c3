"""What a process ends with when it cannot go on: status 75 when preempted (during a fit, after
saving), 76 when a peer of its multi-worker cluster was lost, 77 when it stopped stepping (its
step watchdog fired: `checkpoint/watchdog.py`)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

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

    @property
    def message(self) -> str:
        """What happened and what to do, one sentence (R's `kerasdist_preempted` message)."""
        return (f"Preempted (SIGTERM): saved checkpoint {self.checkpoint or '(none)'}; "
                "run the same call again to continue.")


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


PEER_LOST_EXIT_CODE = 76  # "a peer was lost; my state is safe": restart the group, on the hosts left

# TensorFlow's words when a collective's peer is gone: its connection reset or refused (a process
# killed), or the coordination service's heartbeat missed (a host down; a worker cut off from the
# network sees its own heartbeat's deadline exceeded).
_PEER_LOST_WORDS = re.compile(r"Collective ops is aborted|Connection reset by peer|Connection refused|"
                              r"failed to connect|Socket closed|unhealthy|stopped sending heartbeats")
# A peer that came back before this worker's collective noticed it was gone (a warm restart in
# place takes seconds): its new server knows none of the old groups (FAILED_PRECONDITION).
_PEER_RESTARTED = re.compile(r"(not found|failed to resolve)\. This normally means the server has restarted")
_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


HUNG_EXIT_CODE = 77  # "no training step for hang_timeout": restart the group, like any failure
# A process whose watchdog thread cannot run (C code holding the GIL) is ended by the signal's
# default action instead (`checkpoint/watchdog.py`'s backstop): status -14, 142 in a shell.
HANG_BACKSTOP_SIGNAL = signal.SIGALRM
_ending_hung = threading.Event()  # the step watchdog fired: this process ends with 77


def end_hung() -> None:
    """The step watchdog fired and is ending the process with 77: from now on an error for a lost
    peer (the peers' watchdogs end theirs at the same time) waits for that instead of exiting 76."""
    _ending_hung.set()


def _wait_if_ending_hung() -> None:
    """Block for good when the watchdog is ending the process (it calls `os._exit(77)` shortly)."""
    if _ending_hung.is_set():
        threading.Event().wait()


class PeerLostExit(SystemExit):
    """Raised when a multi-worker fit stopped because another worker of the cluster disappeared
    (its process killed, its host down, or already a new process whose server knows none of the
    old collectives): the process exits with 76, and code that catches it (R's
    front end, a notebook) learns which peer. Nothing is saved then: the newest checkpoint is
    intact, and a restart of the group (on the workers left) resumes from it.

    Attributes:
        code: 76 (`PEER_LOST_EXIT_CODE`), the exit status.
        peer: the task TensorFlow named, as "worker:1", or None when it named none.
        detail: TensorFlow's own words, one line.
    """

    def __init__(self, peer: str | None, detail: str) -> None:
        super().__init__(PEER_LOST_EXIT_CODE)
        self.peer = peer
        self.detail = detail

    @property
    def message(self) -> str:
        """What happened and what to do, one sentence (R's `kerasdist_peer_lost` message)."""
        return (f"{self.peer or 'A peer'} of this multi-worker cluster was lost ({self.detail}); "
                "the newest checkpoint is intact: restart the group to resume.")

    def __str__(self) -> str:
        said = self.message if self.peer else "a" + self.message[1:]
        return f"kerasdist: {said} Exiting with {self.code}."


def peer_lost(error: BaseException, num_workers: int, task: str | None = None) -> PeerLostExit | None:
    """The `PeerLostExit` that TensorFlow's `error` stands for in a cluster of `num_workers` seen
    from `task` (e.g. "worker:0"), or None when it is not a lost peer (one worker; another error)."""
    from tensorflow import errors

    lost_kinds = (errors.UnavailableError, errors.AbortedError, errors.CancelledError, errors.InternalError,
                  errors.DeadlineExceededError)
    message = str(error)
    gone = isinstance(error, lost_kinds) and _PEER_LOST_WORDS.search(message)
    restarted = isinstance(error, errors.FailedPreconditionError) and _PEER_RESTARTED.search(message)
    if num_workers < 2 or not (gone or restarted):
        return None
    cause = next((line.strip() for line in message.splitlines()
                  if _PEER_LOST_WORDS.search(line) or _PEER_RESTARTED.search(line)), "")
    # The peer is the remote target TensorFlow names, else a task other than this one (the
    # message also names this task's own devices).
    remote = _TASK.search(message, message.find("remote target")) if "remote target" in message else None
    others = [f"{kind}:{index}" for kind, index in _TASK.findall(message) if f"{kind}:{index}" != task]
    peer = f"{remote[1]}:{remote[2]}" if remote else (others[0] if others else None)
    return PeerLostExit(peer, cause)


def exit_when_peer_lost(num_workers: int, task: str | None) -> None:
    """For the rest of a multi-worker process: an error for a lost peer that nothing caught (raised
    outside a fit: while the model is built, between fits) ends the process with 76, said on
    stderr, not with 1 and a traceback (the scheduler's recipe reads 1 as a crash of the user's
    code). Other errors go to the hook that was there."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        lost = peer_lost(error, num_workers, task) if isinstance(error, Exception) else None
        if lost is None:
            previous(kind, error, trace)
            return
        _wait_if_ending_hung()
        sys.stderr.write(f"{lost}\n")
        sys.stderr.flush()
        os._exit(PEER_LOST_EXIT_CODE)  # TensorFlow's exit handlers may wait for the peer that is gone

    sys.excepthook = hook


@contextlib.contextmanager
def exit_on_lost_peer(num_workers: int, task: str | None, on_lost: Callable[[], None] | None = None) -> Iterator[None]:
    """Around a multi-worker fit: TensorFlow's error for a lost peer becomes `PeerLostExit`
    (status 76), said on stderr, after `on_lost` (the checkpoint callback's end of the fit)."""
    try:
        yield
    except Exception as err:
        lost = peer_lost(err, num_workers, task)
        if lost is None:
            raise
        _wait_if_ending_hung()
        if on_lost is not None:
            on_lost()
        sys.stderr.write(f"{lost}\n")
        sys.stderr.flush()
        raise lost from None
