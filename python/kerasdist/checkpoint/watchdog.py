"""The step watchdog (`CheckpointOptions.hang_timeout`): a fit whose process is alive but no
longer stepping (a callback or a data loader that waits forever, a deadlock, a read from a dead
mount, a peer stuck in any of these while this worker waits in the all-reduce) ends its process
with status 77 (`HUNG_EXIT_CODE`), so the launcher, the Slurm recipe's supervisor and the elastic
logic restart the group from the newest checkpoint as after any failure.

A thread of the checkpoint callback watches the time since the last step ended. What is not a
step is not counted: the time before a fit's first step (building the pipeline, tracing, XLA
compiling), restores (before that too), checkpoint saves (preemption saves included), validation
passes. An epoch boundary (a validation's setup and teardown, other callbacks' epoch hooks, a new
epoch's pipeline, ps_fit's wait for its steps) gets five times the limit, or the limit plus twice
the longest boundary before. The limit is `hang_timeout` seconds, or with "auto" ten times the
slowest step of the fit so far and at least two minutes. Once it passes, the watchdog writes where the process stands
to stderr (the step, the seconds since it, every thread's Python stack), has the chief's run log
record the hang (`run_log.Event.HANG`: which worker is stuck and in which frame) and ends the
process with 77.

Under a multi-worker strategy the workers wait on each other, so a hang on one stops them all;
through the coordination service (`peers`) the first watchdog to fire has the others fire too,
each says where it stands (stuck in Python, in its input pipeline, or waiting in TensorFlow), and
the chief names the stuck one and writes the hang before any of them exits. The chief's saves
are paused time for every worker. A worker stuck in C code that holds the GIL cannot run its
watchdog: its peers fire and exit, and a backstop (faulthandler's own thread, then SIGALRM, neither
needing the GIL), moved on at each step end and at each turn of the watchdog's thread, dumps its
stacks (on the chief, into the run log's folder, `runs/<attempt>.stacks`) once that thread has not
run for the limit and a second more, and ends it by the signal (status -14, 142 in a shell), unless
its launcher or supervisor ended it first.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kerasdist.checkpoint.peers import Peers
from kerasdist.checkpoint.run_log import STACKS_HEADER_BYTES
from kerasdist.preemption.exit import HANG_BACKSTOP_SIGNAL, HUNG_EXIT_CODE, end_hung

AUTO = "auto"
AUTO_FLOOR_SECONDS = 120.0  # "auto": at least this long
AUTO_STEPS = 10  # "auto": this many times the slowest step of the fit so far
BACKSTOP_GRACE_SECONDS = 1.0  # the backstop fires this long after the limit without the watchdog's thread running
BOUNDARY_LIMITS = 5  # an epoch boundary gets this many times the limit (or more, see at_epoch_boundary)
ANSWER_SECONDS = 1.0  # the chief waits this long for the other workers to say where they stand
VERDICT_SECONDS = 4.0  # another worker waits this long for the chief to have written the hang
STUCK, WAITING = "stuck", "waiting"  # a worker's own state when its watchdog fires
_HANG, _PAUSED = "hang", "paused"  # the peers' names


class StepWatchdog:
    """One checkpoint callback's watchdog (see the module docstring): `start` at a fit's begin,
    `stepped` at each step end, `paused` around what is not a step, `stop` at the fit's end."""

    def __init__(self, hang_timeout: float | str | None):
        self.setting = hang_timeout
        self.fired = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._armed = False
        self._paused = 0
        self._told: list[bool] = []  # per pause in force: whether the other workers were told
        self._last = 0.0  # time.monotonic() of the last step end (or pause end)
        self._slowest = 0.0  # the slowest step interval of this fit
        self._step = 0
        self._boundary: float = 0.0  # the longest epoch boundary so far
        self._boundary_since: float | None = None  # the epoch boundary under way, if any
        self._boundary_told = False  # the other workers were told of it (the chief's)
        self._training_thread = 0
        self._peers: Peers | None = None
        self._is_chief = True
        self._task: str | None = None
        self._record: Callable[..., None] | None = None
        self._backstop = _Backstop()
        self._carried = False  # the trainer's next fit follows at once: still watching
        self._loop: Any = None  # the frame of the loop that runs the fit (its hooks' caller)

    @property
    def enabled(self) -> bool:
        return self.setting is not None

    def limit(self) -> float:
        """The seconds without a step that make a hang, now."""
        if self.setting == AUTO:
            return max(AUTO_FLOOR_SECONDS, AUTO_STEPS * self._slowest)
        return float(self.setting)  # type: ignore[arg-type]

    # -- what the callback tells it -------------------------------------------------------------
    def start(self, *, step: int, task: str | None, is_chief: bool, peers: Peers | None,
              record: Callable[..., None] | None, stacks_fd: int | None = None) -> None:
        """A fit begins on this thread at optimizer step `step`; armed from its first step end
        (or still armed, when the trainer's previous fit handed over: `stop(carry=True)`).
        `record(**fields)` writes the hang into the run log (the chief's); `stacks_fd`, the file
        the backstop dumps into (default: stderr)."""
        if not self.enabled:
            return
        self._step, self._task, self._is_chief, self._peers, self._record = step, task, is_chief, peers, record
        self._loop = _loop_frame()
        self._backstop.prepare(stacks_fd)
        if self._carried and self._thread is not None and self._thread.is_alive():
            self._carried = False
            return
        self._training_thread = threading.get_ident()
        self._armed, self._paused, self._told, self._slowest, self._boundary = False, 0, [], 0.0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(self._stop,), name="kerasdist-step-watchdog",
                                        daemon=True)
        self._thread.start()

    def stepped(self, count: int) -> None:
        """`count` more steps ended (per batch end: a few microseconds)."""
        if self._thread is None:
            return
        if self._boundary_since is not None:
            self.boundary_done()  # the first step of an epoch (not one of its steps' times)
        elif self._armed and self._paused == 0:
            self._slowest = max(self._slowest, time.monotonic() - self._last)
        now = time.monotonic()
        self._last, self._armed = now, True
        self._step += count
        if self._paused == 0:
            self._backstop.arm(self.limit() + BACKSTOP_GRACE_SECONDS, now, self._step)

    @contextlib.contextmanager
    def paused(self, for_peers: bool = False) -> Iterator[None]:
        """Not a step: not counted. `for_peers`: the chief alone does it while the other workers
        wait for it in the next collective (a save), so they are told."""
        self.pause(for_peers)
        try:
            yield
        finally:
            self.resume()

    def pause(self, for_peers: bool = False) -> None:
        """`paused` for what begins and ends in two hooks (a validation pass); pauses nest."""
        if self._thread is None:
            return
        told = for_peers and self._peers is not None and self._is_chief
        self._told.append(told)
        self._paused += 1
        self._backstop.cancel()
        if told:
            self._peers.put_later(_PAUSED, self._step)  # type: ignore[union-attr]

    def resume(self) -> None:
        if self._thread is None or not self._told:
            return
        if self._told.pop():
            self._peers.delete_later(_PAUSED)  # type: ignore[union-attr]
        self._paused -= 1
        self._last = time.monotonic()
        if self._armed and self._paused == 0:
            self._backstop.arm(self.limit() + BACKSTOP_GRACE_SECONDS, self._last, self._step)

    def at_epoch_boundary(self) -> None:
        """An epoch boundary begins: an epoch's last step ended, or its validation did, or a new
        epoch (or the trainer's next fit) began. Until `boundary_done` (a validation begins, the
        epoch's end hooks ran, a step ended), the setup of a validation (its pipeline, its first
        batch, read before any hook) or its teardown (its pipeline's threads ending), the other
        callbacks' epoch hooks, a new epoch's pipeline and ps_fit's wait for its scheduled steps
        get `BOUNDARY_LIMITS` times the limit, or the limit plus twice the longest boundary so
        far. The chief's is a pause for the other workers, who wait for it."""
        if self._thread is None or not self._armed or self._boundary_since is not None:
            return
        self._boundary_since = time.monotonic()
        self._boundary_told = self._peers is not None and self._is_chief
        if self._boundary_told:
            self._peers.put_later(_PAUSED, self._step)  # type: ignore[union-attr]

    def boundary_done(self) -> None:
        if self._thread is None or self._boundary_since is None:
            return
        now = time.monotonic()
        self._boundary = max(self._boundary, now - self._boundary_since)
        self._boundary_since, self._last = None, now
        if self._boundary_told:
            self._boundary_told = False
            self._peers.delete_later(_PAUSED)  # type: ignore[union-attr]

    def stop(self, carry: bool = False) -> None:
        """The fit ended (or raised): no more watching; `carry`, the trainer starts its next fit at
        once (the rest of a resumed epoch, then the others): the time until its first step counts."""
        if carry and self._thread is not None:
            self._carried = True
            return
        self._carried = False
        thread, self._thread = self._thread, None
        self._stop.set()
        self._backstop.cancel()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    # -- the watching thread --------------------------------------------------------------------
    def _watch(self, stop: threading.Event) -> None:
        tick = min(0.5, self.limit() / 10)
        while not stop.wait(tick):
            if not self._armed or self._paused:
                continue
            # This thread runs, so the GIL is free: the backstop, for when it is not, moves on too.
            self._backstop.arm(self.limit() + BACKSTOP_GRACE_SECONDS, time.monotonic(), self._step)
            idle = time.monotonic() - (self._boundary_since or self._last)
            limit = self._effective_limit()
            if idle >= limit / 2 and self._peers is not None and self._peers.get(_HANG, 0.01) is not None:
                self._fire(idle)  # another worker declared a hang: this one waits for it too
            if idle < limit:
                continue
            if self._chief_pauses():
                self._last = time.monotonic()  # the chief is saving: every worker waits for it
                continue
            if not self._in_fit():
                return  # the fit raised (Keras calls no end hook then): not a hang, nothing to watch
            self._fire(idle)

    def _chief_pauses(self) -> bool:
        """Whether the chief (this being another worker) is in a save of the step this worker
        stands at (a mark of an earlier step is stale)."""
        if self._peers is None or self._is_chief:
            return False
        paused_at = self._peers.get(_PAUSED, 0.05)
        return isinstance(paused_at, int) and paused_at >= self._step

    def _in_fit(self) -> bool:
        """Whether the training thread is still in the loop that runs the fit (between a
        trainer's fits, `carry`: whether the trainer is still in them)."""
        if self._carried or self._loop is None:
            return True
        frame = sys._current_frames().get(self._training_thread)
        while frame is not None:
            if frame is self._loop:
                return True
            frame = frame.f_back
        return False

    def _effective_limit(self) -> float:
        if self._boundary_since is None:
            return self.limit()
        return max(BOUNDARY_LIMITS * self.limit(), self.limit() + 2 * self._boundary)

    def _fire(self, idle: float) -> None:
        """Say where this process stands, agree with the peers on who is stuck, exit 77."""
        end_hung()
        self.fired = True
        self._backstop.cancel()
        limit = self.limit()
        me = {"task": self._task, "step": self._step, "since": round(idle, 1),
              **where_stuck(self._training_thread)}
        _say(f"no training step for {idle:.1f} s (hang_timeout {_seconds(limit)}) after step {self._step}"
             f"{' on ' + self._task if self._task else ''}: every thread's stack follows, then exit {HUNG_EXIT_CODE}.")
        with contextlib.suppress(Exception):
            faulthandler.dump_traceback(file=2, all_threads=True)
        peers = self._peers
        if peers is not None:
            _bounded(lambda: peers.put(_HANG, self._task), 2.0)
            _bounded(lambda: peers.put(f"{_HANG}/{self._task}", me), 2.0)
        if self._is_chief:
            answers = (_bounded(lambda: _answers(peers), ANSWER_SECONDS + 2.0) or {}) if peers is not None else {}
            worker, frame, cause = verdict(me, answers, peers.others if peers is not None else [])
            who = worker or ("this process" if peers is None else "no worker found stuck")
            _say(f"hang: {who}{' in ' + frame if frame else ''} ({cause}).")
            if self._record is not None:
                record = self._record
                _bounded(lambda: record(step=self._step, seconds=round(idle, 3), timeout=round(limit, 3),
                                        worker=worker, frame=frame, cause=cause,
                                        workers={d["task"] or "this process": d for d in [me, *answers.values()]}),
                         5.0)
            if peers is not None:
                _bounded(lambda: peers.put(f"{_HANG}/verdict", worker), 2.0)
        elif peers is not None:
            _bounded(lambda: peers.get(f"{_HANG}/verdict", VERDICT_SECONDS), VERDICT_SECONDS + 1.0)
        _say(f"exiting with {HUNG_EXIT_CODE} (hung).")
        os._exit(HUNG_EXIT_CODE)


def _loop_frame() -> Any:
    """The frame of the training loop calling this fit's hooks (the caller of Keras's
    `CallbackList`), or None when no CallbackList called."""
    frame, in_list = sys._getframe(), False
    while frame is not None:
        here = frame.f_code.co_filename.endswith(os.path.join("callbacks", "callback_list.py"))
        if in_list and not here:
            return frame
        in_list = in_list or here
        frame = frame.f_back
    return None


def _answers(peers: Peers) -> dict[str, dict[str, Any]]:
    """The other workers' own states, each waited for while `ANSWER_SECONDS` last."""
    deadline = time.monotonic() + ANSWER_SECONDS
    answers = {}
    for task in peers.others:
        answer = peers.get(f"{_HANG}/{task}", max(0.01, deadline - time.monotonic()))
        if isinstance(answer, dict):
            answers[task] = answer
    return answers


def verdict(me: dict[str, Any], answers: dict[str, dict[str, Any]],
            others: list[str]) -> tuple[str | None, str | None, str]:
    """(the stuck worker, the frame it is stuck in, why) from this worker's state `me` and the
    `answers` of the `others`: one stuck in Python (its training thread or its input pipeline's),
    else one that did not answer (its watchdog could not run: C code holding the GIL, or gone);
    alone, this worker."""
    states = [me, *answers.values()]
    stuck = sorted((d for d in states if d.get("state") == STUCK), key=lambda d: (d.get("step", 0), str(d["task"])))
    if stuck:
        found = stuck[0]
        return found["task"], found.get("frame"), f"stuck in Python, in its {found.get('thread', 'training')} thread"
    silent = [task for task in others if task not in answers]
    if silent:
        return silent[0], None, "no answer: stuck in C code that holds the GIL, or gone"
    if not others:
        return me["task"], me.get("frame"), "waiting in TensorFlow (an input pipeline or an op stuck in C++)"
    return None, None, "every worker waits in TensorFlow (a collective, or an input pipeline stuck in C++)"


# --------------------------------------------------------------------------------------------
# Where a process stands


_STDLIB = tuple({os.path.realpath(sysconfig.get_paths()[name]) + os.sep for name in ("stdlib", "platstdlib")})
_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")  # in a venv's platstdlib too
_LIBRARY_PARTS = (f"{os.sep}tensorflow{os.sep}", f"{os.sep}keras{os.sep}", f"{os.sep}tf_keras{os.sep}")
_PYTHON_IN_PIPELINE = f"{os.sep}ops{os.sep}script_ops.py"  # py_function, numpy_function, from_generator


def where_stuck(training_thread: int) -> dict[str, Any]:
    """This process's own state: "stuck" in Python (the training thread in code that is not
    TensorFlow's or Keras's, or a tf.data thread running Python: a `py_function`, a generator)
    with the frame, or "waiting" in TensorFlow with the training thread's frame."""
    frames = sys._current_frames()
    training = frames.get(training_thread)
    frame = _own_frame(training)
    if training is not None and not _in_library(frame):
        return {"state": STUCK, "thread": "training", "frame": _where(frame)}
    for ident, top in frames.items():
        if ident != training_thread and _runs_in_pipeline(top):
            return {"state": STUCK, "thread": "input pipeline", "frame": _where(_own_frame(top))}
    return {"state": WAITING, "thread": "training", "frame": _where(frame)}


def _own_frame(frame: Any) -> Any:
    """The innermost frame outside Python's standard library (whose waits, sleeps and reads the
    calling code asked for), else the innermost."""
    innermost = frame
    while frame is not None:
        path = os.path.realpath(frame.f_code.co_filename)
        if not path.startswith(_STDLIB) or any(part in path for part in _INSTALLED):
            return frame
        frame = frame.f_back
    return innermost


def _in_library(frame: Any) -> bool:
    return frame is not None and any(part in frame.f_code.co_filename for part in _LIBRARY_PARTS)


def _runs_in_pipeline(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.endswith(_PYTHON_IN_PIPELINE):
            return True
        frame = frame.f_back
    return False


_R_CALL = f"{os.sep}rpytools{os.sep}"  # reticulate's Python side of a call into R


def _where(frame: Any) -> str | None:
    if frame is None:
        return None
    where = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
    return f"R code, called from {where}" if _R_CALL in frame.f_code.co_filename else where


# --------------------------------------------------------------------------------------------
# The backstop: for a training thread that holds the GIL, the watching thread cannot run


class _Backstop:
    """faulthandler's dump of every thread (its own C thread) and SIGALRM's default action (the
    kernel's), both needing no GIL, set a grace after the limit and moved on as steps end and as
    the watching thread runs (which it cannot while C code holds the GIL); at most every half
    second: faulthandler starts a thread each time, about 0.1 ms."""

    PERIOD = 0.5

    def __init__(self) -> None:
        self._armed_at: float | None = None
        self._fd = 2
        self._kills = False
        self._thread = 0

    def prepare(self, fd: int | None) -> None:
        """Dump into `fd` (default stderr); kill by SIGALRM only where nobody handles it; the
        calling thread is the training thread."""
        self._fd = 2 if fd is None else fd
        self._kills = signal.getsignal(HANG_BACKSTOP_SIGNAL) == signal.SIG_DFL
        self._thread = threading.get_ident()

    def arm(self, seconds: float, now: float, step: int) -> None:
        if self._armed_at is not None and now - self._armed_at < self.PERIOD:
            return
        self._armed_at = now
        with contextlib.suppress(Exception):  # a closed file or a signal not ours: no backstop
            _write_stacks_header(self._fd, seconds, step, self._thread)
            faulthandler.dump_traceback_later(seconds, file=self._fd)
            if self._kills:
                signal.setitimer(signal.ITIMER_REAL, seconds + 0.3)  # once the dump is written

    def cancel(self) -> None:
        if self._armed_at is None:
            return
        self._armed_at = None
        with contextlib.suppress(Exception):
            faulthandler.cancel_dump_traceback_later()
            if self._kills:
                signal.setitimer(signal.ITIMER_REAL, 0)


def _write_stacks_header(fd: int, seconds: float, step: int, thread: int) -> None:
    """In a stacks file (not stderr): when the dump below it, if any, was due, after which step,
    and the training thread's identity as faulthandler prints it."""
    if fd == 2:
        return
    line = (f'{{"due": {time.time() + seconds:.3f}, "step": {step}, '
            f'"thread": "0x{thread:016x}"}}').encode().ljust(STACKS_HEADER_BYTES - 1) + b"\n"
    os.pwrite(fd, line, 0)


def _bounded(work: Callable[[], Any], seconds: float) -> Any:
    """`work()` in a thread of its own, given up after `seconds` (a store or a service that is
    gone must not keep a hung process from exiting); its result, or None."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    return result[0] if result else None


def _say(text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"kerasdist: {text}\n".encode())


def _seconds(value: float) -> str:
    return f"{value:g} s"
