"""What failures cost: `goodput()` reads the run log a checkpoint directory holds (`checkpoint/run_log.py`)
and splits the wall time of every process start of the run into productive training and what was lost.

Each attempt (a start of the chief's process) runs from its process start to its last sign of life
(its exit, its end of training, or the last event its log holds). Within it:
- start-up: from the process start to the first training step, less the restore (Python and
  TensorFlow, the cluster forming, the model and dataset built, the first step's tracing);
- restore: reading the checkpoint it resumed from;
- checkpoint blocking: the seconds the training thread waited in saves;
- evaluation: validation during fit;
- redone: training whose steps the next attempt trained again, because they came after the last
  checkpoint the attempt committed (its steps past the next attempt's restored step, at the
  attempt's own pace; the step in progress when an attempt failed, which its step record says
  began, is redone too, its seconds in detection or hang);
- productive: the rest of the time between the first step and the end of training;
- detection: for an attempt that failed (killed, crashed, a peer lost), from the end of the last
  step it completed (its step record, written at each step end) to its last sign of life: the step
  that never finished, a collective waiting on a dead peer until TensorFlow's coordination service
  declared it lost, the process's end;
- hang: for an attempt that hung (its step watchdog fired, or the watchdog's backstop dumped its
  stacks: C code holding the GIL), from the end of its last completed step to the watchdog's exit,
  with the stuck worker and the frame it was stuck in (`Attempt.hang`);
- other: after training ended (evaluation or prediction after fit, shutting down).
Stragglers: under a multi-worker strategy the chief's log holds every worker's step times
(`run_log.Event.STEP_TIMES`); a worker the others persistently waited for is named
(`GoodputReport.straggler`, `stragglers.straggler_of`).
Between attempts, downtime: no process of the run was running (a requeue waiting in the
scheduler's queue, a person restarting it). Goodput is productive time over the wall time from
the first start to the last end.

The recovery of each attempt after the first, from the failure (the end of the previous attempt's
last completed step; its last sign of life when it completed or was preempted) to its own first
step, splits into: detection (the previous attempt's, above), down (from its last sign of life to
the new process's start: the old process's exit, the restart; no process of ours running),
python_and_tensorflow (the new process to `import kerasdist`), cluster (to the strategy formed),
restore, and first_step (the model and pipeline built, the first step traced and run).
"""

from __future__ import annotations

import math
import os
import re
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kerasdist.checkpoint.run_log import (
    AttemptCounts,
    AttemptLog,
    Event,
    LoggedEvent,
    Status,
    StepRecord,
    productive_share,
    read_attempt_logs,
)
from kerasdist.checkpoint.store import open_store
from kerasdist.checkpoint.stragglers import Straggler, straggler_of

PARTS = ("productive", "startup", "restore", "checkpoint_blocking", "redone", "evaluation", "detection", "hang",
         "other", "downtime")
RECOVERY_PARTS = ("detection", "down", "python_and_tensorflow", "cluster", "restore", "first_step")
KILLED = "killed or crashed"  # an attempt whose log just stops (no TRAIN_END then EXIT)
HUNG = "hung"  # the step watchdog's HANG event, or its backstop's dump of the stacks
FAILED = (KILLED, Status.PEER_LOST.value, HUNG)  # statuses whose time after the last completed step is lost


@dataclass(frozen=True)
class Attempt:
    """One start of the chief's process, as its run log tells it.

    Attributes:
        name: the log's name (`<start time>-<host>-<pid>`).
        started, ended: Unix times of the process start and of its last sign of life.
        status: "completed", "preempted" (saved and exited 75), "peer lost" (another worker
            disappeared mid-fit: exited 76, nothing saved), "hung" (no step for the watchdog's
            limit: exited 77, or ended by its backstop), or "killed or crashed" (the log just
            stops: SIGKILL, a lost host, an error).
        restored_step: the step it resumed from (0: from scratch); last_step: the last step it
            completed (its step record, written at every step end); last_step_at: the Unix time
            that step ended (None in a log without a step record).
        saves: checkpoints it committed; seconds: this attempt's share of each part.
        recovery: for an attempt after the first that reached its first step, the seconds from
            the previous attempt's failure (see the module docstring) to that step, split by
            `RECOVERY_PARTS` (and "total"); None otherwise.
        workers: the workers that trained in it (`RunContext.num_workers`; a job that shrank
            on a lost host and grew back shows 2, 1, 2); None in a log of an older kerasdist.
        redone_steps: its steps the next attempt trained again (the step in progress at a
            failure included).
        hang: for a hung attempt: worker (the stuck one's task; None when none was found, or
            for a process outside a cluster), frame (where it was stuck, None when unknown), cause,
            seconds (from its last step to the exit), timeout (the watchdog's limit; None for the
            backstop), by ("watchdog" or "backstop"), alone (no other worker); None otherwise.
    """

    name: str
    started: float
    ended: float
    status: str
    restored_step: int
    first_step_at: float | None
    last_step: int
    saves: int
    seconds: dict[str, float] = field(default_factory=dict)
    recovery: dict[str, float] | None = None
    workers: int | None = None
    last_step_at: float | None = None
    redone_steps: int = 0
    hang: dict[str, Any] | None = None


@dataclass(frozen=True)
class GoodputReport:
    """`goodput()`'s answer.

    Attributes:
        checkpoint_dir: where the log was read.
        wall_seconds: from the first process start to the last sign of life.
        seconds: wall time split into `PARTS` (productive, startup, restore, checkpoint_blocking,
            redone, evaluation, detection, hang, other, downtime); they add up to `wall_seconds`.
        goodput: productive / wall; goodput_excluding_downtime: productive / (wall - downtime).
        redone_steps: steps trained twice.
        failures: attempts that ended without completing (killed, crashed or preempted) and were
            followed by another.
        save_cost_seconds: mean seconds a save blocked training; None without saves.
        mean_time_between_failures: running seconds (wall - downtime) per failure; None without.
        suggested_interval_seconds: the checkpoint interval that loses least time by Young/Daly,
            sqrt(2 x save cost x mean time between failures); None without failures or saves.
        mean_save_interval_seconds: seconds of training between this run's saves; None without.
        attempts: each attempt, oldest first.
        straggler: a worker the others persistently waited for (`stragglers.Straggler`: which, how
            much slower, the share of the training they spent waiting); None when none was.
    """

    checkpoint_dir: str
    wall_seconds: float
    seconds: dict[str, float]
    goodput: float
    goodput_excluding_downtime: float
    redone_steps: int
    failures: int
    save_cost_seconds: float | None
    mean_time_between_failures: float | None
    suggested_interval_seconds: float | None
    mean_save_interval_seconds: float | None
    attempts: list[Attempt]
    straggler: Straggler | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def rows(self) -> list[dict[str, Any]]:
        """One row per part: part, seconds, share of the wall time."""
        wall = self.wall_seconds or 1.0
        return [{"part": part, "seconds": round(self.seconds[part], 3), "share": round(self.seconds[part] / wall, 4)}
                for part in PARTS]

    def __str__(self) -> str:
        lines = [f"{self.checkpoint_dir}: {len(self.attempts)} attempt(s), {self.failures} failure(s), "
                 f"wall {self.wall_seconds:.1f} s, goodput {self.goodput:.1%} "
                 f"({self.goodput_excluding_downtime:.1%} without downtime)"]
        lines += [f"  {row['part']:<20} {row['seconds']:>10.1f} s  {row['share']:>6.1%}" for row in self.rows()]
        lines.append(f"  redone steps: {self.redone_steps}")
        for number, attempt in enumerate(self.attempts, start=1):
            if attempt.hang is not None:
                lines.append(f"  {_hang_line(number, attempt.hang)}")
        if self.straggler is not None:
            lines.append(f"  straggler: {self.straggler}")
        sizes = [a.workers for a in self.attempts]
        if None not in sizes and len(set(sizes)) > 1:
            lines.append(f"  workers per attempt: {' -> '.join(map(str, sizes))} (the cluster was resized)")
        recoveries = [a.recovery for a in self.attempts if a.recovery]
        if recoveries:
            totals = sorted(r["total"] for r in recoveries)
            parts = ", ".join(f"{part} {statistics.median(r[part] for r in recoveries):.1f} s"
                              for part in RECOVERY_PARTS)
            lines.append(f"  recovery (failure to first step): median "
                         f"{_seconds(statistics.median(totals))}, max {_seconds(totals[-1])}; median parts: {parts}")
        if self.suggested_interval_seconds is not None:
            now = (f"; this run saved every {_seconds(self.mean_save_interval_seconds)}"
                   if self.mean_save_interval_seconds is not None else "")
            lines.append(f"  checkpoint interval that loses least (Young/Daly, save cost "
                         f"{self.save_cost_seconds:.2f} s, a failure every "
                         f"{_seconds(self.mean_time_between_failures)}): "
                         f"{_seconds(self.suggested_interval_seconds)}{now}")
        else:
            lines.append("  checkpoint interval: no failure (or no save) observed, nothing to suggest")
        return "\n".join(lines)


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


def _hang_line(number: int, hang: dict[str, Any]) -> str:
    who = hang.get("worker") or ("the process" if hang.get("alone") else "no worker found stuck")
    where = f" in {hang['frame']}" if hang.get("frame") else ""
    limit = f", hang_timeout {hang['timeout']:g} s" if hang.get("timeout") else ""
    return (f"hang in attempt {number}: {who}{where} ({hang.get('cause')}); {_seconds(hang['seconds'])} from its "
            f"last step to the exit{limit}")


def goodput(checkpoint_dir: str | os.PathLike[str], *,
            storage_options: Mapping[str, Any] | None = None) -> GoodputReport:
    """What the run in `checkpoint_dir` spent its time on, from the run log the chief writes there
    (every trainer writes it: `distributed_fit`, `resume_fit`, `custom_fit`, and `ps_fit` given a
    checkpoint callback).

    The wall time from the run's first start to its end splits into productive training,
    start-up (the interpreter, TensorFlow, the cluster, the model, the first step), restore,
    checkpoint blocking (training waiting in saves), redone work (steps trained again because a
    failure came after the last checkpoint), evaluation, detection (for a start that failed: from
    the end of its last completed step to its end, e.g. waiting until a dead peer is declared
    lost), hang (for a start whose step watchdog found it hung: from its last step to the
    watchdog's exit; the stuck worker and its frame named), other (after training) and downtime
    (no process running, e.g. a requeued job waiting in the queue). Goodput is productive time
    over wall time. Under a multi-worker strategy a worker the others persistently waited for is
    named as a straggler.

    Args:
        checkpoint_dir: the run's checkpoint directory or URL (`s3://...`, `gs://...`), whose
            `runs/` holds the run log; never created.
        storage_options: options for an object store's filesystem, as for checkpoints.

    Returns:
        a `GoodputReport`: the wall time split into parts (see the module docstring), goodput,
        redone steps, failures, hangs, the straggler and the Young/Daly checkpoint interval;
        `print()` shows it.

    Raises:
        ValueError: `checkpoint_dir` holds no run log (no kerasdist training ran there).
    """
    store = open_store(checkpoint_dir, storage_options)
    attempts = read_attempt_logs(store.run_files())
    if not attempts:
        raise ValueError(f"checkpoint_dir {store.location!r} holds no run log (runs/*.jsonl): no kerasdist "
                         "trainer has run there (the chief of each writes one).")
    return _report(store.location, attempts)


def _report(location: str, logs: list[AttemptLog]) -> GoodputReport:
    restored_steps = _known_restored_steps([_restored_step(log.events) for log in logs])
    attempts: list[Attempt] = []
    for index, log in enumerate(logs):
        next_restored = restored_steps[index + 1] if index + 1 < len(logs) else None
        restored = restored_steps[index]
        attempt = _attempt(log, 0 if restored is None else restored, next_restored)
        if attempts and attempt.first_step_at is not None:
            attempt = replace(attempt, recovery=_recovery(log.events, attempts[-1], attempt))
        attempts.append(attempt)
    seconds = {part: sum(a.seconds.get(part, 0.0) for a in attempts) for part in PARTS}
    pairs = zip(attempts, attempts[1:], strict=False)
    seconds["downtime"] = sum(max(0.0, later.started - earlier.ended) for earlier, later in pairs)
    wall = attempts[-1].ended - attempts[0].started
    seconds["other"] += wall - sum(seconds.values())  # overlap or rounding: other absorbs it
    failures = sum(1 for a in attempts[:-1] if a.status != Status.COMPLETED.value)
    running = wall - seconds["downtime"]
    blocked = [float(e["blocked"]) for log in logs for e in log.events if e.kind is Event.SAVE]
    save_cost = sum(blocked) / len(blocked) if blocked else None
    mtbf = running / failures if failures else None
    trained = seconds["productive"] + seconds["redone"] + seconds["checkpoint_blocking"]
    return GoodputReport(
        checkpoint_dir=location,
        wall_seconds=wall,
        seconds=seconds,
        goodput=productive_share(seconds["productive"], wall),
        goodput_excluding_downtime=productive_share(seconds["productive"], running),
        redone_steps=sum(a.redone_steps for a in attempts),
        failures=failures,
        save_cost_seconds=save_cost,
        mean_time_between_failures=mtbf,
        suggested_interval_seconds=math.sqrt(2 * save_cost * mtbf) if save_cost and mtbf else None,
        mean_save_interval_seconds=trained / len(blocked) if blocked else None,
        attempts=attempts,
        straggler=straggler_of([e.fields for log in logs for e in log.events if e.kind is Event.STEP_TIMES]),
    )


def _restored_step(events: list[LoggedEvent]) -> int | None:
    """The step an attempt resumed from; None for one that ended before it got that far."""
    restored = [e for e in events if e.kind is Event.RESTORED]
    if restored:
        return int(restored[0].get("step") or 0)
    begins = [e for e in events if e.kind is Event.TRAIN_BEGIN]
    return int(begins[0]["step"]) if begins else None


def _known_restored_steps(steps: list[int | None]) -> list[int | None]:
    """An attempt that ended before restoring (killed while Python started, say) changed no
    checkpoint: it stands at the step the next attempt resumed from, not at 0 (which would count
    every step of the attempt before it as redone). None for such attempts at the run's end."""
    known = list(steps)
    for index in reversed(range(len(known) - 1)):
        if known[index] is None:
            known[index] = known[index + 1]
    return known


def _attempt(log: AttemptLog, restored_step: int, next_restored: int | None) -> Attempt:
    events, heartbeat = log.events, log.step_record
    started = events[0].t
    ended = max([e.t for e in events] + ([heartbeat.t] if heartbeat else []))
    steps = [int(e["step"]) for e in events if "step" in e.fields and e.kind is not Event.RESTORED]
    last_step = max(steps + ([heartbeat.step] if heartbeat else []), default=restored_step)
    first_step_at = next((e.t for e in events if e.kind is Event.FIRST_STEP), None)
    ends = [e for e in events if e.kind is Event.TRAIN_END]
    status = ends[-1]["status"] if ends and events[-1].kind in (Event.TRAIN_END, Event.EXIT) else KILLED
    hang = _hang_of(log) if status == KILLED else None
    if hang is not None:
        status, ended = HUNG, max(ended, hang.pop("at"))
    part = dict.fromkeys(PARTS, 0.0)
    part["restore"] = sum(float(e["seconds"]) for e in events if e.kind is Event.RESTORED)
    progress_at = _last_progress(events, heartbeat) if status in FAILED and first_step_at is not None else None
    part["hang" if status == HUNG else "detection"] = ended - progress_at if progress_at is not None else 0.0
    if hang is not None:
        hang["seconds"] = round(part["hang"], 3)
    until = ended if progress_at is None else progress_at
    counts = _counts(events, until)
    part["checkpoint_blocking"], part["evaluation"] = counts.blocked_seconds, counts.eval_seconds
    if first_step_at is None:
        part["startup"] = ended - started - part["restore"]
    else:
        part["startup"] = max(0.0, first_step_at - started - part["restore"])
    stepping = counts.stepping_seconds(until)
    trained_steps = last_step - restored_step
    redone = _redone_steps_of(last_step, next_restored)
    part["redone"] = min(stepping, stepping * redone / trained_steps) if trained_steps > 0 else 0.0
    part["productive"] = stepping - part["redone"]
    part["other"] = (ended - started) - sum(part.values())
    workers = next((e.get("workers") for e in events if e.kind is Event.START), None)
    # A failure in a step (its computation, or the hooks at its end: the step record says it began)
    # leaves that step to redo too.
    began = heartbeat.began if heartbeat is not None and heartbeat.began is not None else last_step
    in_progress = 1 if status in FAILED and began > last_step and next_restored is not None else 0
    return Attempt(name=log.name, started=started, ended=ended, status=status, restored_step=restored_step,
                   first_step_at=first_step_at, last_step=last_step,
                   saves=sum(1 for e in events if e.kind is Event.COMMITTED), seconds=part,
                   workers=int(workers) if workers is not None else None,
                   last_step_at=heartbeat.t if heartbeat else None, redone_steps=redone + in_progress, hang=hang)


def _hang_of(log: AttemptLog) -> dict[str, Any] | None:
    """How a killed-looking attempt hung: its watchdog's HANG event, or its backstop's dump of the
    stacks (the watchdog could not run); None when it did not hang. Its "at" is when it ended."""
    events = [e for e in log.events if e.kind is Event.HANG]
    if events:
        event = events[-1]
        return {"worker": event.get("worker"), "frame": event.get("frame"), "cause": event.get("cause"),
                "timeout": event.get("timeout"), "by": "watchdog", "alone": len(event.get("workers") or {}) < 2,
                "at": event.t}
    if log.stacks is None or log.stacks_header is None:
        return None
    task = next((e.get("task") for e in log.events if e.kind is Event.START), None)
    return {"worker": task, "frame": _stuck_frame(log.stacks, str(log.stacks_header.get("thread", ""))),
            "cause": "stuck in C code that holds the GIL: the watchdog's backstop dumped its stacks",
            "timeout": None, "by": "backstop", "alone": True,
            "at": float(log.stacks_header.get("due", log.events[-1].t))}


def _stuck_frame(dump: str, thread: str) -> str | None:
    """In faulthandler's `dump`, the innermost frame of `thread` ("0x..."): its first outside
    Python's standard library, as "file:line in function"."""
    frames: list[tuple[str, str, str]] = []
    inside = False
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            inside = bool(thread) and thread in line
            continue
        match = _FRAME_LINE.match(line) if inside else None
        if match:
            frames.append((match[1], match[2], match[3]))
    own = [f for f in frames if not _STDLIB_PATH.search(f[0])] or frames
    return f"{own[0][0]}:{own[0][1]} in {own[0][2]}" if own else None


_FRAME_LINE = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_STDLIB_PATH = re.compile(r"/lib/python3[.\d]*/(?!site-packages/|dist-packages/)")


def _last_progress(events: list[LoggedEvent], heartbeat: StepRecord | None) -> float | None:
    """When a failed attempt's training thread last got something done: its last completed step
    (the step record), or a save or evaluation it finished after it; None without a step record
    (a log of an older kerasdist: no detection is counted)."""
    if heartbeat is None:
        return None
    done = [e.t for e in events if e.kind in (Event.FIRST_STEP, Event.SAVE, Event.EVAL)]
    return max([heartbeat.t, *done])


def _recovery(events: list[LoggedEvent], previous: Attempt, attempt: Attempt) -> dict[str, float]:
    """The recovery of `attempt` after `previous` (see the module docstring); a part whose event is
    missing (a log of an older kerasdist) counts in the next."""
    at = {e.kind: e.t for e in reversed(events)}  # each event's first time
    restore = attempt.seconds["restore"]
    imported = at.get(Event.IMPORTED, attempt.started)
    ready = max(at.get(Event.READY, imported), imported)
    first_step = float(attempt.first_step_at or ready)
    detection = previous.seconds.get("detection", 0.0) + previous.seconds.get("hang", 0.0)
    parts = {"detection": detection, "down": attempt.started - previous.ended,
             "python_and_tensorflow": imported - attempt.started,
             "cluster": ready - imported, "restore": restore,
             "first_step": max(0.0, first_step - ready - restore)}
    parts["total"] = first_step - (previous.ended - detection)
    return {name: round(value, 3) for name, value in parts.items()}


def _redone_steps_of(last_step: int, next_restored: int | None) -> int:
    return max(0, last_step - next_restored) if next_restored is not None else 0


def _counts(events: list[LoggedEvent], until: float) -> AttemptCounts:
    """An attempt's events counted as the live figures count them, none of its training after
    `until` (a failed attempt's last progress)."""
    counts = AttemptCounts()
    for event in events:
        counts.add(event.kind, min(event.t, until), event.fields)
    return counts


def plot_goodput(report: GoodputReport, path: str | os.PathLike[str]) -> None:
    """Draw the run's timeline into a PNG: one bar per attempt, its parts coloured, each
    failure marked, downtime as the gaps (needs matplotlib: `pip install "kerasdist[plot]"`).

    Args:
        report: what `goodput()` returned.
        path: the PNG file to write.
    """
    if not isinstance(report, GoodputReport):
        raise ValueError(f"report must be what goodput() returned (a GoodputReport), got {type(report).__name__}.")
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"path must be the PNG file to write, got {path!r}.")
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError('plot_goodput needs matplotlib: pip install "kerasdist[plot]" (or matplotlib).') from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"startup": "#bbbbbb", "restore": "#f0a030", "productive": "#4caf50", "redone": "#e53935",
               "checkpoint_blocking": "#7e57c2", "evaluation": "#42a5f5", "detection": "#8d6e63",
               "hang": "#ff7043", "other": "#eeeeee"}
    origin = report.attempts[0].started
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.5 * len(report.attempts)))
    labelled: set[str] = set()
    for row, attempt in enumerate(report.attempts):
        left = attempt.started - origin
        for part in ("startup", "restore", "productive", "checkpoint_blocking", "evaluation", "redone", "detection",
                     "hang", "other"):
            width = attempt.seconds.get(part, 0.0)
            if width > 0:
                ax.barh(row, width, left=left, color=colours[part], edgecolor="none",
                        label=None if part in labelled else part.replace("_", " "))
                labelled.add(part)
                left += width
        if attempt.status != Status.COMPLETED.value:
            ax.plot(attempt.ended - origin, row, marker="X", color="black", markersize=10)
            ax.annotate(attempt.status, (attempt.ended - origin, row), textcoords="offset points",
                        xytext=(6, 6), fontsize=8)
    ax.set_yticks(range(len(report.attempts)), [f"attempt {i + 1}" for i in range(len(report.attempts))])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first start")
    ax.set_title(f"goodput {report.goodput:.1%} ({report.goodput_excluding_downtime:.1%} without downtime), "
                 f"{report.failures} failure(s), {report.redone_steps} steps redone")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
