"""SIGTERM outside training (kerasdist.preemption.signals): a cluster task exits with 75 at once, whatever
it is doing, and a preemption during fit stays a save and 75 however many signals come."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kerasdist
from kerasdist.launch.ports import accepts_connections, free_ports

SCRIPTS = Path(__file__).parent / "scripts"


def start(code: str, env: dict[str, str]) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TF_CONFIG", "KERASDIST_EXIT"))}
    return subprocess.Popen([sys.executable, "-u", "-c", textwrap.dedent(code)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**clean, "TF_CPP_MIN_LOG_LEVEL": "2", **env})


def signal_after_line(process: subprocess.Popen, line: str, signals: int = 1, wait: float = 1.0):
    """Wait for `line` on stdout, then `wait` seconds, then send SIGTERM `signals` times."""
    for text in process.stdout:
        if text.strip() == line:
            break
    time.sleep(wait)
    for _ in range(signals):
        process.send_signal(signal.SIGTERM)
        time.sleep(0.05)
    process.wait(timeout=30)
    return process.returncode, process.stderr.read()


SLURM_TASK = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
IDLE = """
    import time
    import kerasdist
    print("ready", flush=True)
    while True:
        time.sleep(0.1)
"""


def test_a_slurm_task_signalled_before_training_exits_75_saying_why():
    code, err = signal_after_line(start(IDLE, SLURM_TASK), "ready", signals=3)
    assert code == kerasdist.PREEMPTED_EXIT_CODE, err
    assert "SIGTERM outside training, nothing to save: exiting with 75" in err


@pytest.mark.parametrize("env", [{}, {**SLURM_TASK, "KERASDIST_EXIT_ON_SIGTERM": "0"}],
                         ids=["no-cluster", "switched-off"])
def test_outside_a_cluster_or_switched_off_sigterm_keeps_its_default(env):
    code, err = signal_after_line(start(IDLE, env), "ready", wait=0.2)
    assert code == -signal.SIGTERM, err


def test_a_program_with_its_own_sigterm_handler_keeps_it():
    code, err = signal_after_line(start("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))
        import kerasdist
        print("ready", flush=True)
        time.sleep(30)
    """, SLURM_TASK), "ready", wait=0.2)
    assert code == 3, err


def test_a_worker_signalled_while_the_cluster_forms_stops_every_worker_with_75():
    """Worker 0 waits in TensorFlow's C++ code for worker 1, holding the GIL, when SIGTERM comes:
    TensorFlow's own handler notes it in the cluster's store, and once worker 1 has joined both
    read it there and exit with 75 before training."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports("127.0.0.1", 2)]
    code = """
        import kerasdist
        kerasdist.select_strategy()
        print("trained", flush=True)
    """

    def worker(index: int) -> subprocess.Popen:
        config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        return start(code, {"TF_CONFIG": json.dumps(config)})

    first = worker(0)
    deadline = time.monotonic() + 90
    # its server listens once it is in TensorFlow's call that forms the cluster (a sleep after "ready"
    # could end before it got there on a loaded machine: signalled in Python, it exits 75 alone);
    # TensorFlow's own SIGTERM handler comes a moment after the server (signalled at once, in a full
    # run, worker 0 exited 75 alone and worker 1, which had joined, 76): 2 s more, as before
    while not accepts_connections(addresses[0]) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2.0)
    first.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    second = worker(1)
    outputs = [p.communicate(timeout=60) for p in (first, second)]
    assert [first.returncode, second.returncode] == [kerasdist.PREEMPTED_EXIT_CODE] * 2, outputs
    assert not any("trained" in out for out, _ in outputs)


SIGNALLED_AT = """
    import json, os, signal
    import tensorflow as tf
    import kerasdist
    from kerasdist import strategy as chooser
    from kerasdist.preemption import agreement

    me = str(json.loads(os.environ["TF_CONFIG"])["task"]["index"])

    def signal_myself():
        if os.environ.get("SIGNAL_ONLY", me) == me:
            os.kill(os.getpid(), signal.SIGTERM)

    moment = os.environ["SIGNAL_MOMENT"]
    if moment == "reading":  # while this worker waits for TensorFlow's notice: recorded, then agreed
        read = agreement.noticed_by_tensorflow
        agreement.noticed_by_tensorflow = lambda *args: (signal_myself(), read(*args))[1]
        kerasdist.select_strategy()
    elif moment == "formed":  # the strategy just made, TensorFlow's handler still in place
        build = chooser._build
        chooser._build = lambda *args: (build(*args), signal_myself())[0]
        kerasdist.select_strategy()
    elif moment == "agreeing":  # after this worker read the notice, before the workers' gather
        agree = chooser._check_cluster_agreement
        chooser._check_cluster_agreement = lambda *args: (signal_myself(), agree(*args))[1]
        kerasdist.select_strategy()
    else:  # a strategy the user made, signalled before kerasdist's first call on it
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        signal_myself()
        kerasdist.run_context(strategy)
    print("trained", flush=True)
"""


@pytest.mark.parametrize(("moment", "signalled"), [("formed", "both"), ("agreeing", "both"), ("users-strategy", "both"),
                                                  ("reading", "1")])
def test_workers_signalled_just_after_the_cluster_formed_exit_75_not_train_on(moment, signalled):
    """TensorFlow's handler, in place once the cluster formed, publishes a signal up to a second
    later, and one that came while the workers agreed was never read: the task went on to train
    and exited 0 (Slurm run 5's swallowed time-limit warning). Each worker (or only worker 1)
    signals itself at the exact moment; every one must exit 75 before training."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports("127.0.0.1", 2)]

    def worker(index: int) -> subprocess.Popen:
        config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        only = {} if signalled == "both" else {"SIGNAL_ONLY": signalled}
        return start(SIGNALLED_AT, {"TF_CONFIG": json.dumps(config), "SIGNAL_MOMENT": moment, **only})

    workers = [worker(0), worker(1)]
    try:
        outputs = [p.communicate(timeout=90) for p in workers]
    finally:
        for process in workers:
            process.kill()
    assert [p.returncode for p in workers] == [kerasdist.PREEMPTED_EXIT_CODE] * 2, outputs
    assert not any("trained" in out for out, _ in outputs)


def test_a_task_blocked_in_c_code_that_lets_threads_run_exits_75():
    """The watcher thread exits on the handler's behalf while the main thread waits in C."""
    code, err = signal_after_line(start("""
        import select, socket
        import kerasdist
        a, b = socket.socketpair()
        print("ready", flush=True)
        select.select([a], [], [])  # retried after each signal (PEP 475): never returns
    """, SLURM_TASK), "ready", wait=0.5)
    assert code == kerasdist.PREEMPTED_EXIT_CODE, err


# Cold: in one whole-suite run with the process forked from the warm-start server (the signals
# passed on by its client) two checkpoints were left instead of one; not understood yet (maybe the
# signals, passed on late, landing after the epoch-end save at step 12: now counted as such).
@pytest.mark.cold_start
def test_repeated_sigterms_during_fit_still_save_once_and_exit_75(tmp_path):
    """A scheduler that signals again (srun terminating the step, a second scancel) while the
    preemption save runs changes nothing. Steps paced (0.3 s), so the signals land in the first
    epoch (12 steps) unless a loaded machine delays them past its end: then that epoch's own
    checkpoint stays beside the one preemption save."""
    ckpt = tmp_path / "ckpt"
    process = subprocess.Popen(
        [sys.executable, "-u", str(SCRIPTS / "train_resumable.py"), str(ckpt), str(tmp_path / "out.npz"),
         "--every-steps", "1000", "--step-seconds", "0.3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **SLURM_TASK, "TF_CPP_MIN_LOG_LEVEL": "2"})
    code, err = signal_after_line(process, "step 5", signals=5, wait=0.0)
    assert code == kerasdist.PREEMPTED_EXIT_CODE, err[-2000:]
    latest = kerasdist.latest_checkpoint(ckpt)
    assert latest is not None and latest.global_step >= 5
    epoch_ends = [step for step in (12, 24) if step < latest.global_step]  # saved before the signals landed
    assert [c.global_step for c in kerasdist.list_checkpoints(ckpt)] == [*epoch_ends[-1:], latest.global_step]
