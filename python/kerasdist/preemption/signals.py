"""Who holds SIGTERM, and SIGTERM outside training: a cluster task exits with 75 at once.

Outside a fit there is nothing to save, so a cluster task (Slurm step or TF_CONFIG) should say
"preempted, restart me" (75) instead of dying with 143, which the scheduler's recipe reads as a
failure. `install` (at `import kerasdist`) makes `exit_preempted` its SIGTERM handler. Python runs
handlers only between bytecodes on the main thread, which may wait long in C code that lets other
threads run (a collective, a file, a socket), so a watcher thread also wakes on the signal
(`signal.set_wakeup_fd`) and exits on the handler's behalf while it is still the one installed.

While a multi-worker strategy is created, TensorFlow waits for every worker in C++ holding the
GIL, and its coordination agent's own SIGTERM handler notes the signal in the cluster's key-value
store; once the cluster has formed, the workers agree on whether any was signalled
(`strategy._join_cluster`), and `take_back_after_cluster_start` gives SIGTERM back to Python and
has every worker exit with 75 if any was. A fit's callback holds SIGTERM through a `SigtermHold`
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


def take_back_after_cluster_start(signalled_meanwhile: bool) -> None:
    """After a multi-worker strategy has formed the cluster: TensorFlow's coordination agent
    installed its own C++ SIGTERM handler (its preemption notifier) while it waited for the
    workers, holding the GIL, so a signal that came then was noted by TensorFlow, not by Python.
    Take SIGTERM back for the handler Python has on record, and when any worker was signalled
    meanwhile (`signalled_meanwhile`, from the cluster's key-value store) every worker exits
    with 75 before training: nothing has been trained, and they all stop alike."""
    current = signal.getsignal(signal.SIGTERM)
    if callable(current):
        signal.signal(signal.SIGTERM, current)
    if signalled_meanwhile and current is exit_preempted:
        exit_preempted()


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
