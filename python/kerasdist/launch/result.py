"""How a launch ended: `TaskFailure` (the process that stopped a group), `LaunchResult` (the whole
run), the exit codes, and the one-line messages the launcher prints."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from kerasdist.preemption import HUNG_EXIT_CODE, PEER_LOST_EXIT_CODE, PREEMPTED_EXIT_CODE
from kerasdist.preemption.exit import HANG_BACKSTOP_SIGNAL

TIMEOUT_EXIT_CODE = 124  # as timeout(1)
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT


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
        if self.returncode == -HANG_BACKSTOP_SIGNAL:
            return (f"{self.task} was killed by {_signal_name(-self.returncode)} (hung in C code that holds the "
                    "GIL: the step watchdog's backstop)")
        if self.returncode < 0:
            return f"{self.task} was killed by {_signal_name(-self.returncode)}"
        if self.returncode == PREEMPTED_EXIT_CODE:
            return (
                f"{self.task} exited with status {self.returncode} "
                "(preempted, checkpoint saved)"
            )
        if self.returncode == PEER_LOST_EXIT_CODE:
            return f"{self.task} exited with status {self.returncode} (a peer was lost; newest checkpoint intact)"
        if self.returncode == HUNG_EXIT_CODE:
            return f"{self.task} exited with status {self.returncode} (hung: no training step for hang_timeout)"
        return f"{self.task} exited with status {self.returncode}"

    @property
    def is_hang(self) -> bool:
        """Whether the process ended because training stopped stepping (its watchdog or backstop)."""
        return self.returncode in (HUNG_EXIT_CODE, -HANG_BACKSTOP_SIGNAL)

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
            `timeout` was reached or a task did not come up within `startup_timeout`. An
            interrupted `launch()` raises KeyboardInterrupt (after stopping the group); the
            `kerasdist launch` command then exits 130 (`INTERRUPTED_EXIT_CODE`).
        restarts: how many times the whole group was restarted.
        failures: every failure that stopped a group, oldest first (the last one ended the run
            when `exit_code` is not 0 and the run did not time out).
        timed_out: True when the run was stopped by `timeout`.
        message: one line saying how the run ended.
        cluster: the cluster of the last attempt (task type -> "host:port" addresses).
        port_retries: group starts repeated because a port was taken (not counted as restarts).
        exit_codes: per attempt (port retries included), every task's exit status once the group
            stopped, e.g. `({"worker 0": 75, "worker 1": 75}, {"worker 0": 0, "worker 1": 0})`;
            minus the signal number for a task a signal ended.
        num_workers: the workers of the last attempt: fewer than asked once a group went on
            without one (`min_workers`).
    """

    exit_code: int
    restarts: int
    failures: tuple[TaskFailure, ...] = ()
    timed_out: bool = False
    message: str = ""
    cluster: dict[str, list[str]] = field(default_factory=dict)
    port_retries: int = 0
    exit_codes: tuple[dict[str, int], ...] = ()
    num_workers: int = 0

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


# --------------------------------------------------------------------------------------------
# What the launcher says


def finished_message(num_workers: int, num_ps: int, restarts: int) -> str:
    """E.g. "all 2 workers finished after 1 restart." or "the chief finished."."""
    done = "the chief" if num_ps else f"all {plural(num_workers, 'worker')}"
    return f"{done} finished" + (f" after {plural(restarts, 'restart')}." if restarts else ".")


def timeout_message(timeout: float, restarts: int) -> str:
    return (
        f"timeout of {timeout:g} s reached (whole run, {plural(restarts, 'restart')} so far); "
        "the group was stopped."
    )


def no_restarts_message(failure: TaskFailure, max_restarts: int) -> str:
    return f"{failure.description}; no restarts left (max_restarts={max_restarts})."


def shrink_message(failure: TaskFailure, max_restarts: int, workers: int, min_workers: int) -> str:
    return (f"{failure.description}; no restarts left at this size (max_restarts={max_restarts}): going on with "
            f"{plural(workers, 'worker')} (min_workers={min_workers}) on fresh ports.")


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
