"""One attempt of a launch: the group of task processes, their output, and stopping them.

`ProcessGroup` starts one process per task, each with its own TF_CONFIG, in its own process group
(so stopping it reaches its children) and, on Linux, set to get SIGTERM when the launcher dies.
Every line a process writes is echoed with its role and index (`[worker 1] ...`). `run()` waits
until the group succeeds, a process fails or does not come up in time, or the deadline passes;
`stop()` sends SIGTERM and, after the grace period, SIGKILL.

POSIX only (process groups and signals).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO

from kerasdist.launch.command import python_executable
from kerasdist.launch.ports import accepts_connections, port_clash
from kerasdist.launch.result import TIMEOUT_EXIT_CODE, TaskFailure
from kerasdist.launch.warm_start import client_command, dying_with_parent
from kerasdist.preemption import PEER_LOST_EXIT_CODE
from kerasdist.startup import is_start_up_noise

_POLL_SECONDS = 0.05


@dataclass
class Outcome:
    """How one attempt ended: a failed task, the deadline, or (neither) success."""

    failure: TaskFailure | None = None
    timed_out: bool = False
    port_clash: bool = False
    exit_codes: dict[str, int] = field(default_factory=dict)  # every task's status once the group stopped


class _Task:
    def __init__(self, task_type: str, index: int, process: subprocess.Popen[bytes]):
        self.task_type = task_type
        self.index = index
        self.process = process
        self.prefix = f"[{task_type} {index}]"
        self.readers: list[threading.Thread] = []


class ProcessGroup:
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
        warm_socket: str | None = None,
    ):
        self.restart = restart
        self.warm_socket = warm_socket
        self.cluster = cluster
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.port_clash = False
        self.tasks: list[_Task] = []
        try:
            for task_type, index in tasks:
                self.tasks.append(self._start(argv, task_type, index, base_env, cwd))
        except OSError:
            self.stop(0)
            raise

    def _start(self, argv, task_type, index, base_env, cwd) -> _Task:
        env = dict(base_env)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": self.cluster, "task": {"type": task_type, "index": index}}
        )
        env["KERASDIST_TASK_TYPE"] = task_type
        env["KERASDIST_TASK_INDEX"] = str(index)
        env["KERASDIST_RESTART"] = str(self.restart)
        process = subprocess.Popen(
            _task_command(argv, self.warm_socket), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
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
                if port_clash(line):
                    self.port_clash = True
                if not is_start_up_noise(line):
                    self.lines.put((stream, f"{prefix} {line}\n"))

    def run(self, deadline: float | None, startup_timeout: float | None = None) -> Outcome:
        """Echo output until the group succeeds, a process fails, or the deadline passes."""
        has_chief = any(t.task_type == "chief" for t in self.tasks)
        finishers = [t for t in self.tasks if t.task_type == ("chief" if has_chief else "worker")]
        startup = _StartupWatch(self.tasks, self.cluster, startup_timeout)
        while True:
            self._echo(wait=_POLL_SECONDS)
            late = startup.late_task()
            if late is not None:
                return Outcome(failure=late.failure(self.restart))
            failed = [task for task in self.tasks if task.process.poll() not in (None, 0)]
            if failed:
                # A peer-lost exit (76) follows another task's failure: name that one when both are seen.
                task = next((t for t in failed if t.process.returncode != PEER_LOST_EXIT_CODE), failed[0])
                for reader in task.readers:  # its last lines may say why (a port clash)
                    reader.join(timeout=2)
                failure = TaskFailure(task.task_type, task.index, task.process.returncode, self.restart)
                return Outcome(failure=failure, port_clash=self.port_clash)
            if all(t.process.poll() == 0 for t in finishers):
                return Outcome()
            if deadline is not None and time.monotonic() >= deadline:
                return Outcome(timed_out=True)

    def finish_output_of(self, failure: TaskFailure) -> None:
        """Echo the failed process's last lines before saying it failed."""
        for task in self.tasks:
            if (task.task_type, task.index) == (failure.task_type, failure.task_index):
                for reader in task.readers:
                    reader.join(timeout=2)
        self._echo()

    def stop(self, grace_period: float, settle: bool = False) -> None:
        """SIGTERM every running process group, SIGKILL what is left after the grace period.

        `settle` (a worker exited preempted, status 75): first give the others the grace period
        to finish on their own, since under multi-worker they stop at the same agreed step."""
        if settle:
            self._wait_all(time.monotonic() + grace_period)
        self._signal_running(signal.SIGTERM)
        self._wait_all(time.monotonic() + grace_period)
        self._signal_running(signal.SIGKILL)
        for task in self.tasks:
            task.process.wait()
            for reader in task.readers:
                reader.join(timeout=2)
        self._echo()

    def exit_codes(self) -> dict[str, int]:
        """Each task's status ("worker 1" -> 75), minus the signal number if a signal ended it."""
        return {f"{t.task_type} {t.index}": t.process.returncode for t in self.tasks}

    def _wait_all(self, end: float) -> None:
        while any(t.process.poll() is None for t in self.tasks) and time.monotonic() < end:
            self._echo(wait=_POLL_SECONDS)

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
            if accepts_connections(address):
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


def _task_command(argv: list[str], warm_socket: str | None) -> list[str]:
    """The task's argv, forked from the warm-start server when there is one and it is this
    Python's, set (on Linux) to get SIGTERM when the launcher dies, so that a launcher killed with
    SIGKILL, which cannot stop its group, leaves no training processes behind. (subprocess's
    preexec_fn would do it without the extra exec, but is unsafe with the output threads running.)"""
    python = python_executable()
    if warm_socket and argv[0] == python:
        argv = client_command(warm_socket, argv)
    return dying_with_parent(argv, python)
