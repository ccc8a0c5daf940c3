"""The run log: when each process of a run started, restored, took its first step, saved, evaluated
and ended, kept beside the checkpoints for `kerasdist.goodput` to turn into what failures cost.

Each process start of the chief (an "attempt") writes `runs/<attempt>.jsonl` in the checkpoint
directory or bucket, one JSON event per line, rewritten whole at each event (a few per save), and
`runs/<attempt>.step`, the newest training step and its time, rewritten by a thread at most once a
second (every 5 s on an object store) so that a run killed without warning still says how far it
got. The log goes through the checkpoint store but never in a checkpoint's way: it is not a
checkpoint entry, nothing reads it to restore, and a failed write warns once (`RunLogWarning`)
and stops the log, never training or a save.

Events (`t` is Unix time; every event has it):
    start (t = the process's own start time, from /proc; host, pid, task, workers, strategy),
    imported (kerasdist, and with it TensorFlow, imported), ready (the strategy and its cluster
    formed), restored (checkpoint or null, step, seconds),
    train_begin (step), first_step (step), save (step, blocked: seconds the training thread
    waited), committed (step, checkpoint, write seconds, bytes), eval (seconds), train_end (step,
    status "completed" or "preempted"), exit (the interpreter ended by itself; local logs only).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from kerasdist.checkpoint.layout import RUN_LOG_SUFFIX, RUN_STEP_SUFFIX

_IMPORTED_AT = time.time()


class RunLogWarning(UserWarning):
    """The run log could not be written; training and checkpoints go on without it."""


def process_started_at() -> float:
    """Unix time this process started (Linux: from /proc; elsewhere the time kerasdist was imported)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22, starttime: clock ticks after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


class RunLog:
    """One attempt's log in one checkpoint directory (see the module docstring); `run_log_for`
    gives the one of a store, made on its first use in this process."""

    def __init__(self, store: Any, heartbeat_seconds: float):
        started = process_started_at()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started)) + f"{started % 1:.3f}"[1:]
        self.attempt = f"{stamp}Z-{socket.gethostname()}-{os.getpid()}"
        self.started = started
        self.store = store
        self.heartbeat_seconds = heartbeat_seconds
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._broken = False
        self._step_of: Any = None  # a function giving the current step, while training
        self._written_step: int | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def event(self, name: str, at: float | None = None, **fields: Any) -> None:
        """Add an event (at `at`, default now) and write the log."""
        line = json.dumps({"event": name, "t": round(time.time() if at is None else at, 3), **fields})
        with self._lock:
            if self._broken:
                return
            self._lines.append(line)
            self._write(RUN_LOG_SUFFIX, "\n".join(self._lines) + "\n")

    def follow_steps(self, step_of: Any) -> None:
        """Write `step_of()` (the training step) every heartbeat until `stop_following`."""
        self._step_of = step_of
        if self._thread is None or not self._thread.is_alive():
            self._wake = threading.Event()  # its own: a thread that outlived a join still stops
            self._thread = threading.Thread(target=self._beat, args=(self._wake,), name="kerasdist-run-log",
                                            daemon=True)
            self._thread.start()

    def stop_following(self) -> None:
        """Write the step once more, then stop the heartbeat."""
        thread, self._thread = self._thread, None
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        self._write_step()
        self._step_of = None

    def forget_steps(self) -> None:
        """Stop the heartbeat without writing."""
        self._step_of = None
        self._wake.set()

    def _beat(self, wake: threading.Event) -> None:
        while not wake.wait(self.heartbeat_seconds):
            self._write_step()

    def _write_step(self) -> None:
        step_of = self._step_of
        if step_of is None:
            return
        try:
            step = int(step_of())
        except Exception:  # noqa: BLE001 - a model being torn down: the last step written stands
            return
        with self._lock:
            if step != self._written_step and not self._broken:
                self._write(RUN_STEP_SUFFIX, json.dumps({"t": round(time.time(), 3), "step": step}))
                self._written_step = step

    def _write(self, suffix: str, text: str) -> None:
        try:
            self.store.write_run_file(self.attempt + suffix, text.encode())
        except Exception as err:  # noqa: BLE001 - the log never stops training or a save
            self._broken = True
            warnings.warn(RunLogWarning(
                f"kerasdist: the run log in {self.store.location} could not be written ({err}); training "
                "and checkpoints go on, and goodput() will not see the rest of this run."), stacklevel=3)


_LOGS: list[RunLog] = []


def run_log_for(store: Any, context: Any) -> RunLog:
    """This process's log in `store`'s directory; on its first use, the start, imported and ready
    events (`context`: the `RunContext` training runs in)."""
    log = next((log for log in _LOGS if log.store.same_as(store)), None)
    if log is None:
        log = RunLog(store, heartbeat_seconds=1.0 if isinstance(store.directory, Path) else 5.0)
        if not _LOGS:  # the first log since the last close_logs
            atexit.register(close_logs)
        _LOGS.append(log)
        log.event("start", at=log.started, host=socket.gethostname(), pid=os.getpid(), task=context.task,
                  workers=context.num_workers, replicas=context.num_replicas, strategy=context.kind)
        log.event("imported", at=_IMPORTED_AT)
        log.event("ready", at=context.formed_at)
    return log


def close_logs() -> None:
    """The exit event of every local log of this process (at the interpreter's exit; R calls it at
    its own). Logs in buckets only stop their heartbeat: no network at exit, where a store that is
    gone would hold the exit up for its retries (their end of training is recorded already)."""
    while _LOGS:
        log = _LOGS.pop()
        if isinstance(log.store.directory, Path):
            log.stop_following()
            log.event("exit")
        else:
            log.forget_steps()
