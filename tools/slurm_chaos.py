"""Preempt the Slurm recipe at random instants on a real cluster and check every job ends equal.

usage: python tools/slurm_chaos.py [--trials 20] [--seed 0] [--hosts 2] [--r] [--out FILE.json]
       python tools/slurm_chaos.py --recovery 10 [--kinds sigkill chief preemption] [--out FILE.json]
       python tools/slurm_chaos.py --goodput-minutes 15 [--kill-every 180] [--every-steps 30] [--preempt]
                                   [--out FILE.json]
       python tools/slurm_chaos.py --lost-host N [--r] [--grow-back | --batch-host] [--out FILE.json]

Brings up a fresh cluster (tools/slurm_cluster.py; needs root), runs examples/slurm/train.sbatch
unchanged with train.py (or train.R with --r) on 2 hosts once without interruption (the
reference), then per trial submits the same job and sends SIGTERM at a random instant over the
whole job (`random_instant`): before Python starts, while TensorFlow starts, before the first
step, mid-epoch, during a save, in the last steps or after fit returns. Half the trials signal the tasks
(`scancel --signal=TERM`), the other half the batch shell too (`scancel --full`, as the scheduler's
preemption and `--signal=B:TERM@N` do). Each job must end COMPLETED, with every task's final
weights bitwise equal to the reference's. Prints one line per trial (instant, phase, the step's
exit statuses, requeues, equal or not) and `K/N completed and bitwise equal`.

--recovery N measures recovery instead (issues #33, #43): N jobs whose worker's training process on
host 1 is SIGKILLed after step 8 (its task's supervisor forks it again in place, the chief's too, in
the same step; with KERASDIST_WARM_RESTARTS=0 in the environment the recipe starts the step again
instead), N whose chief on host 0 is (`--kinds chief`), and N preempted after step 14 (`scancel
--full --signal=TERM`: save, exit 75, requeue), each measured twice: read back from the chief's run
log (`kerasdist.goodput`: from the failure, the end of the failed attempt's last completed step or a
preempted attempt's exit, to the first step after it, split into detection, down, Python +
TensorFlow, cluster, restore and first step) and by an outside stopwatch (from the instant just
before the SIGKILL or the scancel to the first step line the restarted processes printed, after task
0's supervisor's restart line or the recipe's "step exited" line, the job's output polled every 20
ms); median, min and max of each over the N jobs and of their difference, the requeue's wait in
"down" for preemptions, /proc/loadavg before and after each job.

--goodput-minutes M runs one job whose training alone lasts about M minutes (0.2 s a step, a
checkpoint every --every-steps steps, 30 by default: about Young/Daly's interval for a 0.1 s save
and a failure every 3 minutes) and SIGKILLs its worker's training process on host 1 every --kill-every seconds of
running (with --preempt: preempts the whole job instead), then reports `kerasdist goodput` of the run beside
an outside stopwatch (the job's first start to its end, as this tool saw them, and each failure to
the first step line printed after it).

--lost-host N runs N jobs that each lose host 1 after step 8 (its slurmd and tasks SIGKILLed; issue
#30): the recipe goes on with host 0 alone inside the allocation. Prints, per job, the seconds from
the loss to the smaller cluster's first step (the chief's run log) and the steps redone, and checks
that each ends within RELIABILITY.md's tolerance of an uninterrupted 2-host job. With --grow-back
host 1 is started again once the smaller cluster trains (the recipe looking every 2 s): also the
seconds from then to the first step on both hosts. With --batch-host
they lose host 0 instead, which runs the batch script: the recipe's guard requeues the job, host 0
is started again once it is requeued, and each job must end bitwise equal; prints the seconds from
the loss to the requeue.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_cluster import FINAL_STATES, SlurmCluster, cmdline  # noqa: E402,F401

RECIPE = ROOT / "examples" / "slurm" / "train.sbatch"
TRAIN_PY = ROOT / "examples" / "slurm" / "train.py"
TRAIN_R = ROOT / "examples" / "slurm" / "train.R"
STEPS = 30  # train.py / train.R: 3 epochs x 10 steps
TOL = STEPS * float(np.finfo(np.float32).eps)  # RELIABILITY.md: steps x float32 eps
STEP_SECONDS = 0.2  # each step sleeps this long, so training spans a few seconds and signals land in it
JOB_OPTIONS = ["--cpus-per-task=1", "--time=10"]  # the test nodes have 1 CPU each


@dataclass
class Run:
    """One recipe job: its directories on the cluster's shared disk and the command it trains with."""

    name: str
    directory: Path
    language: str = "python"

    @property
    def checkpoint_dir(self) -> Path:
        return self.directory / "ckpt"

    @property
    def out_dir(self) -> Path:
        return self.directory / "out"

    def command(self, checkpoint_dir: Path | None = None, step_seconds: float = STEP_SECONDS) -> list[str]:
        ckpt = str(checkpoint_dir or self.checkpoint_dir)
        args = ["--checkpoint-dir", ckpt, "--out-dir", str(self.out_dir), "--step-seconds", str(step_seconds)]
        if self.language == "r":
            return ["Rscript", str(TRAIN_R), *args]
        python = os.environ.get("KERASDIST_PYTHON", sys.executable)
        return [python, str(TRAIN_PY), *args]

    def weights(self, task: int) -> list[np.ndarray] | None:
        path = self.out_dir / f"weights-task{task}.npz"
        if not path.exists():
            return None
        with np.load(path) as data:
            return [data[name] for name in data.files]


def new_run(cluster: SlurmCluster, name: str, language: str = "python") -> Run:
    directory = cluster.shared / name
    directory.mkdir(parents=True)
    return Run(name, directory, language)


def submit(cluster: SlurmCluster, run: Run, options: list[str] = (), env: dict[str, str] | None = None,
           **command) -> int:
    """sbatch the recipe, unchanged, on 2 nodes with the run's training command; the job id."""
    return cluster.submit(RECIPE, *run.command(**command), options=[*JOB_OPTIONS, *options], env=env, cwd=ROOT)


def bitwise_equal(a: list[np.ndarray] | None, b: list[np.ndarray] | None) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(
        x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def max_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y), initial=0.0)) for x, y in zip(a, b, strict=True))


def step_statuses(output: str) -> list[int]:
    """The step exit statuses the recipe reported, in order."""
    return [int(s) for s in re.findall(r"kerasdist: step exited with status (\d+)", output)]


def phase(output: str, training_started: bool) -> str:
    """Where a job was when signalled, from its output so far (and whether train.py/R had started)."""
    steps = [int(s) for s in re.findall(r"^step (\d+)\s*$", output, re.M)]
    if "done:" in output:
        return "after fit returned"
    if steps:
        last = max(steps)
        return "in the last steps" if last >= STEPS - 3 else f"mid-training (step {last})"
    return "while Python/TensorFlow start" if training_started else "before Python started"


@dataclass
class Trial:
    index: int
    delay: float
    how: str
    phase: str
    state: str
    exit_code: str
    restarts: int
    statuses: list[int]
    equal: bool
    seconds: float
    output: str = ""  # the job's output (its last 4,000 characters), for a trial that failed

    def line(self) -> str:
        return (f"trial {self.index:2d}: {self.how:<10} at {self.delay:5.2f} s ({self.phase}): {self.state} "
                f"{self.exit_code}, step statuses {self.statuses}, requeued {self.restarts}x, "
                f"{'bitwise equal' if self.equal else 'NOT EQUAL'} ({self.seconds:.0f} s)")


def wait_for_output(cluster: SlurmCluster, job_id: int, pattern: str, timeout: float = 120) -> str:
    """Wait until the job's output matches `pattern` (a regular expression); the output so far."""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, output := cluster.output(job_id), re.M):
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} never printed {pattern!r}:\n{output[-3000:]}")
        time.sleep(0.1)
    return output


def preempt_trial(cluster: SlurmCluster, reference: Run, index: int, at: float | str, how: str,
                  timeout: float = 300, step_seconds: float = STEP_SECONDS) -> Trial:
    """Submit the recipe, signal it at `at` (seconds after its training step starts, or once its output
    matches that regular expression; `how`: "tasks" or "full"), wait until it ends for good
    (releasing its requeues) and compare every task's weights with `reference`'s."""
    run = new_run(cluster, f"trial-{index}", reference.language)
    started = time.monotonic()
    job_id = submit(cluster, run, step_seconds=step_seconds)
    cluster.wait_started(job_id)
    running = time.monotonic()
    if isinstance(at, str):
        wait_for_output(cluster, job_id, at)
    else:  # counted from the training step's start: before it only the guard step gets the signal
        wait_for_training_step(cluster, job_id)
        time.sleep(at)
    delay = time.monotonic() - running
    training_started = training_process_started(cluster)
    cluster.signal_job(job_id, "TERM", full=(how == "full"))
    seen = cluster.output(job_id)
    job = cluster.wait_final(job_id, timeout)
    output = cluster.output(job_id)
    equal = all(bitwise_equal(run.weights(t), reference.weights(t)) for t in range(2))
    return Trial(index, delay, how, phase(seen, training_started), job.state, job.exit_code, job.restarts,
                 step_statuses(output), equal, time.monotonic() - started, output[-4000:])


def wait_for_training_step(cluster: SlurmCluster, job_id: int, timeout: float = 60) -> None:
    """Until the job lists a step that is neither the recipe's guard (`bash`) nor a probe (`true`):
    the batch script first asks the interpreter whether it can supervise, which takes a second or
    more on a loaded machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = cluster.client(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i %j"], check=False).stdout
        steps = [line.split() for line in listed.splitlines()]
        if any(len(step) == 2 and not step[0].endswith((".batch", ".extern")) and step[1] not in ("bash", "true")
               for step in steps):
            return
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} started no training step within {timeout:g} s")


def training_process_started(cluster: SlurmCluster) -> bool:
    """Whether the first host runs train.py / train.R yet (not counting srun, which names it too)."""
    pids = cluster.host_processes(0, "train.")
    return any(not cmdline(pid).startswith(("srun", "setsid")) for pid in pids)


def task_processes(cluster: SlurmCluster, host: int, script: str = "train.py") -> list[int]:
    """The recipe's task on `host`: its supervisor and the training process it forked (or the
    training process alone), not the slurmstepd, batch shell, setsid or srun naming the script."""
    launchers = ("slurmstepd", "srun", "setsid", "bash", "sh")
    return [pid for pid in cluster.host_processes(host, script)
            if Path(cmdline(pid).split(" ", 1)[0]).name not in launchers and "slurmstepd" not in cmdline(pid)]


def listening(cluster: SlurmCluster, host: int, port: int) -> bool:
    """Whether a process of `host` listens on TCP `port` (its network namespace's /proc/net/tcp*)."""
    for pid in cluster.host_processes(host, ""):
        with contextlib.suppress(OSError):
            rows = [row.split() for table in ("tcp", "tcp6")
                    for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]]
            return any(row[1].endswith(f":{port:04X}") and row[3] == "0A" for row in rows)  # 0A: LISTEN
    return False


def sigterm_caught(pid: int) -> bool:
    """Whether the process `pid` has a handler for SIGTERM."""
    return _has_sigterm(pid, ("SigCgt",), gone=False)


def sigterm_pending(pid: int) -> bool:
    """Whether SIGTERM waits to be delivered to the (stopped) process `pid` (or it is gone)."""
    return _has_sigterm(pid, ("SigPnd", "ShdPnd"), gone=True)


def _has_sigterm(pid: int, fields: tuple[str, ...], gone: bool) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return gone
    bit = 1 << (signal.SIGTERM - 1)
    return any(int(line.split()[1], 16) & bit for line in status.splitlines() if line.startswith(fields))


def start_up_race_trial(cluster: SlurmCluster, reference: Run, how: str, step_seconds: float = STEP_SECONDS,
                        timeout: float = 300, env: dict[str, str] | None = None) -> Trial:
    """A signal while the job starts up, when one task waits for its peer to form the cluster:
    host 1's task is stopped (SIGSTOP) once it handles SIGTERM, before it forms its cluster; host
    0's training process is left to reach the cluster's forming (listening on its port); the job is
    signalled (`how`: "batch" as `--signal=B:TERM@N` signals it, "tasks" as `--signal=TERM@N`
    does); host 1's task goes on once the signal reached it, and exits 75 at once with nothing to
    save. Host 0's training process waits in TensorFlow's C++ for a peer that never comes, deaf to
    SIGTERM: its supervisor ends it and exits 75, or, unsupervised (`env` with
    KERASDIST_WARM_RESTARTS=0), Slurm's KillWait SIGKILLs it and the step ends with 137. Waits for
    the job's end, then compares every task's weights with `reference`'s."""
    run = new_run(cluster, f"start-up-race-{how}")
    started = time.monotonic()
    job_id = submit(cluster, run, env=env, step_seconds=step_seconds)
    cluster.wait_started(job_id)
    held = _hold_task(cluster, 1)
    running = time.monotonic()
    _wait(lambda: listening(cluster, 0, 8888), 120, "host 0's training process never listened on port 8888")
    if how == "batch":
        cluster.client(["scancel", "--batch", "--signal=TERM", str(job_id)], check=False)
    else:
        cluster.signal_job(job_id, "TERM")
    _wait(lambda: all(sigterm_pending(pid) for pid in held), 60, "the signal never reached host 1's task")
    delay = time.monotonic() - running
    for pid in held:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    job = cluster.wait_final(job_id, timeout)
    output = cluster.output(job_id)
    equal = all(bitwise_equal(run.weights(t), reference.weights(t)) for t in range(2))
    return Trial(0, delay, how, "while the cluster forms", job.state, job.exit_code, job.restarts,
                 step_statuses(output), equal, time.monotonic() - started, output[-4000:])


def _hold_task(cluster: SlurmCluster, host: int, timeout: float = 120) -> list[int]:
    """SIGSTOP the recipe's task on `host` once it handles SIGTERM, seconds before it forms its
    cluster (kerasdist's supervisor sets its handlers, then imports TensorFlow; unsupervised,
    `import kerasdist` sets it, then Keras is imported; polled every 10 ms): signalled, it then
    exits 75 with nothing to save. Its pids."""
    deadline = time.monotonic() + timeout
    while not (pids := [pid for pid in task_processes(cluster, host) if sigterm_caught(pid)]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no task of the recipe on host {host} handled SIGTERM within {timeout:g} s")
        time.sleep(0.01)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


def _wait(condition, timeout: float, failure: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(failure)
        time.sleep(0.1)


def reference_run(cluster: SlurmCluster, language: str = "python", timeout: float = 300,
                  step_seconds: float = STEP_SECONDS) -> tuple[Run, float]:
    """An uninterrupted recipe job; (its run, seconds from running to its end)."""
    run = new_run(cluster, f"reference-{language}", language)
    job_id = submit(cluster, run, step_seconds=step_seconds)
    cluster.wait_started(job_id)
    started = time.monotonic()
    job = cluster.wait_final(job_id, timeout)
    if job.state != "COMPLETED" or not bitwise_equal(run.weights(0), run.weights(1)):
        raise RuntimeError(f"the reference job ended {job.state} {job.exit_code}:\n{cluster.output(job_id)[-3000:]}")
    return run, time.monotonic() - started


def random_instant(rng: random.Random) -> float | str:
    """When to signal a trial: one of four kinds of instant, equally likely, so that each phase of
    the job is hit (uniform times would mostly land in start-up and in the exit after training):
    0-0.5 s after the job starts (before Python runs), 1-6 s (while Python and TensorFlow start),
    right after a random step 1-30 is printed (mid-epoch, during a save: a checkpoint follows
    every step, the last steps), or once a task has printed that fit returned."""
    kind = rng.randrange(4)
    if kind == 0:
        return rng.uniform(0.0, 0.5)
    if kind == 1:
        return rng.uniform(1.0, 6.0)
    if kind == 2:
        return rf"^step {rng.randint(1, STEPS)}\s*$"
    return "done:"


def kill_training(cluster: SlurmCluster, host: int, script: str = "train.py") -> list[int]:
    """SIGKILL the recipe's training process on `host`, as an OOM killer or a crash would take it
    out: not the slurmstepd that runs it, nor, on the batch host, the batch shell, setsid or srun,
    whose command lines name the script too; and under kerasdist's supervisor, the training process
    it forked (same command line, the supervisor its parent), not the supervisor; its pids."""
    tasks = task_processes(cluster, host, script)
    forked = [pid for pid in tasks if parent(pid) in tasks]
    victims = forked or tasks
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    return victims


def parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def load() -> str:
    """The load averages (1, 5, 15 minutes) and the running/total tasks, as /proc/loadavg has them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:4])


# Where the failed processes' output ends: the recipe's line after a step (a restart as a new step),
# or task 0's supervisor's line as it restarts its training process in place (printed once that
# process has ended: any step line after it is the new cluster's).
RESTARTED = (r"^(kerasdist: step exited with status \d+"
             r"|kerasdist supervise \(task 0\): the training process .*: restart \d+ of \d+, in place)\s*$")


def first_step_after(cluster: SlurmCluster, job_id: int, offset: int, timeout: float = 300) -> float:
    """The outside stopwatch's end: the Unix time this tool first saw a step line that a restarted
    process printed, in the job's output past byte `offset` (after the failed step's "step exited"
    line, or task 0's supervisor's restart in place, so no line of a failed process counts; a
    requeued job appends to the same file). Polled every 20 ms."""
    path = cluster.output_file(job_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = time.time()
        text = path.read_bytes()[offset:].decode(errors="replace") if path.exists() else ""
        ended = re.search(RESTARTED, text, re.M)
        if ended and re.search(r"^step \d+\s*$", text[ended.end():], re.M):
            return seen
        time.sleep(0.02)
    raise TimeoutError(f"job {job_id} printed no step after its failure:\n{cluster.output(job_id)[-3000:]}")


def fail(cluster: SlurmCluster, job_id: int, kind: str) -> tuple[float, int]:
    """Fail the running job as `kind` ("sigkill": SIGKILL the worker on host 1; "chief": SIGKILL the
    chief on host 0; "preemption": `scancel --full --signal=TERM`); (the Unix time just before the
    kill or the scancel, the output's size then)."""
    offset = cluster.output_file(job_id).stat().st_size
    failed_at = time.time()
    if kind == "preemption":
        cluster.signal_job(job_id, "TERM", full=True)
    elif not kill_training(cluster, 0 if kind == "chief" else 1):
        raise RuntimeError(f"job {job_id}: no training process to kill on host {0 if kind == 'chief' else 1}")
    return failed_at, offset


def recovery_trial(cluster: SlurmCluster, index: int, kind: str, step_seconds: float = STEP_SECONDS) -> dict:
    """One job failed as `kind` ("sigkill": the worker on host 1 after step 8; "chief": the chief
    on host 0 after step 8; "preemption": the whole job after step 14). Its recovery twice: from
    the chief's run log (`kerasdist.goodput`: from the failure, the end of the failed attempt's last
    completed step, or a preempted one's exit, to its first step) and by the outside stopwatch
    (from the kill or scancel to the first step line the restarted job printed); the load before
    and after."""
    import kerasdist

    run = new_run(cluster, f"recovery-{kind}-{index}")
    load_before = load()
    job_id = submit(cluster, run, step_seconds=step_seconds)
    cluster.wait_started(job_id)
    wait_for_output(cluster, job_id, r"^step 14$" if kind == "preemption" else r"^step 8$")
    failed_at, offset = fail(cluster, job_id, kind)
    if kind == "preemption":  # released once requeued, as in the tests (Slurm holds it ~2 minutes)
        cluster.wait(job_id, lambda job: (job.restarts >= 1 and job.state == "RUNNING") or job.state in FINAL_STATES,
                     120)
    stopwatch = first_step_after(cluster, job_id, offset) - failed_at
    job = cluster.wait_final(job_id, 300)
    report = kerasdist.goodput(run.checkpoint_dir)
    recoveries = [a.recovery for a in report.attempts if a.recovery]
    recovery = recoveries[0] if recoveries else None
    return {"kind": kind, "index": index, "state": job.state, "restarts": job.restarts,
            "statuses": [a.status for a in report.attempts], "step_statuses": step_statuses(cluster.output(job_id)),
            "recovery": recovery, "stopwatch": round(stopwatch, 2),
            "stopwatch_minus_goodput": round(stopwatch - recovery["total"], 2) if recovery else None,
            "redone_steps": report.redone_steps, "goodput": round(report.goodput, 4),
            "load_before": load_before, "load_after": load()}


@contextlib.contextmanager
def host_lost_after_step_8(cluster: SlurmCluster, job_id: int, host: int) -> Iterator[float]:
    """Once the job has printed step 8, lose `host` (its slurmd and tasks SIGKILLed); gives the
    time of the loss. On the way out the host is started again if it is still down, and every node
    is waited for, so the next job finds the whole cluster."""
    wait_for_output(cluster, job_id, r"^step 8\s*$")
    try:
        lost_at = time.time()
        if not cluster.kill_host(host):
            raise RuntimeError(f"host {host} had no process to kill")
        yield lost_at
    finally:
        if not cluster.is_up(host):
            cluster.start_host(host)
        cluster.wait_nodes_idle(60)


def lost_host_trial(cluster: SlurmCluster, index: int, step_seconds: float = STEP_SECONDS,
                    language: str = "python", grow_back: bool = False, preempt: bool = False) -> dict:
    """One job that loses host 1 (its slurmd and tasks SIGKILLed) after step 8: the recipe goes on
    with host 0 alone (issue #30 item 2). With `grow_back`, host 1 is started again once the
    smaller cluster has trained a step, and the recipe (looking every 2 s) grows back to both hosts
    (item 3); with `preempt` (and no growing back), host 1 is started again then and, once it is
    idle, the batch shell alone gets SIGTERM (`scancel --batch`, as `--signal=B:TERM@N` does) and
    passes it on to the training: the job is requeued and ends on both hosts; else host 1 is
    started again once the job has ended. From the chief's run log: the seconds from the loss to
    the smaller cluster's first step (and, grown back, from host 1's start to the first step on
    both hosts), steps redone."""
    import kerasdist

    run = new_run(cluster, f"lost-host-{language}-{index}", language)
    env = {"KERASDIST_GROW_CHECK_SECONDS": "2"} if grow_back else {"KERASDIST_MAX_GROWS": "0"}
    job_id = submit(cluster, run, env=env, step_seconds=step_seconds)
    cluster.wait_started(job_id)
    with host_lost_after_step_8(cluster, job_id, 1) as lost_at:
        if grow_back or preempt:  # once the smaller cluster trains (a signal during its start-up ends it with 143)
            wait_for_output(cluster, job_id, r"^kerasdist: going on with[\s\S]*^step \d+\s*$", timeout=180)
            back_at = time.time()
            cluster.start_host(1)
            if preempt:
                cluster.wait_nodes_idle(60, cluster.node_names[1:])
                cluster.client(["scancel", "--batch", "--signal=TERM", str(job_id)])
        job = cluster.wait_final(job_id, 300)
    report = kerasdist.goodput(run.checkpoint_dir)
    output = cluster.output(job_id)
    smaller = next((a for a in report.attempts[1:] if a.first_step_at), None)  # the first to train after the loss
    first_step_at = smaller.first_step_at if smaller else None
    last = report.attempts[-1]
    grown = (grow_back and last.workers == report.attempts[0].workers and last.first_step_at is not None
             and last is not smaller)
    return {"index": index, "state": job.state, "restarts": job.restarts, "statuses": step_statuses(output),
            "attempts": [a.status for a in report.attempts], "workers": [a.workers for a in report.attempts],
            "restored_step": smaller.restored_step if smaller else None,
            "last_step_before_loss": report.attempts[0].last_step,
            "loss_to_first_step": round(first_step_at - lost_at, 2) if first_step_at else None,
            "back_to_first_step": round(last.first_step_at - back_at, 2) if grown else None,
            "recovery": {part: round(value, 2) for part, value in ((smaller and smaller.recovery) or {}).items()},
            "redone_steps": report.redone_steps, "run": run, "output": output}


def lost_batch_host_trial(cluster: SlurmCluster, index: int, step_seconds: float = STEP_SECONDS) -> dict:
    """One job that loses host 0, which runs its batch script, after step 8 (its slurmd and tasks
    SIGKILLed): no script is left to go on with host 1, and the recipe's guard step there requeues
    the job; host 0 is started again once the job is requeued, and the job runs on both hosts."""
    import kerasdist

    run = new_run(cluster, f"lost-batch-host-{index}")
    job_id = submit(cluster, run, step_seconds=step_seconds)
    cluster.wait_started(job_id)
    with host_lost_after_step_8(cluster, job_id, 0) as lost_at:
        requeued = cluster.wait(job_id, lambda job: job.restarts >= 1 or job.state in FINAL_STATES, 120,
                                release=False)
        requeued_after = time.time() - lost_at
        cluster.start_host(0)
        job = cluster.wait_final(job_id, 300)
    report = kerasdist.goodput(run.checkpoint_dir)
    return {"index": index, "state": job.state, "restarts": job.restarts, "requeued_state": requeued.state,
            "requeued_after": round(requeued_after, 1), "attempts": [a.status for a in report.attempts],
            "restored_step": report.attempts[-1].restored_step, "redone_steps": report.redone_steps,
            "run": run, "output": cluster.output(job_id)}


def clean_restarts_like(cluster: SlurmCluster, elastic: Run,
                        timeout: float = 300) -> tuple[Run, list[tuple[int, int | None]]]:
    """The resizes of the `elastic` job made by clean restarts (issue #30 item 4): from its run log,
    one job per attempt, on that attempt's number of hosts (`--nodes`: the recipe runs one worker
    a host), from the step it restored to the step the next attempt restored (train.py's
    `--stop-after-step`), all on one checkpoint directory; the last to the end. An attempt that
    trained no step the next did not redo is left out. (the reference's run, [(hosts, stop after
    step or None), ...])."""
    import kerasdist

    attempts = kerasdist.goodput(elastic.checkpoint_dir).attempts
    segments = [(attempt.workers, following.restored_step if following else None)
                for attempt, following in zip(attempts, [*attempts[1:], None], strict=True)
                if following is None or following.restored_step > attempt.restored_step]
    run = new_run(cluster, f"clean-restarts-{elastic.name}", elastic.language)
    for hosts, stop in segments:
        stop_args = [] if stop is None else ["--stop-after-step", str(stop)]
        job_id = cluster.submit(RECIPE, *run.command(step_seconds=0), *stop_args,
                                options=[*JOB_OPTIONS, f"--nodes={hosts}"], cwd=ROOT)
        job = cluster.wait_final(job_id, timeout)
        latest = kerasdist.latest_checkpoint(run.checkpoint_dir)
        if job.state != "COMPLETED" or step_statuses(cluster.output(job_id)) != [0] or (
                stop is not None and (latest is None or latest.global_step != stop)):
            raise RuntimeError(f"the clean restart on {hosts} host(s) to step {stop} ended {job.state} "
                               f"{job.exit_code} at {latest}:\n{cluster.output(job_id)[-3000:]}")
    return run, segments


def print_spread(what: str, seconds: list[float], trials: list[dict]) -> None:
    """One line: the median and range of `seconds` over the jobs, their steps redone, the load."""
    print(f"{what}: median {statistics.median(seconds):.1f} s ({min(seconds):.1f}-{max(seconds):.1f}, "
          f"{len(seconds)} jobs); steps redone: {sorted(t['redone_steps'] for t in trials)}; "
          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def measure_lost_batch_host(args: argparse.Namespace) -> int:
    """--lost-host N --batch-host: N jobs that lose host 0 (the batch script's), each bitwise equal
    to an uninterrupted job; the seconds from the loss to the requeue."""
    trials = []
    with SlurmCluster(args.hosts) as cluster:
        reference, _ = reference_run(cluster)
        for index in range(args.lost_host):
            trial = lost_batch_host_trial(cluster, index)
            run, output = trial.pop("run"), trial.pop("output")
            trial["equal"] = all(bitwise_equal(run.weights(t), reference.weights(t)) for t in range(2))
            trials.append(trial)
            print(json.dumps(trial), flush=True)
            if trial["state"] != "COMPLETED" or not trial["equal"]:
                print(output, flush=True)
    print_spread("loss of the batch host to the requeue", [t["requeued_after"] for t in trials], trials)
    if args.out:
        Path(args.out).write_text(json.dumps(trials, indent=1))
    return 0 if all(t["state"] == "COMPLETED" and t["equal"] for t in trials) else 1


def measure_lost_host(args: argparse.Namespace) -> int:
    """--lost-host N: N jobs that lose host 1, each ending within TOL of an uninterrupted 2-host job."""
    if args.batch_host:
        return measure_lost_batch_host(args)
    trials = []
    with SlurmCluster(args.hosts) as cluster:
        language = "r" if args.r else "python"
        reference, _ = reference_run(cluster, language)
        for index in range(args.lost_host):
            trial = lost_host_trial(cluster, index, language=language, grow_back=args.grow_back)
            run, output = trial.pop("run"), trial.pop("output")
            weights = run.weights(0)
            trial["within_tol"] = weights is not None and max_difference(weights, reference.weights(0)) <= TOL
            trials.append(trial)
            print(json.dumps(trial), flush=True)
            if trial["state"] != "COMPLETED" or not trial["within_tol"]:
                print(output, flush=True)
    times = [t["loss_to_first_step"] for t in trials if t["loss_to_first_step"] is not None]
    grown = [t["back_to_first_step"] for t in trials if t.get("back_to_first_step") is not None]
    if grown:
        print_spread("host back to the first step on 2 hosts", grown, trials)
        print(f"requeues: {[t['restarts'] for t in trials]}")
    parts = {part for t in trials for part in t["recovery"]}
    print("recovery parts, median: " + ", ".join(
        f"{part} {statistics.median(t['recovery'][part] for t in trials if part in t['recovery']):.2f} s"
        for part in sorted(parts)))
    if times:
        print_spread("loss to the smaller cluster's first step", times, trials)
    if args.out:
        Path(args.out).write_text(json.dumps(trials, indent=1))
    return 0 if all(t["state"] == "COMPLETED" and t["within_tol"] for t in trials) else 1


KINDS = ("sigkill", "chief", "preemption")


def recovery_summary(trials: list[dict]) -> dict:
    """Median and max of each recovery part, of the outside stopwatch and of its difference from
    goodput's total, by kind of failure."""
    from kerasdist.goodput import RECOVERY_PARTS

    summary = {}
    for kind in KINDS:
        measured = [t for t in trials if t["kind"] == kind and t["recovery"]]
        figures = {part: [t["recovery"][part] for t in measured] for part in (*RECOVERY_PARTS, "total")}
        figures["stopwatch"] = [t["stopwatch"] for t in measured]
        figures["stopwatch_minus_goodput"] = [t["stopwatch_minus_goodput"] for t in measured]
        summary[kind] = {name: {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
                                "max": round(max(values), 2)}
                         for name, values in figures.items()} if measured else {}
        summary[kind]["runs"] = len(measured)
    return summary


def wait_for_quiet(threshold: float, budget: float) -> float:
    """On a shared machine: wait while the 1-minute load average is above `threshold`, at most
    `budget` seconds; the seconds waited."""
    began = time.monotonic()
    while os.getloadavg()[0] > threshold and time.monotonic() - began < budget:
        time.sleep(5)
    return time.monotonic() - began


def measure_recovery(args: argparse.Namespace) -> int:
    trials, budget = [], args.quiet_wait
    with SlurmCluster(args.hosts) as cluster:
        for index in range(args.recovery):
            for kind in args.kinds:
                budget -= wait_for_quiet(args.quiet_load, max(0.0, budget))
                trial = recovery_trial(cluster, index, kind)
                trials.append(trial)
                print(json.dumps(trial), flush=True)
    summary = recovery_summary(trials)
    for kind, parts in summary.items():
        if not parts["runs"]:
            continue
        figures = [f"{part} {value['median']:.2f} s (max {value['max']:.2f})"
                   for part, value in parts.items() if part != "runs"]
        print(f"{kind} ({parts['runs']} runs): " + ", ".join(figures))
    print(f"load {load()}")
    if args.out:
        Path(args.out).write_text(json.dumps({"trials": trials, "summary": summary}, indent=1))
    return 0 if all(t["state"] == "COMPLETED" and t["recovery"] for t in trials) else 1


def goodput_chaos(args: argparse.Namespace) -> int:
    """One long job failed every `args.kill_every` seconds; its goodput against a stopwatch."""
    import kerasdist

    steps = int(args.goodput_minutes * 60 / STEP_SECONDS)
    epochs = -(-steps // 10)  # train.py: 10 steps an epoch
    with SlurmCluster(args.hosts) as cluster:
        run = new_run(cluster, "goodput-chaos")
        command = [*run.command(), "--epochs", str(epochs), "--every-steps", str(args.every_steps)]
        time_limit = f"--time={math.ceil(4 * args.goodput_minutes)}"  # minutes, whole
        job_id = cluster.submit(RECIPE, *command, options=["--cpus-per-task=1", time_limit],
                                env={"KERASDIST_MAX_RESTARTS": "1000"}, cwd=ROOT)
        load_before = load()
        cluster.wait_started(job_id)
        started, failures, recoveries = time.monotonic(), [], []
        running_since = started
        while cluster.job(job_id).state not in FINAL_STATES:
            # every --kill-every seconds of the job's running, not of the clock (a SIGKILLed job
            # never stops running: from the kill on); a requeued job is released from Slurm's
            # ~2-minute BeginTime hold, as in the tests (--recovery too)
            deadline = running_since + args.kill_every
            while time.monotonic() < deadline and cluster.job(job_id).state not in FINAL_STATES:
                time.sleep(1)
            state = cluster.job(job_id).state
            if state in FINAL_STATES or state != "RUNNING":
                cluster.wait_started(job_id, timeout=600)
                running_since = time.monotonic()
                continue
            kind = "preemption" if args.preempt else "sigkill"
            running_since = time.monotonic()
            failed_at, offset = fail(cluster, job_id, kind)
            failures.append(round(running_since - started, 1))
            if args.preempt:  # released once requeued; its running counts from its start again
                restarts = cluster.job(job_id).restarts
                requeued = lambda job, before=restarts: job.restarts > before or job.state in FINAL_STATES  # noqa: E731
                cluster.wait(job_id, requeued, 300)
                cluster.wait_started(job_id, timeout=600)
                running_since = time.monotonic()
            recoveries.append(round(first_step_after(cluster, job_id, offset) - failed_at, 2))
            print(f"{'preempted' if args.preempt else 'SIGKILLed host 1'} at {failures[-1]} s; outside stopwatch "
                  f"from the failure to the first step after it: {recoveries[-1]:.2f} s; load {load()}", flush=True)
        job = cluster.wait_final(job_id, 600)
        stopwatch = time.monotonic() - started
        report = kerasdist.goodput(run.checkpoint_dir)
    print(report)
    print(f"job {job.state}, {len(failures)} failures, outside stopwatch {stopwatch:.1f} s (first start to end), "
          f"run log wall {report.wall_seconds:.1f} s")
    inside = [a.recovery["total"] for a in report.attempts if a.recovery]
    if recoveries:
        print(f"recovery from each failure to the first step after it, outside stopwatch: median "
              f"{statistics.median(recoveries):.2f} s ({min(recoveries):.2f}-{max(recoveries):.2f}); run log "
              f"{[round(x, 2) for x in inside]}; load before {load_before}, after {load()}")
    if args.out:
        Path(args.out).write_text(json.dumps({"failures_at": failures, "stopwatch_seconds": stopwatch,
                                              "recoveries_stopwatch": recoveries, "load_before": load_before,
                                              "load_after": load(), "state": job.state,
                                              "report": report.as_dict()}, indent=1))
    return 0 if job.state == "COMPLETED" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--recovery", type=int, metavar="N", help="measure recovery over N jobs of each failure")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="with --recovery: the failures to measure (default all three)")
    parser.add_argument("--quiet-load", type=float, default=math.inf,
                        help="with --recovery: before each job, wait while the 1-minute load average is above this")
    parser.add_argument("--quiet-wait", type=float, default=600.0,
                        help="with --quiet-load: wait at most this many seconds in all (default 600)")
    parser.add_argument("--goodput-minutes", type=float, help="one long job failed every --kill-every seconds")
    parser.add_argument("--lost-host", type=int, metavar="N", help="N jobs that lose host 1 and go on without it")
    parser.add_argument("--grow-back", action="store_true",
                        help="with --lost-host: start host 1 again once the job trains without it (it grows back)")
    parser.add_argument("--batch-host", action="store_true",
                        help="with --lost-host: lose host 0, the batch script's (the job is requeued)")
    parser.add_argument("--kill-every", type=float, default=180.0)
    parser.add_argument("--every-steps", type=int, default=30,
                        help="with --goodput-minutes: a checkpoint every N steps (30: 6 s at the 0.2 s pace)")
    parser.add_argument("--preempt", action="store_true", help="with --goodput-minutes: preempt instead of SIGKILL")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--r", action="store_true", help="train.R instead of train.py")
    parser.add_argument("--out", help="write the trials as JSON here")
    args = parser.parse_args(argv)
    if args.batch_host and (args.r or args.grow_back):
        parser.error("--batch-host runs train.py and loses host 0: without --r and --grow-back")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # tear the cluster down on kill too
    signal.signal(signal.SIGINT, signal.default_int_handler)  # and on Ctrl-C, also when started in the background
    if args.recovery:
        return measure_recovery(args)
    if args.goodput_minutes:
        return goodput_chaos(args)
    if args.lost_host:
        return measure_lost_host(args)
    rng = random.Random(args.seed)
    began = time.monotonic()
    with SlurmCluster(args.hosts) as cluster:
        reference, duration = reference_run(cluster, "r" if args.r else "python")
        print(f"reference job: {duration:.1f} s from start to end", flush=True)
        trials = []
        for index in range(args.trials):
            at = random_instant(rng)
            trial = preempt_trial(cluster, reference, index, at, rng.choice(["tasks", "full"]))
            trials.append(trial)
            print(trial.line(), flush=True)
            if not (trial.state == "COMPLETED" and trial.equal):
                print(trial.output, flush=True)
    good = sum(t.state == "COMPLETED" and t.equal for t in trials)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{good}/{len(trials)} completed and bitwise equal ({time.monotonic() - began:.0f} s, load {load})")
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(t) for t in trials], indent=1))
    return 0 if good == len(trials) else 1


if __name__ == "__main__":
    sys.exit(main())
