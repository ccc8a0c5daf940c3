"""The run log: when each process of a run started, restored, took its first step, saved, evaluated
and ended, kept beside the checkpoints for `kerasdist.goodput` to turn into what failures cost.

Each process start of the chief (an "attempt") writes `runs/<attempt>.jsonl` in the checkpoint
directory or bucket, one JSON event per line, rewritten whole at each event (a few per save), and
`runs/<attempt>.step`: the last training step that completed and the time it ended, so that a run
killed without warning still says exactly how far it got and when it stopped making progress.

The step record is written at every step end that changes it, in place (one `pwrite` of a
fixed-width record into a file kept open, a few microseconds: no rename, no fsync), so what is on
disk when a process is SIGKILLed names its last completed step. A local directory holds it
directly. For an object store, where an upload per step would cost more than the step, the same
record goes to a local spool file (`spool_dir`) and a thread uploads the newest one at most once a
second; the next attempt of the run started on the same host uploads the spool of an attempt whose
process is gone (`_salvage`), so the store ends up with the exact record there too. A restart on
another host sees the last upload (up to a second behind).

The log goes through the checkpoint store but never in a checkpoint's way: it is not a
checkpoint entry, nothing reads it to restore, and a failed write warns once (`RunLogWarning`)
and stops the log, never training or a save.

The events are `Event`'s members, defined here once: the recorder writes them
(`checkpoint/recorder.py`) and `kerasdist.goodput` reads them back through `read_attempt_logs`.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from kerasdist.checkpoint.layout import (
    RUN_LOG_SUFFIX,
    RUN_STACKS_SUFFIX,
    RUN_STEP_SUFFIX,
    RUNS_FOLDER,
)
from kerasdist.checkpoint.stragglers import Straggler, straggler_of

_IMPORTED_AT = time.time()
_EVENT, _TIME = "event", "t"  # an event line's kind and time
_RECORD_BYTES = 80  # a step record, padded with spaces: each rewrite covers the one before
# A stacks file's first line (when the dump below it was due, the step, the training thread), padded:
# the step watchdog rewrites it in place as steps end; faulthandler writes the dump after it.
STACKS_HEADER_BYTES = 160
SPOOL_VARIABLE = "KERASDIST_RUN_SPOOL"  # where object-store runs keep their step records locally
# Set by kerasdist's supervisor (launch/supervisor.py) in the first training process it forks: when
# the supervisor started, so that its interpreter's start and TensorFlow's import count as this
# process's start-up (a process forked later, a restart in place, starts at its fork).
STARTED_AT_VARIABLE = "KERASDIST_PROCESS_STARTED_AT"
# Read once and removed, so that the processes this one starts count from their own start.
_SUPERVISOR_STARTED_AT = os.environ.pop(STARTED_AT_VARIABLE, "")


class Event(str, Enum):
    """The run log's events, each a JSON line `{"event": <value>, "t": <Unix time>, <fields>}`.

    START: the process started (`t` its own start time, from /proc; host, pid, task, workers,
    replicas, strategy). IMPORTED: kerasdist, and with it TensorFlow, imported. READY: the strategy
    and its cluster formed. RESTORED: a checkpoint read to restore (checkpoint or null, step,
    seconds). TRAIN_BEGIN: a fit began (step). FIRST_STEP: its first step ended (step). SAVE: a
    save left the training thread (step, blocked: the seconds that thread waited). COMMITTED: a
    checkpoint committed (step, checkpoint, write seconds, bytes). EVAL: a validation pass
    (seconds). STEP_TIMES: an epoch's steps on every worker (epoch, steps, step_seconds: the mean
    step, waited: per worker the mean seconds a step of it waited in all-reduces for the others).
    HANG: the step watchdog found no step for its limit (step: the last, seconds since it, timeout,
    worker: the stuck one or null, frame: where it is stuck or null, cause, workers: each
    worker's own state); the process exits 77 next. TRAIN_END: a fit ended (step, status: a
    `Status`). EXIT: the interpreter ended by itself (local logs only).
    """

    START = "start"
    IMPORTED = "imported"
    READY = "ready"
    RESTORED = "restored"
    TRAIN_BEGIN = "train_begin"
    FIRST_STEP = "first_step"
    SAVE = "save"
    COMMITTED = "committed"
    EVAL = "eval"
    STEP_TIMES = "step_times"
    HANG = "hang"
    TRAIN_END = "train_end"
    EXIT = "exit"


class Status(str, Enum):
    """How a fit ended, in its TRAIN_END event: completed, preempted (saved, exit 75), or a peer
    of the cluster lost mid-fit (exit 76, nothing saved)."""

    COMPLETED = "completed"
    PREEMPTED = "preempted"
    PEER_LOST = "peer lost"


@dataclass(frozen=True)
class LoggedEvent:
    """One event read back: its kind (None for a kind this kerasdist does not know: a newer one
    wrote it), its Unix time and its other fields (`event["step"]`, `event.get("step")`)."""

    kind: Event | None
    t: float
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)


@dataclass(frozen=True)
class StepRecord:
    """An attempt's `.step` file: the last training step it completed, the Unix time it ended, and
    the last step it began (one more while a step runs: a failure then leaves that step to redo)."""

    step: int
    t: float
    began: int | None = None


@dataclass(frozen=True)
class AttemptLog:
    """One attempt's run files read back: its name (`<start time>-<host>-<pid>`), its events in
    the order written (never empty), its step record (None: none written) and the stacks the step
    watchdog's backstop dumped (None: none; `stacks_header` its first line)."""

    name: str
    events: list[LoggedEvent]
    step_record: StepRecord | None
    stacks: str | None = None
    stacks_header: Mapping[str, Any] | None = None


@dataclass
class AttemptCounts:
    """What an attempt's events add up to, the one place its productive time is worked out: the
    live run figures count events here as they are written (never reading the log back), and
    `kerasdist.goodput` counts each attempt's logged events here too."""

    trained_seconds: float = 0.0  # between each first step and its end of training, ended fits
    training_since: float | None = None  # the first step of the fit training now
    blocked_seconds: float = 0.0
    eval_seconds: float = 0.0
    step_times: list[Mapping[str, Any]] = field(default_factory=list)  # STEP_TIMES events' fields

    def add(self, kind: Event | None, at: float, fields: Mapping[str, Any]) -> None:
        """Count an event of kind `kind` at Unix time `at` (a kind of a newer kerasdist: None, not counted)."""
        if kind is Event.FIRST_STEP:
            self.training_since = at
        elif kind is Event.TRAIN_END and self.training_since is not None:
            self.trained_seconds += max(0.0, at - self.training_since)
            self.training_since = None
        elif kind is Event.SAVE:
            self.blocked_seconds += float(fields["blocked"])
        elif kind is Event.EVAL:
            self.eval_seconds += float(fields["seconds"])
        elif kind is Event.STEP_TIMES:
            self.step_times.append(fields)

    def stepping_seconds(self, until: float) -> float:
        """Training time (each first step to its end of training, a fit still training counted to
        `until`) less the saves' blocking and evaluation: productive, unless a later attempt redoes it."""
        open_fit = max(0.0, until - self.training_since) if self.training_since is not None else 0.0
        return max(0.0, self.trained_seconds + open_fit - self.blocked_seconds - self.eval_seconds)

    def goodput(self, started: float, now: float) -> float:
        """This attempt's goodput so far (started: its process start), nothing redone: what
        `kerasdist.goodput` reports for it when it is the run's only attempt."""
        return productive_share(self.stepping_seconds(now), now - started)

    def straggler(self) -> Straggler | None:
        """The straggler of this attempt's epochs so far (`straggler_of`)."""
        return straggler_of(self.step_times)


def productive_share(productive: float, wall: float) -> float:
    """Goodput: productive seconds over wall seconds (0 for no wall time)."""
    return productive / wall if wall > 0 else 0.0


class RunLogWarning(UserWarning):
    """The run log could not be written; training and checkpoints go on without it."""


def process_started_at() -> float:
    """Unix time this process started (Linux: from /proc; elsewhere the time kerasdist was imported;
    `$KERASDIST_PROCESS_STARTED_AT` when its supervisor set it)."""
    with contextlib.suppress(ValueError):
        return float(_SUPERVISOR_STARTED_AT) if _SUPERVISOR_STARTED_AT else _from_proc()
    return _from_proc()


def _from_proc() -> float:
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22, starttime: clock ticks after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


class StepFile:
    """One fixed-width record in a local file kept open, rewritten in place by a single `pwrite`:
    the page cache has it once the call returns, so it outlives a SIGKILL of the writer, and a
    reader sees the old record or the new one (`read_step_record`)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)

    def write(self, data: bytes, at: int = 0) -> None:
        """The record (padded), or with `at` a part of it rewritten there."""
        if self._fd is not None:
            os.pwrite(self._fd, data if at else data.ljust(_RECORD_BYTES), at)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


_BEGAN_DIGITS = 12  # the record's last field, space-padded: rewritten alone as each step begins


def step_record(step: int, at: float, began: int) -> bytes:
    """The `.step` file's record: the last completed step, the Unix time it ended, the last begun
    (the last field, `_BEGAN_DIGITS` wide)."""
    return f'{{"{_TIME}": {at:.3f}, "step": {step}, "began": {began:<{_BEGAN_DIGITS}}}}'.encode()


def spool_dir(location: str) -> Path:
    """The local folder of the step records of runs in the object store at `location`
    (`$KERASDIST_RUN_SPOOL`, else the temporary directory), one per store."""
    root = os.environ.get(SPOOL_VARIABLE) or os.path.join(tempfile.gettempdir(), f"kerasdist-runs-{os.getuid()}")
    return Path(root) / hashlib.sha256(location.encode()).hexdigest()[:16]


class RunLog:
    """One attempt's log in one checkpoint directory (see the module docstring); `run_log_for`
    gives the one of a store, made on its first use in this process."""

    def __init__(self, store: Any, heartbeat_seconds: float):
        started = process_started_at()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started)) + f"{started % 1:.3f}"[1:]
        self.attempt = f"{stamp}Z-{socket.gethostname()}-{os.getpid()}"
        self.started = started
        self.store = store
        self.local = store.is_local
        self.heartbeat_seconds = heartbeat_seconds
        self._lines: list[str] = []
        self.counts = AttemptCounts()
        self._lock = threading.Lock()
        self._broken = False
        self._step_of: Any = None  # a function giving the current step, while training
        # the last completed step, when it ended, and the last step begun
        self._last: tuple[int, float, int] | None = None
        self._counted: int | None = None  # the step `steps_ended` counts from (read at `follow_steps`)
        self._step_file: StepFile | None = None
        self._written_step: tuple[int, int] | None = None  # the store's (object stores: uploaded) step, began
        self._stacks: tuple[Path, int] | None = None  # the backstop's file, once asked for
        self._began_at = 0  # where the step record's began field starts
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def event(self, kind: Event, at: float | None = None, **fields: Any) -> None:
        """Add an event (at `at`, default now) and write the log."""
        at = round(time.time() if at is None else at, 3)
        line = json.dumps({_EVENT: kind.value, _TIME: at, **fields})
        with self._lock:
            self.counts.add(kind, at, fields)
            if self._broken:
                return
            self._lines.append(line)
            self._write(RUN_LOG_SUFFIX, "\n".join(self._lines) + "\n")

    def step_ended(self, step: int) -> None:
        """Training step `step` has just completed (the chief's callback, at each batch end): its
        record goes to disk now when it changed (see the module docstring)."""
        if self._last is not None and self._last[0] == step:
            return
        self._record((step, time.time(), step))

    def step_began(self) -> None:
        """The step after the last completed one begins (the chief's callback, at each batch begin,
        the last hook before the step runs): recorded, so that a failure before its end leaves it
        counted as redone. Nothing before this process's first step end."""
        if self._last is None or self._counted is None or self._last[2] == self._counted + 1:
            return
        self._last = (self._last[0], self._last[1], self._counted + 1)
        if self._step_file is not None and not self._broken:
            try:  # the began field alone: a few bytes where it sits (a microsecond or so)
                self._step_file.write(f"{self._counted + 1:<{_BEGAN_DIGITS}}".encode(), self._began_at)
            except OSError as err:
                self._fail(err)

    def _record(self, last: tuple[int, float, int]) -> None:
        self._last = last
        if self._broken:
            return
        try:
            if self._step_file is None:
                folder = self.store.directory / RUNS_FOLDER if self.local else spool_dir(self.store.location)
                self._step_file = StepFile(folder / (self.attempt + RUN_STEP_SUFFIX))
            record = step_record(*self._last)
            self._began_at = len(record) - 1 - _BEGAN_DIGITS
            self._step_file.write(record)
        except OSError as err:
            self._fail(err)

    def steps_ended(self, count: int) -> None:
        """`count` more training steps have just completed, counted from `step_of()` at
        `follow_steps`: what `step_ended` records, without reading the model's step counter (a
        variable read costs more than the record itself)."""
        if self._counted is not None:
            self._counted += count
            self.step_ended(self._counted)

    def follow_steps(self, step_of: Any) -> None:
        """Until `stop_following`: upload the newest step record every heartbeat (object stores),
        or write `step_of()` (the training step) when nothing calls `step_ended`; `steps_ended`
        counts from `step_of()` now."""
        self._step_of = step_of
        try:
            self._counted = int(step_of())
        except Exception:  # noqa: BLE001 - no counter to start from: the heartbeat samples step_of
            self._counted = None
        if self._thread is None or not self._thread.is_alive():
            self._wake = threading.Event()  # its own: a thread that outlived a join still stops
            self._thread = threading.Thread(target=self._beat, args=(self._wake,), name="kerasdist-run-log",
                                            daemon=True)
            self._thread.start()

    @property
    def last_step(self) -> int | None:
        """The last step recorded as ended; None before the first."""
        return None if self._last is None else self._last[0]

    def stop_following(self, recount: bool = True) -> None:
        """Write the step once more (with `recount`, the model's own counter, should a trainer's
        batch hooks have counted otherwise), then stop the heartbeat. A fit a lost peer broke
        does not recount: its failed step may have moved the counter without ending."""
        thread, self._thread = self._thread, None
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        if recount and self._step_of is not None and self._last is not None:
            with contextlib.suppress(Exception):  # a model being torn down: the last record stands
                self.step_ended(int(self._step_of()))
        self._write_step()
        self._step_of = None
        self._counted = None

    def forget_steps(self) -> None:
        """Stop the heartbeat without writing."""
        self._step_of = None
        self._wake.set()

    def stacks_file(self) -> int | None:
        """A file descriptor for the step watchdog's backstop to dump a hung process's stacks into,
        positioned after a header line the watchdog rewrites: `runs/<attempt>.stacks` (an object
        store's in the spool, uploaded by the next attempt on the host); removed at `close` when
        nothing was dumped. None when it cannot be made."""
        if self._stacks is None:
            folder = self.store.directory / RUNS_FOLDER if self.local else spool_dir(self.store.location)
            try:
                folder.mkdir(parents=True, exist_ok=True)
                path = folder / (self.attempt + RUN_STACKS_SUFFIX)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            except OSError:
                return None
            os.lseek(fd, STACKS_HEADER_BYTES, os.SEEK_SET)
            self._stacks = (path, fd)
        return self._stacks[1]

    def close(self) -> None:
        """Close the step file; an object store's spool goes once the store has its record."""
        stacks, self._stacks = self._stacks, None
        if stacks is not None:
            path, fd = stacks
            dumped = os.fstat(fd).st_size > STACKS_HEADER_BYTES
            os.close(fd)
            if not dumped:
                path.unlink(missing_ok=True)
        step_file, self._step_file = self._step_file, None
        if step_file is not None:
            step_file.close()
            if not self.local and self._last is not None and self._written_step == (self._last[0], self._last[2]):
                step_file.path.unlink(missing_ok=True)

    def _beat(self, wake: threading.Event) -> None:
        while not wake.wait(self.heartbeat_seconds):
            self._write_step()

    def _write_step(self) -> None:
        """Give the store the newest step record: the one `step_ended` wrote (a local store has it
        already), else a sample of `step_of()`."""
        last, step_of = self._last, self._step_of
        if last is None and step_of is not None:
            try:
                step = int(step_of())
                last = (step, time.time(), step)
            except Exception:  # noqa: BLE001 - a model being torn down: the last step written stands
                return
        if last is None or (self.local and self._step_file is not None):
            return
        with self._lock:
            if (last[0], last[2]) != self._written_step and not self._broken:
                self._write(RUN_STEP_SUFFIX, step_record(*last).decode())
                self._written_step = (last[0], last[2])

    def _write(self, suffix: str, text: str) -> None:
        try:
            self.store.write_run_file(self.attempt + suffix, text.encode())
        except Exception as err:  # noqa: BLE001 - the log never stops training or a save
            self._fail(err)

    def _fail(self, err: BaseException) -> None:
        self._broken = True
        warnings.warn(RunLogWarning(
            f"kerasdist: the run log in {self.store.location} could not be written ({err}); training "
            "and checkpoints go on, and goodput() will not see the rest of this run."), stacklevel=4)


def _salvage(store: Any) -> None:
    """Upload the spooled step records of this host's earlier attempts on `store` whose process is
    gone (SIGKILLed before its last upload), then drop them: the store then has the exact last step."""
    folder = spool_dir(store.location)
    if not folder.is_dir():
        return
    host = socket.gethostname()
    for path in [*folder.glob(f"*{RUN_STEP_SUFFIX}"), *folder.glob(f"*{RUN_STACKS_SUFFIX}")]:
        attempt, suffix = path.name[: -len(path.suffix)], path.suffix
        owner, _, pid = attempt.rpartition("-")
        if not owner.endswith(f"-{host}") or not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            record = path.read_bytes()
            if record.strip() and (suffix == RUN_STEP_SUFFIX or len(record) > STACKS_HEADER_BYTES):
                store.write_run_file(attempt + suffix, record.strip() if suffix == RUN_STEP_SUFFIX else record)
            path.unlink()
        except Exception:  # noqa: BLE001 - a record left is only a less exact report, never an error
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process
    return True


_LOGS: list[RunLog] = []


def run_log_for(store: Any, context: Any) -> RunLog:
    """This process's log in `store`'s directory; on its first use, the start, imported and ready
    events (`context`: the `RunContext` training runs in)."""
    log = next((log for log in _LOGS if log.store.same_as(store)), None)
    if log is None:
        log = RunLog(store, heartbeat_seconds=1.0)
        if not log.local:
            _salvage(store)
        if not _LOGS:  # the first log since the last close_logs
            atexit.register(close_logs)
        _LOGS.append(log)
        log.event(Event.START, at=log.started, host=socket.gethostname(), pid=os.getpid(), task=context.task,
                  workers=context.num_workers, replicas=context.num_replicas, strategy=context.kind)
        log.event(Event.IMPORTED, at=_IMPORTED_AT)
        log.event(Event.READY, at=context.formed_at)
    return log


def close_logs() -> None:
    """The exit event of every local log of this process (at the interpreter's exit; R calls it at
    its own). Logs in buckets only stop their heartbeat: no network at exit, where a store that is
    gone would hold the exit up for its retries (their end of training is recorded already)."""
    while _LOGS:
        log = _LOGS.pop()
        if log.local:
            log.stop_following()
            log.event(Event.EXIT)
        else:
            log.forget_steps()
        log.close()


def read_attempt_logs(files: Mapping[str, bytes]) -> list[AttemptLog]:
    """The attempts whose logs `files` (a store's `run_files()`) hold, oldest first; a file that is
    not kerasdist's is a clear error naming it."""
    attempts = []
    for name, data in files.items():
        if not name.endswith(RUN_LOG_SUFFIX):
            continue
        attempt = name[: -len(RUN_LOG_SUFFIX)]
        records = _parsed(name, data.decode(errors="replace").splitlines())
        step_file = files.get(attempt + RUN_STEP_SUFFIX, b"").decode(errors="replace")
        step = _parsed(attempt + RUN_STEP_SUFFIX, [step_file])  # none: a step file created, not written yet
        if records:
            events = [LoggedEvent(_kind(r.pop(_EVENT, None)), float(r.pop(_TIME)), r) for r in records]
            stacks, header = _stacks_of(files.get(attempt + RUN_STACKS_SUFFIX))
            record = StepRecord(int(step[0]["step"]), float(step[0][_TIME]),
                                int(step[0].get("began", step[0]["step"]))) if step else None
            attempts.append(AttemptLog(attempt, events, record, stacks, header))
    return sorted(attempts, key=lambda log: log.events[0].t)


def _stacks_of(data: bytes | None) -> tuple[str | None, dict[str, Any] | None]:
    """A stacks file's dump and header; (None, None) when nothing was dumped."""
    if data is None or len(data) <= STACKS_HEADER_BYTES:
        return None, None
    try:
        header = json.loads(data[:STACKS_HEADER_BYTES].decode(errors="replace"))
    except ValueError:
        header = None
    return data[STACKS_HEADER_BYTES:].decode(errors="replace"), header if isinstance(header, dict) else None


def _kind(name: Any) -> Event | None:
    try:
        return Event(name)
    except ValueError:
        return None


def _parsed(name: str, lines: list[str]) -> list[dict[str, Any]]:
    """The JSON objects of a run file's lines, each with its time; a file that is not kerasdist's is
    a clear error naming it."""
    try:
        records = [json.loads(line) for line in lines if line.strip()]
        if all(isinstance(r, dict) and isinstance(r.get(_TIME), (int, float)) for r in records):
            return records
    except json.JSONDecodeError:
        pass
    raise ValueError(f"runs/{name} is not a kerasdist run log (JSON objects with a time \"t\", one a line).")
