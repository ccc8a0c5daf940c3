"""`launch()`: run a command once per task of a local cluster, and restart the group on failure.

The story of a run: check the arguments, then start attempts until one ends it. Each attempt
picks fresh ports (`ports`), starts the group (`process_group`), waits for it to succeed, fail or
time out, and stops it; a failure restarts the group while restarts remain. `result` holds what
the run returns and the lines it prints.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kerasdist.launch.command import python_executable, resolve_command
from kerasdist.launch.ports import PORT_CLASH_RETRIES, build_cluster, check_host
from kerasdist.launch.process_group import Outcome, ProcessGroup
from kerasdist.launch.result import (
    TIMEOUT_EXIT_CODE,
    LaunchResult,
    TaskFailure,
    finished_message,
    no_restarts_message,
    shrink_message,
    timeout_message,
)
from kerasdist.launch.warm_start import SOCKET_VARIABLE, WarmServer
from kerasdist.preemption import PREEMPTED_EXIT_CODE
from kerasdist.validation import integer, optional_boolean


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
    min_workers: int | None = None,
    warm_start: bool | None = None,
) -> LaunchResult:
    """Run `command` once per task of a local cluster; restart the whole group when one fails.

    Each process gets `TF_CONFIG` (the shared cluster and its own task) and, for convenience,
    `KERASDIST_TASK_TYPE`, `KERASDIST_TASK_INDEX` and `KERASDIST_RESTART` (0 on the first
    attempt, 1 after the first restart, ...). Its output lines are echoed to this process's
    stdout/stderr prefixed with its role and index: `[worker 0] Epoch 1/3`.

    A process fails when it exits with a non-zero status (status 75,
    `kerasdist.PREEMPTED_EXIT_CODE`, "preempted, checkpoint saved", and 77,
    `kerasdist.HUNG_EXIT_CODE`, "no training step for hang_timeout", included) or is killed by a
    signal. The launcher then stops every process of the group (SIGTERM to its process group,
    SIGKILL after `grace_period` seconds; after a status 75 or a hang it first gives the others
    `grace_period` seconds to finish on their own, as multi-worker kerasdist runs stop together
    on preemption, and their step watchdogs fire together on a hang) and, while restarts remain,
    starts the whole group
    again on fresh ports, so that training resumes from the latest checkpoint. With
    `min_workers` below `num_workers`, a group that still fails once its restarts are used up
    goes on with one worker fewer (TF_CONFIG then names the workers left; kerasdist resumes the
    newest checkpoint with the same global batch, more samples per worker), with `max_restarts`
    restarts again, down to `min_workers`. A group start
    whose server reports its port already taken (the ports are found free, then released, so
    another program may grab one first) is retried up to 3 times without using a restart.

    The run succeeds when every worker has exited with status 0 or, with parameter servers,
    when the chief (the coordinator) has. Tasks still running then (parameter servers and
    parameter-server workers, which serve until stopped) are stopped.

    Security: TensorFlow's gRPC runtime has no authentication. TF_CONFIG names `host`
    (127.0.0.1 by default), but TensorFlow's servers bind `0.0.0.0:PORT` whatever it says: never
    expose those ports to an untrusted network (firewall them, or use a container or network
    namespace without outside access).

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
        max_restarts: how many times the whole group may be restarted after a failure (at each
            size, with `min_workers`).
        host: the local address the ports are picked on and TF_CONFIG names (the address
            the processes connect to each other on).
        timeout: wall-clock limit in seconds for the whole run, restarts included; None for
            none. When reached, the group is stopped and `exit_code` is 124.
        grace_period: seconds between SIGTERM and SIGKILL when a group is stopped (time for
            checkpoints to save on SIGTERM); 0 or more (0 sends SIGKILL at once).
        env: extra environment variables for every process.
        cwd: working directory of the processes (and of a relative script path); None: the
            current one.
        startup_timeout: seconds within which every worker and ps task must come up (its
            TensorFlow server accepting connections on its port); a task that does not is named
            ("worker 1 did not come up within 60 s ...") and counts as a failure (exit code
            124 when it ends the run). None (the
            default) waits as long as TensorFlow does, which is forever.
        min_workers: the fewest workers to go on with when failures outlast `max_restarts`;
            None (the default) is `num_workers`: never fewer. Not with parameter servers.
        warm_start: fork each Python task (a `.py` command) from a process that has already
            imported TensorFlow and Keras (`kerasdist.launch.warm_start`), so that
            starts and restarts skip that import (about 6 s of CPU each). True starts such a
            server for the run (or uses the one `KERASDIST_WARM_START` names); None (the
            default) uses `KERASDIST_WARM_START`'s if set; False never. A task whose environment
            differs from the server's in what the import reads (TF_*, KERAS_*, PYTHON*, ...)
            starts cold, as without it.

    Returns:
        A `LaunchResult`: `exit_code`, `restarts`, `failures`, `failed`, `timed_out`, `message`.

    Raises:
        ValueError: naming the argument, before anything starts: `num_workers` < 1,
            `num_ps` < 0, `max_restarts` < 0, `min_workers` not within 1..`num_workers` (or
            set with parameter servers), `timeout` or `startup_timeout` not positive,
            `grace_period` negative (0 sends SIGKILL at once), an
            empty `command`, a command or script that does not exist, a `host` this machine
            cannot bind.
    """
    num_workers = integer("num_workers", num_workers, 1)
    num_ps = integer("num_ps", num_ps, 0)
    max_restarts = integer("max_restarts", max_restarts, 0)
    min_workers = _min_workers(min_workers, num_workers, num_ps)
    timeout = _seconds("timeout", timeout, allow_none=True)
    grace_period = _seconds("grace_period", grace_period, allow_zero=True)
    startup_timeout = _seconds("startup_timeout", startup_timeout, allow_none=True)
    optional_boolean("warm_start", warm_start)
    argv = resolve_command(command, cwd)
    check_host(host)
    tasks = _task_list(num_workers, num_ps)
    base_env = _task_environment(env)

    deadline = None if timeout is None else time.monotonic() + timeout
    server = _warm_server(warm_start, argv, base_env, deadline)
    warm_socket = server.socket_path if isinstance(server, WarmServer) else server
    try:
        failures: list[TaskFailure] = []
        exit_codes: list[dict[str, int]] = []
        restart, restarts_at_size, port_retries, workers = 0, 0, 0, num_workers
        while True:
            cluster = build_cluster(tasks, host)
            group = ProcessGroup(argv, tasks, cluster, restart, base_env, cwd, warm_socket)
            outcome = _attempt(group, deadline, startup_timeout, grace_period)
            exit_codes.append(outcome.exit_codes)
            if outcome.timed_out:
                exit_code, message = TIMEOUT_EXIT_CODE, timeout_message(timeout, restart)
                break
            if outcome.failure is None:
                exit_code, message = 0, finished_message(workers, num_ps, restart)
                break
            if outcome.port_clash and port_retries < PORT_CLASH_RETRIES:
                port_retries += 1
                _say(f"a port was already in use; starting the group again on fresh ports "
                     f"(port retry {port_retries} of {PORT_CLASH_RETRIES}).")
                continue
            failures.append(outcome.failure)
            if restarts_at_size >= max_restarts and workers <= min_workers:
                exit_code = outcome.failure.exit_code
                message = no_restarts_message(outcome.failure, max_restarts)
                break
            restart += 1
            if restarts_at_size < max_restarts:
                restarts_at_size += 1
                _say(f"restarting the group ({restarts_at_size} of {max_restarts}) on fresh ports.")
            else:  # restarts used up at this size: go on without one worker
                workers, restarts_at_size = workers - 1, 0
                tasks = _task_list(workers, num_ps)
                _say(shrink_message(outcome.failure, max_restarts, workers, min_workers))
    finally:
        if isinstance(server, WarmServer):
            server.stop()
    _say(message)
    return LaunchResult(
        exit_code, restart, tuple(failures), outcome.timed_out, message, cluster, port_retries,
        tuple(exit_codes), workers,
    )


def _attempt(
    group: ProcessGroup, deadline: float | None, startup_timeout: float | None,
    grace_period: float,
) -> Outcome:
    """Run one group to its end, and stop it (on success too: parameter servers never exit)."""
    outcome = Outcome()
    try:
        outcome = group.run(deadline, startup_timeout)
        if outcome.failure is not None:
            group.finish_output_of(outcome.failure)
            _say(f"{outcome.failure.description}; stopping the group.")
    finally:
        # After a preemption (75) or a hang (77), the other workers end on their own: they stop at the
        # same agreed step, or their watchdogs fire too (a SIGTERM cannot reach a stuck step).
        failure = outcome.failure
        settle = failure is not None and (failure.returncode == PREEMPTED_EXIT_CODE or failure.is_hang)
        group.stop(grace_period, settle=settle)
        outcome.exit_codes = group.exit_codes()
    return outcome


def _warm_server(warm_start: bool | None, argv: list[str], base_env: dict[str, str],
                 deadline: float | None) -> WarmServer | str | None:
    """The warm-start server's socket (one named by KERASDIST_WARM_START) or one started for this
    run; None when not asked for, not a Python command, or the server did not come up."""
    named = base_env.get(SOCKET_VARIABLE) or None
    if warm_start is False or argv[0] != python_executable():
        return None
    if named or not warm_start:
        return named
    server = WarmServer(argv[0], base_env)
    wait = 300.0 if deadline is None else max(0.0, deadline - time.monotonic())
    if server.wait_ready(wait):
        return server
    _say(f"warm start is off for this run: its server did not come up ({server.why_not_ready()}).")
    server.stop()
    return None


def _task_environment(env: Mapping[str, Any] | None) -> dict[str, str]:
    """This process's environment with `env` on top, as every task starts from."""
    base_env = {**os.environ, **{str(k): str(v) for k, v in (env or {}).items()}}
    base_env.setdefault("PYTHONUNBUFFERED", "1")  # so output lines arrive as they are printed
    return base_env


def _task_list(num_workers: int, num_ps: int) -> list[tuple[str, int]]:
    tasks = [("chief", 0)] if num_ps else []
    tasks += [("worker", i) for i in range(num_workers)]
    tasks += [("ps", i) for i in range(num_ps)]
    return tasks


def _say(message: str) -> None:
    """One line on stderr, in one write, so that the workers' output sharing it cannot split it."""
    sys.stdout.flush()
    sys.stderr.write(f"kerasdist launch: {message}\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------------------------
# Argument checks


def _min_workers(min_workers: Any, num_workers: int, num_ps: int) -> int:
    if min_workers is None:
        return num_workers
    min_workers = integer("min_workers", min_workers, 1)
    if min_workers > num_workers:
        raise ValueError(f"min_workers must be at most num_workers ({num_workers}), got {min_workers}.")
    if num_ps and min_workers < num_workers:
        raise ValueError("min_workers is for groups without parameter servers (num_ps=0): a parameter-server "
                         f"group does not go on with fewer workers; got min_workers={min_workers}, num_ps={num_ps}.")
    return min_workers


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

