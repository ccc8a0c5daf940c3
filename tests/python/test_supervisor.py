"""Warm restarts in place (kerasdist.launch.supervisor, `kerasdist supervise`): two supervised
workers of a TF_CONFIG cluster on 127.0.0.1 (no Slurm) train examples/slurm/train.py; one's
training process is SIGKILLed and both restart in place, forked by the same supervisors, resume
from the checkpoint and complete. The Slurm recipe's use of it is in test_slurm.py."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import kerasdist
from kerasdist.launch import supervisor
from kerasdist.launch.ports import accepts_connections, free_ports

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "slurm" / "train.py"
SUPERVISOR = Path(supervisor.__file__)
STEP = re.compile(r"^step (\d+)$", re.M)
FORKED = re.compile(r"^kerasdist supervise: supervisor (\d+) forked the training process (\d+)$", re.M)


class Worker:
    """One supervised task: its supervisor process and its output file."""

    def __init__(self, index: int, cluster: dict, run: Path, options: list[str]):
        self.log = run / f"worker{index}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}
        # --in-place: the supervisor itself, started warm by the tests' server (the exec of
        # `kerasdist supervise` into the command's interpreter would start it cold)
        command = [sys.executable, str(SUPERVISOR), "--in-place", *options, "--", str(TRAIN),
                   "--checkpoint-dir", str(run / "ckpt"), "--out-dir", str(run / f"out{index}"),
                   "--step-seconds", "0.1"]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def forked(self) -> list[tuple[int, int]]:
        """(supervisor, training process) of each fork so far, as the supervisor said them."""
        return [(int(a), int(b)) for a, b in FORKED.findall(self.output())]

    def training_process(self) -> int:
        """The training process the supervisor forked last, once it has one."""
        deadline = time.monotonic() + 120
        while not self.forked():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no training process forked:\n{self.output()}")
            time.sleep(0.05)
        return self.forked()[-1][1]

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


def start_cluster(run: Path, options: tuple[list[str], list[str]] = (["--max-restarts", "3"],) * 2) -> list[Worker]:
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports("127.0.0.1", 2)]}
    return [Worker(index, cluster, run, options[index]) for index in range(2)]


def wait_for_step(worker: Worker, step: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while step not in [int(s) for s in STEP.findall(worker.output())]:
        if time.monotonic() > deadline or worker.process.poll() is not None:
            raise AssertionError(f"no step {step}:\n{worker.output()[-3000:]}")
        time.sleep(0.05)


def weights(run: Path, task: int) -> list[np.ndarray]:
    with np.load(run / f"out{task}" / "weights-task0.npz") as data:  # (train.py names it by SLURM_PROCID)
        return [data[name] for name in data.files]


@pytest.mark.parametrize("victim", [1, 0], ids=["worker-killed", "chief-killed"])
def test_a_killed_training_process_is_forked_again_by_both_supervisors_and_training_resumes_and_completes(
        tmp_path, victim):
    workers = start_cluster(tmp_path)
    wait_for_step(workers[0], 8)
    os.kill(workers[victim].training_process(), signal.SIGKILL)
    codes = [w.wait() for w in workers]
    outputs = [w.output() for w in workers]
    assert codes == [0, 0], outputs
    # each supervisor restarted its own training process once, in place: the killed one at once, the
    # other once it had lost its peer (76); the supervisors are the processes that were started
    assert "the training process was killed (SIGKILL): restart 1 of 3, in place" in outputs[victim], outputs[victim]
    assert "the training process lost a peer (status 76): restart 1 of 3, in place" in outputs[1 - victim], outputs
    for worker in workers:  # one supervisor each, which forked both training processes
        forks = worker.forked()
        assert len(forks) == 2 and forks[0][0] == forks[1][0] and forks[0][1] != forks[1][1], forks
    for output in outputs:
        assert output.count(", in place") == 1 and "task 0 done: 2 replicas" in output, output
    # resumed from the checkpoint (one every step). A step's line comes before its save: killed just
    # after printing step S, the chief's background save of S - 1 may still have been in flight
    chief = outputs[0]
    restart = chief.index(", in place")
    before, after = [int(s) for s in STEP.findall(chief[:restart])], [int(s) for s in STEP.findall(chief[restart:])]
    assert before[-1] - 1 <= after[0] <= before[-1] + 1 and after[0] >= 7 and after[-1] == 30, (before, after)
    assert all(np.array_equal(a, b) for a, b in zip(weights(tmp_path, 0), weights(tmp_path, 1), strict=True))
    # the chief's run log: two attempts, the second a forked process (no interpreter start)
    report = kerasdist.goodput(tmp_path / "ckpt")
    assert [a.status for a in report.attempts][1:] == ["completed"] and len(report.attempts) == 2, str(report)


def test_a_second_kill_during_the_recovery_is_restarted_in_place_too(tmp_path):
    """Worker 1's training process is killed, then the chief's new one while it forms the new
    cluster: each supervisor forks again, and training still completes on both."""
    workers = start_cluster(tmp_path)
    wait_for_step(workers[0], 8)
    os.kill(workers[1].training_process(), signal.SIGKILL)
    deadline = time.monotonic() + 120
    while len(workers[0].forked()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(workers[0].training_process(), signal.SIGKILL)
    codes = [w.wait() for w in workers]
    outputs = [w.output() for w in workers]
    assert codes == [0, 0], outputs
    assert "restart 2 of 3, in place" in outputs[0] and len(workers[0].forked()) == 3, outputs[0]
    assert all("task 0 done: 2 replicas" in output for output in outputs), outputs


def test_a_sigterm_to_a_supervisor_is_a_preemption_its_training_process_saves_and_it_exits_75(tmp_path):
    workers = start_cluster(tmp_path)
    wait_for_step(workers[0], 5)
    workers[1].process.send_signal(signal.SIGTERM)  # a supervisor only: it passes it on
    codes = [w.wait() for w in workers]
    outputs = [w.output() for w in workers]
    assert codes == [kerasdist.PREEMPTED_EXIT_CODE] * 2, outputs
    assert not any(", in place" in output for output in outputs), outputs
    resumed_from = [row["global_step"] for row in kerasdist.checkpoint_table(tmp_path / "ckpt") if row["restart"]]
    assert resumed_from == [max(int(s) for s in STEP.findall(outputs[0]))], outputs[0][-2000:]


def test_a_restarted_process_whose_peer_does_not_come_back_is_killed_and_its_supervisor_exits_76(tmp_path):
    """Worker 1 may not restart (--max-restarts 0): when the chief's training process is killed, its
    new one waits for a peer that never comes; after --form-timeout its supervisor ends it, 76."""
    workers = start_cluster(tmp_path, (["--max-restarts", "1", "--form-timeout", "5"], ["--max-restarts", "0"]))
    wait_for_step(workers[0], 3)
    os.kill(workers[0].training_process(), signal.SIGKILL)
    assert workers[1].wait() == kerasdist.PEER_LOST_EXIT_CODE, workers[1].output()
    assert workers[0].wait() == kerasdist.PEER_LOST_EXIT_CODE, workers[0].output()
    assert "did not form its cluster within 5 s (a peer did not come back): exiting 76" in workers[0].output()


def test_a_supervisor_signalled_while_its_first_cluster_forms_ends_its_training_process_and_exits_75(tmp_path):
    """Worker 1 never starts, so worker 0's training process waits for it in TensorFlow's C++,
    deaf to SIGTERM (a peer that stopped before forming: the Slurm recipe's time-limit warning in
    start-up). Signalled, its supervisor gives it SIGNALLED_FORMING_GRACE seconds to form, then
    kills it and exits 75: without that, only the scheduler's SIGKILL would end the task."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports("127.0.0.1", 2)]}
    worker = Worker(0, cluster, tmp_path, ["--max-restarts", "3"])
    training = worker.training_process()
    deadline = time.monotonic() + 180
    while not accepts_connections(cluster["worker"][0]):  # its server is up: it waits for worker 1
        assert time.monotonic() < deadline and worker.process.poll() is None, worker.output()
        time.sleep(0.1)
    worker.process.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=120) == kerasdist.PREEMPTED_EXIT_CODE, worker.output()
    assert ("signalled (SIGTERM) while the training process formed its cluster: nothing trained, nothing to "
            "save: exiting 75") in worker.output()
    assert not Path(f"/proc/{training}").exists() and not (tmp_path / "ckpt").exists()


def test_the_command_line_splits_interpreter_options_from_the_entry_and_runs_other_commands_cold():
    python = sys.executable
    assert supervisor.split_python_command([python, "-u", "-X", "dev", "train.py", "-x"]) == (
        ["-u", "-X", "dev"], ["train.py", "-x"])
    assert supervisor.split_python_command([python, "-m", "pkg", "a"]) == ([], ["-m", "pkg", "a"])
    assert supervisor.split_python_command([python, "-i"]) is None
    assert supervisor.split_python_command([python]) is None
    settings = supervisor.Settings(2, 30.0, "/tmp/log")
    assert supervisor.supervise_command(["Rscript", "train.R"], settings) == ["Rscript", "train.R"]
    assert supervisor.supervise_command([python, "-u", "t.py", "a"], settings) == [
        python, "-u", str(SUPERVISOR), "--in-place", "--max-restarts", "2", "--form-timeout", "30",
        "--restart-log", "/tmp/log", "--", "t.py", "a"]
    assert supervisor.supervise_command(["t.py"])[0] == sys.executable
    with pytest.raises(ValueError, match="--max-restarts must be a whole number, 0 or more, got '-1'"):
        supervisor.parse_settings(["--max-restarts", "-1"])
    with pytest.raises(ValueError, match="--form-timeout must be a number of seconds above 0, got 'soon'"):
        supervisor.parse_settings(["--form-timeout", "soon"])


@pytest.mark.cold_start
def test_kerasdist_supervise_runs_a_command_that_is_not_python_as_it_is_and_ends_with_its_status(tmp_path):
    result = subprocess.run([sys.executable, "-m", "kerasdist_cli", "supervise", "--", "bash", "-c",
                             "echo $$; exit 3"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 3 and result.stdout.strip().isdigit(), result
    result = subprocess.run([sys.executable, "-m", "kerasdist_cli", "supervise", "--max-restarts", "x", "--",
                             "bash"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--max-restarts" in result.stderr, result


def test_a_supervised_script_in_a_terminal_reads_it_before_and_after_a_restart_in_place(tmp_path):
    """The training process runs in a process group of its own: without the terminal handed to
    it, its first read of the terminal stopped it (SIGTTIN) for good."""
    script = tmp_path / "reads.py"
    script.write_text(
        "import os, signal\n"
        "print('got', input(), flush=True)\n"
        f"if not os.path.exists({str(tmp_path / 'killed')!r}):\n"
        f"    open({str(tmp_path / 'killed')!r}, 'w').close()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n")
    pid, terminal = pty.fork()
    if pid == 0:  # a session of its own, the pty its controlling terminal, the supervisor in the foreground
        # under a shell that outlives it, as in a terminal: when a session's leader exits, the
        # kernel hangs the terminal up and drops what was written to it but not read yet
        supervised = f"{shlex.quote(sys.executable)} {shlex.quote(str(SUPERVISOR))} --in-place --max-restarts 1 -- "
        os.execv("/bin/sh", ["sh", "-c", supervised + shlex.quote(str(script)) + "; code=$?; read done; exit $code"])
    try:
        shown = TerminalReader(terminal)
        shown.until(b"forked the training process")
        os.write(terminal, b"one\n")
        shown.until(b"restart 1 of 1, in place")
        shown.until(b"forked the training process")
        os.write(terminal, b"two\n")
        said = shown.until(b"got two")
        assert b"got one" in said
        os.write(terminal, b"done\n")
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, said.decode(errors="replace")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # the shell and the supervisor (the training process dies with it)
        os.close(terminal)


class TerminalReader:
    """What a pty's other end shows, read on demand: `until(expected)` reads until `expected`
    appears after the previous match (two lines can come in one read) and returns all shown."""

    def __init__(self, terminal: int):
        self.terminal, self.said, self.checked = terminal, b"", 0

    def until(self, expected: bytes, timeout: float = 90) -> bytes:
        deadline = time.monotonic() + timeout
        while (found := self.said.find(expected, self.checked)) < 0:
            shown = self.said.decode(errors="replace")
            if not select.select([self.terminal], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError(f"{expected!r} not seen on the terminal; it showed:\n{shown}")
            try:
                self.said += os.read(self.terminal, 4096)
            except OSError as err:  # EIO: every process of the terminal's session has closed it
                raise AssertionError(f"{expected!r} not seen before the terminal closed ({err}); it showed:\n"
                                     f"{shown}") from err
        self.checked = found + len(expected)
        return self.said


def test_the_pipe_to_the_supervisor_is_named_only_to_the_training_process_not_to_what_it_starts():
    variable = supervisor.FORMED_FD_VARIABLE
    code = ("import os, subprocess, sys\n"
            "import kerasdist\n"
            f"print(subprocess.run([sys.executable, '-S', '-c', 'import os; print(os.environ.get(\"{variable}\"))'],"
            " capture_output=True, text=True).stdout.strip())\n"
            "from kerasdist.launch import supervisor\n"
            "print(supervisor._formed_fd)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, supervisor.FORMED_FD_VARIABLE: "7"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["None", "7"]
