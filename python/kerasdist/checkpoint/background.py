"""Background checkpoint saves: training waits only while the state is snapshot, the files are
written and committed in a thread.

A save in the background is two halves. On the training thread, between steps, the callback
takes a `snapshot.Snapshot` of the model (`take_snapshot`: tens of milliseconds for a
5M-parameter model, against a few hundred for a whole save) and its `record.Progress`. In a
`BackgroundWriter` thread, the job makes the files from the snapshot and commits them as a
synchronous save does (`CheckpointManager.commit`: through the store, the record last), then
prunes: pruning happens only after the new checkpoint is committed, as in a synchronous save.

What the writer guarantees:
- At most one save in flight: `submit` waits for the previous one first.
- A crash (even SIGKILL) during a background write leaves the checkpoints already committed and,
  at worst, a temporary directory that the next start deletes: the commit is the rename.
- Errors are never swallowed: a failed job's exception is raised by the next `wait` (the next
  save, the end of `fit`, a preemption save) as a `BackgroundSaveError` naming the checkpoint,
  chained to the original (and kept as its `error`). One that no `wait` ever collects (the program ended another way) is
  printed to stderr when the writer is collected or the interpreter exits.
- The thread is not a daemon: an interpreter that exits normally finishes the write first.
- While training runs, the writer takes only CPU time training leaves idle (Linux's SCHED_IDLE
  class: a training step keeps every core busy in lockstep, so a writer competing as an equal
  stretches each step it overlaps by about the write's own CPU time; bench/README.md,
  "Checkpoints"). It is raised back to normal priority once anything waits for it
  (the next save, the end of `fit`, a preemption), or once half the time between the last two
  saves has passed: where training leaves no core idle (one core, or every core busy), a writer
  kept idle would barely run, and the next save would wait for the whole write.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any


class BackgroundSaveError(RuntimeError):
    """A checkpoint saved in the background failed; the checkpoints committed before it are intact.

    `error` is the original exception (also the `__cause__`, unless Keras's traceback filtering
    in `fit` dropped it on the way out)."""

    def __init__(self, message: str, error: BaseException) -> None:
        super().__init__(message)
        self.error = error


_writers: weakref.WeakSet[BackgroundWriter] = weakref.WeakSet()


def wait_for_all() -> None:
    """Wait for every background save of this process (each writer's `wait`, errors raised):
    for code that must know its checkpoints are on disk, e.g. before it stops the process."""
    for writer in list(_writers):
        writer.wait()


class BackgroundWriter:
    """Runs save jobs in a thread, one at a time; `wait` raises a failed job's error."""

    def __init__(self, name: str = "kerasdist-checkpoint") -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._priority = _IdleWhileUnwaited()
        self._raise_later: threading.Timer | None = None
        self._last_submit = time.monotonic()
        self._failures: list[tuple[str, BaseException]] = []  # (what failed, error), not yet raised
        self._finalizer = weakref.finalize(self, _report_unraised, self._failures)
        _writers.add(self)

    @property
    def busy(self) -> bool:
        """Whether a job is running."""
        return self._thread is not None and self._thread.is_alive()

    def restart_clock(self) -> None:
        """Count the time to the next save from now (training begins)."""
        self._last_submit = time.monotonic()

    def submit(self, job: Callable[[], Any], what: str) -> None:
        """Wait for the job in flight (raising its error), then start `job` (`what` names it in
        errors, e.g. "checkpoint ckpt-120 in /runs/a"), idle until half the time since the last
        submit (or `restart_clock`) has passed again."""
        self.wait()
        now = time.monotonic()
        patience, self._last_submit = (now - self._last_submit) / 2, now
        priority = _IdleWhileUnwaited()
        thread = threading.Thread(target=self._run, args=(job, what, priority), name=self.name, daemon=False)
        self._thread, self._priority = thread, priority
        self._raise_later = threading.Timer(patience, priority.waited_for)
        self._raise_later.daemon = True
        thread.start()
        self._raise_later.start()

    def wait(self) -> None:
        """Block until no job runs; raise `BackgroundSaveError` if one failed since the last wait."""
        thread = self._thread
        if thread is not None:
            self._priority.waited_for()
            thread.join()
            self._thread = None
        if self._raise_later is not None:
            self._raise_later.cancel()
            self._raise_later = None
        if self._failures:
            what, error = self._failures.pop(0)
            self._failures.clear()
            raise BackgroundSaveError(
                f"The background save of {what} failed: {type(error).__name__}: {error}. The "
                "checkpoints saved before it are intact.", error,
            ) from error

    def _run(self, job: Callable[[], Any], what: str, priority: _IdleWhileUnwaited) -> None:
        priority.lower_until_waited_for()
        try:
            job()
        except BaseException as error:  # handed to the training thread by wait()
            self._failures.append((what, error))
        finally:
            priority.waited_for()


class _IdleWhileUnwaited:
    """One job's CPU priority: SCHED_IDLE from its start until somebody waits for it (or the
    writer's timer stands in for the next save), then normal.

    Where the class is missing (not Linux) or refused (a sandbox), the thread keeps its priority."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a wait between the writer's check and its lowering must not be lost
        self._waited = False
        self._lowered_thread: int | None = None

    def lower_until_waited_for(self) -> None:
        """In the writer thread, first thing."""
        with self._lock:
            if not self._waited and _set_policy(0, getattr(os, "SCHED_IDLE", None)):
                self._lowered_thread = threading.get_native_id()

    def waited_for(self) -> None:
        """Normal priority from now on. Called by a thread about to wait for the job, by the
        writer's timer halfway to the next save, and by the job as it ends, so that nothing later
        sets the policy of a thread id the system may have reused."""
        with self._lock:
            self._waited = True
            if self._lowered_thread is not None:
                _set_policy(self._lowered_thread, getattr(os, "SCHED_OTHER", None))
                self._lowered_thread = None


def _set_policy(thread_id: int, policy: int | None) -> bool:
    """Linux's scheduling `policy` for the thread `thread_id` (0: the calling one); False where it
    cannot be set."""
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return False
    try:
        os.sched_setscheduler(thread_id, policy, os.sched_param(0))
    except OSError:  # forbidden here, or the thread has already ended
        return False
    return True


def _report_unraised(failures: list[tuple[str, BaseException]]) -> None:
    """At collection or exit: print the failures no `wait` raised, so none goes unseen."""
    for what, error in failures:
        print(f"kerasdist: the background save of {what} failed and was never waited for:", file=sys.stderr)
        traceback.print_exception(error, file=sys.stderr)
    failures.clear()

