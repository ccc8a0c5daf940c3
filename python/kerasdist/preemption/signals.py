"""Who holds SIGTERM, and SIGTERM outside training: a cluster task exits with 75 at once.

Outside a fit there is nothing to save, so a cluster task (Slurm step or TF_CONFIG) should say
"preempted, restart me" (75) instead of dying with 143, which the scheduler's recipe reads as a
failure. `install` (at `import kerasdist`) makes `exit_preempted` its SIGTERM handler. Python runs
handlers only between bytecodes on the main thread, which may wait long in C code that lets other
threads run (a collective, a file, a socket), so a watcher thread also wakes on the signal
(`signal.set_wakeup_fd`) and exits on the handler's behalf while it is still the one installed.

While a multi-worker strategy is created, TensorFlow waits for every worker in C++ holding the
GIL, and its coordination agent's own SIGTERM handler notes the signal in the cluster's key-value
store; once the cluster has formed, a `ClusterStartHold` takes SIGTERM from TensorFlow, the
workers agree on whether any was signalled (`strategy.select_strategy`, or `context.context_of`
for a strategy the user made), and the hold gives SIGTERM back to Python and has every worker exit
with 75 if any was. A fit's callback holds SIGTERM through a `SigtermHold`
and gives it back when fit ends; repeated signals change nothing; once the interpreter exits by
itself the signal is ignored (Python restores the default action while it finalizes, which would
turn a finished or saved run's exit into 143).

KERASDIST_EXIT_ON_SIGTERM=0 turns this off, =1 turns it on outside a cluster too.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kerasdist.preemption.exit import exit_preempted

SWITCH_VARIABLE = "KERASDIST_EXIT_ON_SIGTERM"
_installed = False  # whether this process is a cluster task with the guard in place


class SigtermHold:
    """SIGTERM held by `handler` until `release()` (or the end of a `with` block), then given
    back to whoever held it before. Off the main thread, where handlers cannot be set, it holds
    nothing and `held` is False: signals are the caller's then."""

    def __init__(self, handler: Callable[[int, Any], Any] | int) -> None:
        try:
            self._previous: Any = signal.signal(signal.SIGTERM, handler)
            self.held = True
        except ValueError:
            self._previous, self.held = None, False

    def release(self) -> None:
        if self.held:
            signal.signal(signal.SIGTERM, self._previous)
            self.held = False

    def __enter__(self) -> SigtermHold:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def wanted(environ: Mapping[str, str]) -> bool:
    """On for a task of a Slurm job step or a TF_CONFIG cluster, unless switched."""
    switch = environ.get(SWITCH_VARIABLE, "").strip().lower()
    if switch in ("0", "false", "no"):
        return False
    if switch in ("1", "true", "yes"):
        return True
    in_slurm_step = "SLURM_JOB_ID" in environ and "SLURM_PROCID" in environ
    return in_slurm_step or bool(environ.get("TF_CONFIG", "").strip())


def install(environ: Mapping[str, str] | None = None) -> bool:
    """Install the handler and its watcher if `wanted` and the SIGTERM handler is still the
    default one; returns whether it is in place. Only the main thread can install handlers."""
    env = os.environ if environ is None else environ
    if not wanted(env) or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is exit_preempted:
        return True
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return False  # the program has its own handler: leave it
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:
        os.close(read_end)
        os.close(write_end)
        return False
    global _installed
    _installed = True
    signal.signal(signal.SIGTERM, exit_preempted)
    threading.Thread(target=_watch, args=(read_end,), name="kerasdist-sigterm", daemon=True).start()
    return True


def ignore_while_exiting() -> None:
    """Registered with atexit after TensorFlow's own exit handlers, so it runs before them."""
    atexit.register(_ignore_if_installed)


def _ignore_if_installed() -> None:
    """Any Python handler, not only ours: a fit that ended in an exception (a peer lost) left its
    callback's handler in place, and the exit status the process is about to give (1) says more
    than the 143 a signal would put in its place once Python restores the default action."""
    if callable(signal.getsignal(signal.SIGTERM)) and _installed:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


class ClusterStartHold:
    """SIGTERM from the moment kerasdist has a multi-worker strategy (right after making it, or at
    its first call on one the user made) until its workers have agreed whether any was signalled.

    TensorFlow's coordination agent installed its own C++ SIGTERM handler (its preemption
    notifier) while the strategy waited for the workers, holding the GIL. That handler only sets
    a flag, which a listener thread polls once a second before it publishes the notice in the
    cluster's key-value store; a signal that comes while the workers agree, after they read that
    store, is published too late for anyone to read it. So the hold takes SIGTERM from TensorFlow
    at once and records it, `noticed()` waits long enough for a notice TensorFlow caught just
    before, and `give_back()` hands SIGTERM back to the handler Python has on record. A program
    whose SIGTERM is not a Python handler (switched off: the default action) keeps TensorFlow's.
    Used as `with ClusterStartHold() as hold:`, the workers' agreement setting `hold.any_noticed`;
    leaving the block gives SIGTERM back on that agreement, whatever raised.
    """

    def __init__(self) -> None:
        self.recorded = False
        self.any_noticed = False  # what the workers agreed; `give_back` on leaving a `with` acts on it
        self._on_record = signal.getsignal(signal.SIGTERM)
        self._hold = SigtermHold(self._record) if callable(self._on_record) else None

    def __enter__(self) -> ClusterStartHold:
        return self

    def __exit__(self, *raised: Any) -> None:
        self.give_back(self.any_noticed)  # also when the agreement failed

    def _record(self, signum: int, frame: Any) -> None:
        self.recorded = True

    def noticed(self) -> bool:
        """Whether this worker was signalled: recorded here, or caught by TensorFlow on any worker
        and published (waits `agreement.NOTICE_WAIT_MS` for it). Only kerasdist's own handler
        acts on other workers' signals, so with any other handler on record nothing is awaited."""
        if self._on_record is not exit_preempted:
            return self.recorded
        from kerasdist.preemption.agreement import noticed_by_tensorflow

        return noticed_by_tensorflow() or self.recorded

    def give_back(self, any_noticed: bool) -> None:
        """SIGTERM back to the handler on record. When any worker was signalled (`any_noticed`,
        agreed by the caller) every worker exits with 75 before training: nothing has been
        trained, and they all stop alike. A signal recorded after this worker's vote exits it with
        75 alone, as a SIGTERM outside training does. A program's own handler gets a signal
        recorded here; one TensorFlow caught before the hold is not passed on to it."""
        if self._hold is None:
            return
        self._hold.release()
        if self._on_record is exit_preempted and (any_noticed or self.recorded):
            exit_preempted()
        if self.recorded:
            signal.raise_signal(signal.SIGTERM)


def _watch(read_end: int) -> None:
    while True:
        try:
            received = os.read(read_end, 64)
        except OSError:
            return
        if not received:
            return
        if signal.SIGTERM in received and signal.getsignal(signal.SIGTERM) is exit_preempted:
            exit_preempted()
