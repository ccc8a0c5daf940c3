"""Warm restarts in place: a training task's supervisor, which imports TensorFlow once and forks
the training process from itself, again after each SIGKILL or lost peer.

`kerasdist supervise [--max-restarts R] -- python train.py ARGS...` (or this file run as a script
with the same arguments) is what a scheduler runs as the task. It execs itself as the command's
own interpreter with the command's interpreter options (`python -u`, `-X ...`: the supervisor is
that interpreter, so every option and the whole environment hold for the training process too),
imports TensorFlow and Keras as the warm-start server does (`warm_start`), and forks the training
process, which runs the script, `-c` code or `-m` module as `python` would. The forked process is
the supervisor's child: in a Slurm step it is in the step (its process tree, its cgroup), so the
step's signals, kills and accounting reach it, unlike a process forked by a server of another step.

When the training process dies of SIGKILL (an out-of-memory kill, a `kill -9`), exits 76 (kerasdist: a peer of
its cluster was lost) or hung (exit 77, its step watchdog; or killed by SIGALRM, the watchdog's backstop
for C code that holds the GIL), the supervisor has not been signalled and restarts are left, it forks a new
one at once, in place: no interpreter start, no TensorFlow import (about 4-6 s of CPU a restart,
more on a loaded machine), no new step. The peers: a restarted worker registers with the chief's
coordination service under a new incarnation. If the chief's old process still runs (blocked in a
collective until the peer timeout), TensorFlow 2.21's service refuses it ("tried to connect with a
different incarnation. It has likely restarted") and sets the task in error, which ends the old
cluster's collectives at once: the old chief exits 76 without waiting out the peer timeout, its
supervisor forks a new chief, and the new worker's agent, which retries an aborted registration
("this task restarted ... the service has not restarted yet"), registers with the new chief's
service. A restarted chief starts a fresh service; the old workers see its connections close and
exit 76. A restarted process that has not formed its cluster within `--form-timeout` seconds
(default 60: a peer that did not come back) is killed, and the supervisor exits 76 for whoever
started it to handle. A training process signalled while it forms its cluster (TensorFlow waits
in C++ for the peers, deaf to SIGTERM) that has not formed it 5 s later is killed, and the
supervisor exits 75: nothing was trained, and a peer that stopped before forming would otherwise
leave it waiting for the scheduler's SIGKILL (137, which Slurm's recipe reads as a crash).
Otherwise, or once restarts are spent, the supervisor ends as the training process ended (its
status, or death by the same signal), so whoever started it sees the task's own result.

Signals (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) are passed on to the training process;
a supervisor signalled is never restarted after (a SIGTERM is a preemption: the training process
saves and exits 75, and so does the supervisor); signalled while no training process runs, it
exits 75 at once (nothing to save). A supervisor killed outright takes its training process with it.

Runs cold, without a supervisor: a command that is not a Python interpreter (`Rscript train.R`:
R embeds Python through reticulate, there is nothing to fork), a Python command without a script,
`-c` or `-m`, and one whose interpreter cannot import TensorFlow.

This file is stdlib-only at its top and never imports kerasdist (each training process imports it
itself, and so installs its SIGTERM guard and reads its settings); `warm_start` is loaded by path.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import re
import select
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import NoReturn

PREEMPTED = 75
PEER_LOST = 76
HUNG = 77  # kerasdist's step watchdog; SIGALRM is its backstop's (kerasdist.preemption.exit)
RESTARTED = (-signal.SIGKILL, PEER_LOST, HUNG, -signal.SIGALRM)  # restarted in place (negative: that signal)
FORMED_FD_VARIABLE = "KERASDIST_SUPERVISOR_FD"  # a training process says there when its cluster forms, formed
DEFAULT_FORM_TIMEOUT = 60.0
# A signalled training process whose cluster is still forming gets this long to form it (then its
# workers agree and all exit 75 themselves) before it is killed: well inside Slurm's KillWait (30 s).
SIGNALLED_FORMING_GRACE = 5.0
FORMING, FORMED = b"1", b"2"  # what a training process writes there
STARTED_AT_VARIABLE = "KERASDIST_PROCESS_STARTED_AT"  # kerasdist.checkpoint.run_log's
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_VALUED_OPTIONS = ("-W", "-X", "--check-hash-based-pycs")  # interpreter options that take the next word
_IN_PLACE = "--in-place"  # (internal) this process is the command's interpreter: supervise
# Read once, at import (`import kerasdist`): the processes a training process starts do not inherit
# the pipe, so they must not inherit its number either (theirs may be another file).
_formed_fd = os.environ.pop(FORMED_FD_VARIABLE, "")


def is_python(program: str) -> bool:
    """Whether `program` names a Python interpreter (python, python3, python3.11, a path to one)."""
    return re.fullmatch(r"python[0-9.]*", os.path.basename(program)) is not None


def split_python_command(argv: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """`[python, OPTIONS..., ENTRY...]` as (OPTIONS, ENTRY), where ENTRY is a script and its
    arguments, or `-c CODE ...`, or `-m MODULE ...`; None when there is no such entry (`python`,
    `python -`, `python -i`)."""
    options: list[str] = []
    words = list(argv[1:])
    while words:
        word = words[0]
        if word in ("-c", "-m"):
            return (options, words) if len(words) >= 2 else None
        if not word.startswith("-"):
            return options, words
        if word in ("-", "-i", "--") or word.startswith("--") and word not in _VALUED_OPTIONS:
            return None
        if word in _VALUED_OPTIONS:
            if len(words) < 2:
                return None
            options += words[:2]
            words = words[2:]
            continue
        options.append(word)
        words = words[1:]
    return None


@dataclass(frozen=True)
class Settings:
    """max_restarts: in-place restarts allowed; form_timeout: seconds a restarted process has to form
    its cluster; restart_log: a file that gets a line per in-place restart (the Slurm recipe's count)."""

    max_restarts: int = 0
    form_timeout: float = DEFAULT_FORM_TIMEOUT
    restart_log: str | None = None

    def as_args(self) -> list[str]:
        args = ["--max-restarts", str(self.max_restarts), "--form-timeout", f"{self.form_timeout:g}"]
        return args + (["--restart-log", self.restart_log] if self.restart_log else [])


def supervise_command(command: Sequence[str], settings: Settings = Settings()) -> list[str]:
    """The argv that runs `command` under a supervisor, or `command` itself when it runs cold (not
    a Python interpreter, or no script, -c or -m to run). A first word ending in .py runs with this
    Python."""
    command = list(command)
    if not command:
        raise ValueError("supervise: no command given: put it after --, e.g. `-- python train.py`.")
    if command[0].endswith(".py"):
        command = [sys.executable, *command]
    parts = split_python_command(command) if is_python(command[0]) else None
    if parts is None:
        return command
    options, entry = parts
    return [command[0], *options, os.path.abspath(__file__), _IN_PLACE, *settings.as_args(), "--", *entry]


def exec_supervised(command: Sequence[str], settings: Settings = Settings()) -> NoReturn:
    """Replace this process with `command` under a supervisor (`supervise_command`)."""
    argv = supervise_command(command, settings)
    program = argv[0] if os.sep in argv[0] else (shutil.which(argv[0]) or argv[0])
    os.execv(program, argv)


# --------------------------------------------------------------------------------------------
# The supervisor itself: the command's interpreter, TensorFlow imported, the training process forked


def _load_warm_start() -> ModuleType:
    """kerasdist.launch.warm_start, loaded by path: importing the package would import kerasdist."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_start.py")
    spec = importlib.util.spec_from_file_location("_kerasdist_warm_start_for_supervisor", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class Supervisor:
    """The training process `argv` (a script, -c or -m and its arguments) forked from this process,
    restarted in place up to `settings.max_restarts` times (see the module docstring); a restarted
    process that has not formed its cluster within `settings.form_timeout` seconds is killed, and
    the supervisor exits 76; each restart is a line in `settings.restart_log` (when given): "TASK
    STATUS", TASK being `$SLURM_PROCID` or a dash."""

    def __init__(self, argv: list[str], settings: Settings):
        self.argv = argv
        self.max_restarts = settings.max_restarts
        self.form_timeout = settings.form_timeout
        self.restart_log = settings.restart_log
        self.child: int | None = None
        self.signalled = 0
        self.signalled_at = 0.0
        self.passed_on = False  # the signal reached the training process
        self.started_at = _started_at()
        for number in _FORWARDED:
            signal.signal(number, self._on_signal)

    def _on_signal(self, number: int, _frame: object) -> None:
        if not self.signalled:
            self.signalled, self.signalled_at = number, time.monotonic()
        self._pass_on(number)

    def _pass_on(self, number: int) -> None:
        if self.child is not None:
            self.passed_on = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child, number)  # its own process group: its children get it too

    def run(self, warm: ModuleType) -> NoReturn:
        restarts = 0
        while True:
            if self.signalled:
                _say(f"signalled ({signal.Signals(self.signalled).name}) with no training process running: "
                     f"nothing to save, exiting {PREEMPTED}")
                os._exit(PREEMPTED)
            status = self._run_once(warm, bounded=restarts > 0)
            code = os.waitstatus_to_exitcode(status)
            if self.signalled or code not in RESTARTED or restarts >= self.max_restarts:
                warm.exit_like(status)
            restarts += 1
            what = {-signal.SIGKILL: "was killed (SIGKILL)", PEER_LOST: f"lost a peer (status {PEER_LOST})",
                    HUNG: f"hung (status {HUNG})", -signal.SIGALRM: "hung in C code (SIGALRM)"}[code]
            _say(f"the training process {what}: restart {restarts} of {self.max_restarts}, in place")
            self._log_restart(code)

    def _run_once(self, warm: ModuleType, bounded: bool) -> int:
        """Fork the training process and wait for it; its wait status. `bounded`: it must form its
        cluster within `form_timeout` (a restart; a first start may wait for peers that start cold)."""
        words, told = os.pipe()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)  # until it has its own handlers
        pid = os.fork()
        if pid == 0:
            os.close(words)
            os.environ[FORMED_FD_VARIABLE] = str(told)
            if not bounded:  # the first: its start-up is the supervisor's (the interpreter, TensorFlow's import)
                os.environ[STARTED_AT_VARIABLE] = f"{self.started_at:.3f}"
            self._become(warm, mask)
        self.child = pid
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if self.signalled and not self.passed_on:  # its handler ran between the fork and `self.child`
            self._pass_on(self.signalled)
        _say(f"supervisor {os.getpid()} forked the training process {pid}")
        os.close(told)
        try:
            status = self._wait(pid, words, bounded)
        finally:
            os.close(words)
        self.child = None
        _give_terminal_to(os.getpgrp(), pid)
        return status

    def _wait(self, pid: int, words: int, bounded: bool) -> int:
        """Its wait status. While it forms its cluster it waits in C++, deaf to SIGTERM, for peers
        that may never come, so it is killed and this process exits: 75 when signalled and the
        cluster has not formed `SIGNALLED_FORMING_GRACE` seconds later (nothing trained, nothing to
        save: a peer that stopped before forming would otherwise leave it to the scheduler's
        SIGKILL); 76 (75 if signalled) when `bounded` and not formed within `form_timeout` (a
        peer that never came back: no restart in place can help)."""
        forming_since = None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            if select.select([words], [], [], 0.1)[0]:
                said = os.read(words, 16)
                if not said or FORMED in said:
                    return os.waitpid(pid, 0)[1]  # formed (or it closed the pipe): nothing more to watch
                forming_since = time.monotonic()
            if forming_since is None:
                continue
            if self.signalled and time.monotonic() > max(forming_since, self.signalled_at) + SIGNALLED_FORMING_GRACE:
                self._end_forming(pid, PREEMPTED, f"signalled ({signal.Signals(self.signalled).name}) while the "
                                  "training process formed its cluster: nothing trained, nothing to save")
            if bounded and time.monotonic() > forming_since + self.form_timeout:
                self._end_forming(pid, PREEMPTED if self.signalled else PEER_LOST, "the restarted training "
                                  f"process did not form its cluster within {self.form_timeout:g} s (a peer did "
                                  "not come back)")

    def _end_forming(self, pid: int, code: int, why: str) -> NoReturn:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # it waits in C++, deaf to SIGTERM, until the cluster forms
        os.waitpid(pid, 0)
        _say(f"{why}: exiting {code}")
        os._exit(code)

    def _become(self, warm: ModuleType, mask: set[signal.Signals]) -> NoReturn:
        parent = os.getppid()
        for number in _FORWARDED:
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setpgid(0, 0)
        _give_terminal_to(os.getpgrp(), os.getpgid(parent))
        _die_with_parent(parent)
        warm.run_forked(self.argv, mask)

    def _log_restart(self, code: int) -> None:
        if self.restart_log:
            task = os.environ.get("SLURM_PROCID", "-")
            with contextlib.suppress(OSError), open(self.restart_log, "a") as log:
                log.write(f"{task} {128 - code if code < 0 else code}\n")


@contextlib.contextmanager
def forming_cluster() -> Iterator[None]:
    """Around the creation of a multi-worker strategy (`select_strategy`): tell the process's
    supervisor, if it has one, that its cluster is forming and then that it formed, so that it
    bounds that wait (a restart's, or any once signalled) and nothing else (a process that never
    says so is never bounded). Said once: a later strategy of the same process is not a start's."""
    global _formed_fd
    fd, _formed_fd = _formed_fd, ""
    _tell(fd, FORMING)
    yield
    _tell(fd, FORMED)
    if fd.isdigit():
        with contextlib.suppress(OSError):
            os.close(int(fd))


def _tell(fd: str, word: bytes) -> None:
    if fd.isdigit():
        with contextlib.suppress(OSError):
            os.write(int(fd), word)


def _started_at() -> float:
    """Unix time this process started (Linux: /proc; elsewhere now)."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/uptime") as uptime:
            return time.time() - (float(uptime.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def _give_terminal_to(group: int, holder: int) -> None:
    """Make process group `group` the foreground of this process's terminal if group `holder` is:
    the training process runs in a group of its own (signals reach its children), and a background
    group that reads the terminal is stopped (SIGTTIN), so a supervised script in a terminal gets
    it as an unsupervised one would, and the supervisor takes it back when the script ends."""
    try:
        if not os.isatty(0) or os.tcgetpgrp(0) != holder:
            return
    except OSError:  # no controlling terminal
        return
    ignored = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may not set it otherwise
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(0, group)
    finally:
        signal.signal(signal.SIGTTOU, ignored)


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when the supervisor dies (killed outright, it cannot pass that on)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before that was set
        os._exit(128 + signal.SIGKILL)


def _say(text: str) -> None:
    """One line on stderr, in one write: the training process shares the terminal, and a line
    written in two parts (print's text, then its end) can take a part of its output between."""
    task = os.environ.get("SLURM_PROCID")
    sys.stderr.write(f"kerasdist supervise{f' (task {task})' if task else ''}: {text}\n")
    sys.stderr.flush()


def supervise(argv: list[str], settings: Settings) -> NoReturn:
    """In the command's interpreter: import TensorFlow and Keras, then run `argv` forked, restarted in
    place (`Supervisor`); cold (`exec`, same pid) when TensorFlow cannot be imported."""
    supervisor = Supervisor(argv, settings)  # signals are handled from here on
    warm = _load_warm_start()
    try:
        warm.import_tensorflow_and_keras()
    except Exception as err:  # noqa: BLE001 - never a wrong process, at worst a cold one
        _say(f"cannot import TensorFlow here ({type(err).__name__}: {err}): running the command cold")
        for number in _FORWARDED:
            signal.signal(number, signal.SIG_DFL)
        os.execv(sys.executable, [sys.executable, *argv])
    supervisor.run(warm)


USAGE = "usage: supervisor.py [--max-restarts R] [--form-timeout S] [--restart-log FILE] -- COMMAND..."


def parse_settings(options: list[str]) -> Settings:
    """`--max-restarts R`, `--form-timeout S` and `--restart-log FILE`, each at most once."""
    given: dict[str, str] = {}
    if len(options) % 2:
        raise ValueError(USAGE)
    for name, value in zip(options[::2], options[1::2], strict=True):
        if name not in ("--max-restarts", "--form-timeout", "--restart-log") or name in given:
            raise ValueError(USAGE)
        given[name] = value
    restarts, timeout = given.get("--max-restarts", "0"), given.get("--form-timeout", f"{DEFAULT_FORM_TIMEOUT:g}")
    if not restarts.isdigit():
        raise ValueError(f"--max-restarts must be a whole number, 0 or more, got {restarts!r}")
    try:
        seconds = float(timeout)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"--form-timeout must be a number of seconds above 0, got {timeout!r}")
    return Settings(int(restarts), seconds, given.get("--restart-log"))


def main(argv: list[str]) -> None:
    in_place = argv[:1] == [_IN_PLACE]
    words = argv[1:] if in_place else argv
    if "--" not in words or words.index("--") == len(words) - 1:
        raise SystemExit(USAGE)
    try:
        settings = parse_settings(words[:words.index("--")])
    except ValueError as err:
        raise SystemExit(str(err)) from None
    command = words[words.index("--") + 1:]
    if in_place:
        supervise(command, settings)
    exec_supervised(command, settings)


if __name__ == "__main__":
    main(sys.argv[1:])
