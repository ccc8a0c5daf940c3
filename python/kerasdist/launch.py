"""The local launcher: start a whole TF_CONFIG cluster on one machine, and restart it on failure.

`launch(["train.py"], num_workers=2)` picks free ports on 127.0.0.1, builds the cluster
`{"worker": ["127.0.0.1:P0", "127.0.0.1:P1"]}` and starts one process per task, each with its own
TF_CONFIG. With `num_ps=P > 0` the cluster also gets P `"ps"` tasks and one `"chief"` task: the
coordinator of ParameterServerStrategy, which TensorFlow runs as task type "chief". Every line a
process writes is echoed with its role and index (`[worker 1] ...`). When one process fails, the
whole group is stopped and started again, so training resumes from the latest checkpoint.

Security: TensorFlow's gRPC runtime has no authentication or encryption. Anyone who can reach
the ports can run operations in the training processes. The launcher picks the ports on `host`
(127.0.0.1 by default) and TF_CONFIG names only `host`, so the processes talk over loopback; but
TensorFlow's server listens on the port on every interface (it binds 0.0.0.0:PORT whatever host
TF_CONFIG names; seen with TF 2.21). Never run it on a machine whose ports an untrusted network
can reach: firewall them, or run inside a container or network namespace without outside access.

POSIX only (process groups and signals).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kerasdist.checkpoint import PREEMPTED_EXIT_CODE

TIMEOUT_EXIT_CODE = 124  # as timeout(1)
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT
PORT_CLASH_RETRIES = 3
_POLL_SECONDS = 0.05
# What a TensorFlow server prints when its port was taken between picking and binding.
_PORT_CLASH = re.compile(r"address already in use|could not start grpc server", re.IGNORECASE)


@dataclass(frozen=True)
class TaskFailure:
    """A process that ended a group: its task, how it ended, and in which attempt.

    Attributes:
        task_type: "chief", "worker" or "ps".
        task_index: index within its task type.
        returncode: the exit status, or minus the signal number if a signal killed it.
        restart: the value of KERASDIST_RESTART the process ran with (0 = first attempt).
    """

    task_type: str
    task_index: int
    returncode: int
    restart: int = 0
    never_up: str = ""  # "did not come up within S s ..." when startup_timeout ran out

    @property
    def task(self) -> str:
        return f"{self.task_type} {self.task_index}"

    @property
    def description(self) -> str:
        """E.g. "worker 1 was killed by SIGKILL" or "worker 1 exited with status 3"."""
        if self.never_up:
            return f"{self.task} {self.never_up}"
        if self.returncode < 0:
            return f"{self.task} was killed by {_signal_name(-self.returncode)}"
        if self.returncode == PREEMPTED_EXIT_CODE:
            return (
                f"{self.task} exited with status {self.returncode} "
                "(preempted, checkpoint saved)"
            )
        return f"{self.task} exited with status {self.returncode}"

    @property
    def exit_code(self) -> int:
        """The status a shell reports for this process: 128 + the signal number if killed."""
        if self.never_up:
            return TIMEOUT_EXIT_CODE
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    def __str__(self) -> str:
        return self.description


@dataclass(frozen=True)
class LaunchResult:
    """How a launch ended.

    Attributes:
        exit_code: 0 when every worker (or, with parameter servers, the chief) finished; the
            failing process's status otherwise (128 + N if signal N killed it), 124 when
            `timeout` was reached, 130 when the launcher was interrupted.
        restarts: how many times the whole group was restarted.
        failures: every failure that stopped a group, oldest first (the last one ended the run
            when `exit_code` is not 0 and the run did not time out).
        timed_out: True when the run was stopped by `timeout`.
        message: one line saying how the run ended.
        cluster: the cluster of the last attempt (task type -> "host:port" addresses).
        port_retries: group starts repeated because a port was taken (not counted as restarts).
    """

    exit_code: int
    restarts: int
    failures: tuple[TaskFailure, ...] = ()
    timed_out: bool = False
    message: str = ""
    cluster: dict[str, list[str]] = field(default_factory=dict)
    port_retries: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def failed(self) -> TaskFailure | None:
        """The failure that ended the run, or None if it succeeded or timed out."""
        if self.ok or self.timed_out or not self.failures:
            return None
        return self.failures[-1]

    def __str__(self) -> str:
        return self.message


def launch(
    command: str | Sequence[str],
    num_workers: int,
    num_ps: int = 0,
    max_restarts: int = 0,
    host: str = "127.0.0.1",
    timeout: float | None = None,
    grace_period: float = 10.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    startup_timeout: float | None = None,
) -> LaunchResult:
    """Run `command` once per task of a local cluster; restart the whole group when one fails.

    Each process gets `TF_CONFIG` (the shared cluster and its own task) and, for convenience,
    `KERASDIST_TASK_TYPE`, `KERASDIST_TASK_INDEX` and `KERASDIST_RESTART` (0 on the first
    attempt, 1 after the first restart, ...). Its output lines are echoed to this process's
    stdout/stderr prefixed with its role and index: `[worker 0] Epoch 1/3`.

    A process fails when it exits with a non-zero status (status 75,
    `kerasdist.PREEMPTED_EXIT_CODE`, "preempted, checkpoint saved", included) or is killed by a
    signal. The launcher then stops every process of the group (SIGTERM to its process group,
    SIGKILL after `grace_period` seconds) and, while restarts remain, starts the whole group
    again on fresh ports, so that training resumes from the latest checkpoint. A group start
    whose server reports its port already taken (the ports are found free, then released, so
    another program may grab one first) is retried up to 3 times without using a restart.

    The run succeeds when every worker has exited with status 0 or, with parameter servers,
    when the chief (the coordinator) has. Tasks still running then (parameter servers and
    parameter-server workers, which serve until stopped) are stopped.

    Security: TensorFlow's gRPC runtime has no authentication. TF_CONFIG names `host`
    (127.0.0.1 by default), but TensorFlow's servers listen on their ports on every interface;
    never expose those ports to an untrusted network (see the module docstring).

    Example:

    ```python
    result = kerasdist.launch(["train.py", "--epochs", "5"], num_workers=2, max_restarts=3)
    if not result.ok:
        print(result.message)  # e.g. "worker 1 was killed by SIGKILL; no restarts left ..."
    ```

    Args:
        command: the program and its arguments, as a list (or one string, split like a shell
            would). A first word ending in `.py` runs with this Python interpreter, one ending
            in `.R` with `Rscript`; anything else must be an executable file or on PATH.
        num_workers: number of "worker" tasks, at least 1.
        num_ps: number of "ps" (parameter server) tasks. With 1 or more, a "chief" task (the
            coordinator) is added to the cluster, so `num_workers + num_ps + 1` processes run.
        max_restarts: how many times the whole group may be restarted after a failure.
        host: the local address the ports are picked on and TF_CONFIG names (the address
            the processes connect to each other on).
        timeout: wall-clock limit in seconds for the whole run, restarts included; None for
            none. When reached, the group is stopped and `exit_code` is 124.
        grace_period: seconds between SIGTERM and SIGKILL when a group is stopped (time for
            `kerasdist` checkpoints to save on SIGTERM).
        env: extra environment variables for every process.
        cwd: working directory of the processes (and of a relative script path).
        startup_timeout: seconds within which every worker and ps task must come up (its
            TensorFlow server accepting connections on its port); a task that does not is named
            ("worker 1 did not come up within 60 s ...") and counts as a failure. None (the
            default) waits as long as TensorFlow does, which is forever.

    Returns:
        A `LaunchResult`: `exit_code`, `restarts`, `failures`, `failed`, `timed_out`, `message`.

    Raises:
        ValueError: naming the argument, before anything starts: `num_workers` < 1,
            `num_ps` < 0, `max_restarts` < 0, `timeout` or `grace_period` not positive, an
            empty `command`, a command or script that does not exist, a `host` this machine
            cannot bind.
    """
    num_workers = _count("num_workers", num_workers, 1)
    num_ps = _count("num_ps", num_ps, 0)
    max_restarts = _count("max_restarts", max_restarts, 0)
    timeout = _seconds("timeout", timeout, allow_none=True)
    grace_period = _seconds("grace_period", grace_period, allow_zero=True)
    startup_timeout = _seconds("startup_timeout", startup_timeout, allow_none=True)
    argv = resolve_command(command, cwd)
    _check_host(host)
    tasks = _task_list(num_workers, num_ps)
    base_env = {**os.environ, **{str(k): str(v) for k, v in (env or {}).items()}}
    base_env.setdefault("PYTHONUNBUFFERED", "1")  # so output lines arrive as they are printed

    deadline = None if timeout is None else time.monotonic() + timeout
    failures: list[TaskFailure] = []
    restart = port_retries = 0
    while True:
        cluster = _build_cluster(tasks, host)
        group = _Group(argv, tasks, cluster, restart, base_env, cwd)
        try:
            outcome = group.run(deadline, startup_timeout, host)
            if outcome.failure is not None:
                group.finish_output_of(outcome.failure)
                _say(f"{outcome.failure.description}; stopping the group.")
        finally:
            group.stop(grace_period)  # on success too: parameter servers never exit by themselves

        timed_out = outcome.timed_out
        if outcome.failure is None and not timed_out:
            done = "the chief" if num_ps else f"all {_plural(num_workers, 'worker')}"
            done += " finished"
            exit_code = 0
            message = done + (f" after {_plural(restart, 'restart')}." if restart else ".")
            break
        if timed_out:
            exit_code = TIMEOUT_EXIT_CODE
            message = (
                f"timeout of {timeout:g} s reached (whole run, {_plural(restart, 'restart')} "
                "so far); the group was stopped."
            )
            break
        failure = outcome.failure
        assert failure is not None
        if outcome.port_clash and port_retries < PORT_CLASH_RETRIES:
            port_retries += 1
            _say(f"a port was already in use; starting the group again on fresh ports "
                 f"(port retry {port_retries} of {PORT_CLASH_RETRIES}).")
            continue
        failures.append(failure)
        if restart >= max_restarts:
            exit_code = failure.exit_code
            message = f"{failure.description}; no restarts left (max_restarts={max_restarts})."
            break
        restart += 1
        _say(f"restarting the group ({restart} of {max_restarts}) on fresh ports.")
    _say(message)
    return LaunchResult(
        exit_code, restart, tuple(failures), timed_out, message, cluster, port_retries
    )


def resolve_command(
    command: str | Sequence[str], cwd: str | os.PathLike[str] | None = None
) -> list[str]:
    """The argv to run for `command`: `x.py` -> this Python, `x.R` -> Rscript; checked to exist.

    Raises:
        ValueError: naming `command`: empty, or the program or script is not found.
    """
    if isinstance(command, str):
        words = shlex.split(command)
    elif isinstance(command, Sequence):
        words = [str(word) for word in command]
    else:
        raise ValueError(
            f"command must be a list of strings (or one string), got {type(command).__name__}."
        )
    if not words or not words[0].strip():
        raise ValueError(
            "command is empty: give the program to run and its arguments, e.g. ['train.py'] "
            "or ['python', 'train.py', '--epochs', '3']."
        )
    base = Path(cwd) if cwd is not None else Path.cwd()
    first, rest = words[0], words[1:]
    if first.endswith(".py"):
        _require_script(first, base)
        return [_python_executable(), first, *rest]
    if first.endswith(".R"):
        _require_script(first, base)
        return [_require_program("Rscript", base), first, *rest]
    program = _require_program(first, base)
    if rest and not rest[0].startswith("-") and rest[0].endswith((".py", ".R")):
        _require_script(rest[0], base)  # `python train.py`: a missing script fails here, not later
    return [program, *rest]


# --------------------------------------------------------------------------------------------
# Argument checks


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, float) and value.is_integer():  # R gives doubles
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}.")
    return value


def _seconds(
    name: str, value: Any, allow_none: bool = False, allow_zero: bool = False
) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}.")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(
            f"{name} must be {'at least 0' if allow_zero else 'more than 0'} seconds, got {value}."
        )
    return float(value)


def _require_script(script: str, base: Path) -> None:
    path = Path(script) if Path(script).is_absolute() else base / script
    if not path.is_file():
        raise ValueError(f"command: the script {script!r} does not exist (looked at {path}).")


def _require_program(program: str, base: Path) -> str:
    if os.sep in program:
        path = Path(program) if Path(program).is_absolute() else base / program
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ValueError(f"command: {program!r} is not an executable file.")
        return program
    found = shutil.which(program)
    if found is None:
        raise ValueError(f"command: {program!r} was not found on PATH.")
    return found


def _python_executable() -> str:
    """This interpreter; under reticulate, sys.executable may name R, so fall back to the env's."""
    if Path(sys.executable).name.startswith("python"):
        return sys.executable
    for name in ("python3", "python"):
        candidate = Path(sys.prefix) / "bin" / name
        if candidate.exists():
            return str(candidate)
    return sys.executable


def _check_host(host: str) -> None:
    if not isinstance(host, str) or not host.strip():
        raise ValueError(f"host must be a non-empty address such as '127.0.0.1', got {host!r}.")
    try:
        _free_ports(host, 1)
    except OSError as err:
        raise ValueError(
            f"host: cannot bind to {host!r} on this machine ({err.strerror or err}); the "
            "launcher starts every task here, so host must be a local address."
        ) from None


# --------------------------------------------------------------------------------------------
# Cluster and ports


def _task_list(num_workers: int, num_ps: int) -> list[tuple[str, int]]:
    tasks = [("chief", 0)] if num_ps else []
    tasks += [("worker", i) for i in range(num_workers)]
    tasks += [("ps", i) for i in range(num_ps)]
    return tasks


def _build_cluster(tasks: list[tuple[str, int]], host: str) -> dict[str, list[str]]:
    """Free ports for every task, re-checked just before use (another program may take one)."""
    for _ in range(5):
        ports = _free_ports(host, len(tasks))
        if all(_port_is_free(host, port) for port in ports):
            break
    address = f"[{host}]" if ":" in host else host
    cluster: dict[str, list[str]] = {}
    for (task_type, _), port in zip(tasks, ports, strict=True):
        cluster.setdefault(task_type, []).append(f"{address}:{port}")
    return cluster


def _free_ports(host: str, count: int) -> list[int]:
    """`count` distinct ports the OS says are free (all bound at once, then released)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------------------------
# One attempt: a group of processes


@dataclass
class _Outcome:
    failure: TaskFailure | None = None
    timed_out: bool = False
    port_clash: bool = False


class _Task:
    def __init__(self, task_type: str, index: int, process: subprocess.Popen[bytes]):
        self.task_type = task_type
        self.index = index
        self.process = process
        self.prefix = f"[{task_type} {index}]"
        self.readers: list[threading.Thread] = []


class _Group:
    """The processes of one attempt. Reader threads queue whole lines; only the calling thread
    writes them out, so lines never mix, and under reticulate no R code runs off R's thread."""

    def __init__(
        self,
        argv: list[str],
        tasks: list[tuple[str, int]],
        cluster: dict[str, list[str]],
        restart: int,
        base_env: Mapping[str, str],
        cwd: str | os.PathLike[str] | None,
    ):
        self.restart = restart
        self.cluster = cluster
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.port_clash = False
        self.tasks: list[_Task] = []
        try:
            for task_type, index in tasks:
                self.tasks.append(self._start(argv, task_type, index, cluster, base_env, cwd))
        except OSError:
            self.stop(0)
            raise

    def _start(self, argv, task_type, index, cluster, base_env, cwd) -> _Task:
        env = dict(base_env)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": task_type, "index": index}}
        )
        env["KERASDIST_TASK_TYPE"] = task_type
        env["KERASDIST_TASK_INDEX"] = str(index)
        env["KERASDIST_RESTART"] = str(self.restart)
        process = subprocess.Popen(
            _dying_with_this_process(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: stopping it reaches its children
        )
        task = _Task(task_type, index, process)
        for pipe, stream in ((process.stdout, "stdout"), (process.stderr, "stderr")):
            reader = threading.Thread(
                target=self._pump, args=(pipe, task.prefix, stream), daemon=True,
                name=f"kerasdist-launch {task.prefix} {stream}",
            )
            reader.start()
            task.readers.append(reader)
        return task

    def _pump(self, pipe: IO[bytes], prefix: str, stream: str) -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if _PORT_CLASH.search(line):
                    self.port_clash = True
                self.lines.put((stream, f"{prefix} {line}\n"))

    def run(self, deadline: float | None, startup_timeout: float | None = None,
            host: str = "127.0.0.1") -> _Outcome:
        """Echo output until the group succeeds, a process fails, or the deadline passes."""
        has_chief = any(t.task_type == "chief" for t in self.tasks)
        finishers = [t for t in self.tasks if t.task_type == ("chief" if has_chief else "worker")]
        startup = _StartupWatch(self.tasks, self.cluster, startup_timeout)
        while True:
            self._echo(wait=_POLL_SECONDS)
            late = startup.late_task()
            if late is not None:
                return _Outcome(failure=late.failure(self.restart))
            for task in self.tasks:
                code = task.process.poll()
                if code is not None and code != 0:
                    failure = TaskFailure(task.task_type, task.index, code, self.restart)
                    return _Outcome(failure=failure, port_clash=self.port_clash)
            if all(t.process.poll() == 0 for t in finishers):
                return _Outcome()
            if deadline is not None and time.monotonic() >= deadline:
                return _Outcome(timed_out=True)

    def finish_output_of(self, failure: TaskFailure) -> None:
        """Echo the failed process's last lines before saying it failed."""
        for task in self.tasks:
            if (task.task_type, task.index) == (failure.task_type, failure.task_index):
                for reader in task.readers:
                    reader.join(timeout=2)
        self._echo()

    def stop(self, grace_period: float) -> None:
        """SIGTERM every running process group, SIGKILL what is left after the grace period."""
        self._signal_running(signal.SIGTERM)
        end = time.monotonic() + grace_period
        while any(t.process.poll() is None for t in self.tasks) and time.monotonic() < end:
            self._echo(wait=_POLL_SECONDS)
        self._signal_running(signal.SIGKILL)
        for task in self.tasks:
            task.process.wait()
            for reader in task.readers:
                reader.join(timeout=2)
        self._echo()

    def _signal_running(self, signum: int) -> None:
        for task in self.tasks:
            if task.process.poll() is None:
                try:
                    os.killpg(task.process.pid, signum)
                except ProcessLookupError:
                    pass

    def _echo(self, wait: float = 0.0) -> None:
        try:
            item = self.lines.get(timeout=wait) if wait else self.lines.get_nowait()
        except queue.Empty:
            return
        while True:
            stream, line = item
            out = sys.stdout if stream == "stdout" else sys.stderr
            out.write(line)
            try:
                item = self.lines.get_nowait()
            except queue.Empty:
                break
        sys.stdout.flush()
        sys.stderr.flush()


class _StartupWatch:
    """Which worker/ps tasks have their server up (port accepting connections), and which one is
    late once `timeout` has passed. Chief tasks are not watched: a coordinator need not serve."""

    _PROBE_SECONDS = 0.5

    def __init__(self, tasks: list[_Task], cluster: dict[str, list[str]], timeout: float | None):
        self.pending = {} if timeout is None else {
            task: cluster[task.task_type][task.index]
            for task in tasks if task.task_type in ("worker", "ps")
        }
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.next_probe = 0.0

    def late_task(self) -> _LateTask | None:
        if not self.pending or time.monotonic() < self.next_probe:
            return None
        self.next_probe = time.monotonic() + self._PROBE_SECONDS
        for task, address in list(self.pending.items()):
            if _accepts_connections(address):
                del self.pending[task]
        if self.pending and self.deadline is not None and time.monotonic() >= self.deadline:
            task, address = next(iter(self.pending.items()))
            return _LateTask(task, address, self.timeout or 0)
        return None


@dataclass
class _LateTask:
    task: _Task
    address: str
    timeout: float

    def failure(self, restart: int) -> TaskFailure:
        return TaskFailure(
            self.task.task_type, self.task.index, TIMEOUT_EXIT_CODE, restart,
            never_up=f"did not come up within {self.timeout:g} s (nothing listens on {self.address})",
        )


# Runs first in each task's process, then execs the task's command in its place (same pid): asks
# Linux to send the task SIGTERM when the launcher dies, so a launcher killed with SIGKILL, which
# cannot stop its group, leaves no training processes behind. (subprocess's preexec_fn would do
# it without the extra exec, but is unsafe with the launcher's output threads running.)
_DIE_WITH_PARENT = """
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):  # the launcher died before the request was made
    sys.exit(128 + signal.SIGTERM)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _dying_with_this_process(argv: list[str]) -> list[str]:
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


def _accepts_connections(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.2):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------------------------
# Small helpers


def _say(message: str) -> None:
    sys.stdout.flush()
    print(f"kerasdist launch: {message}", file=sys.stderr, flush=True)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
