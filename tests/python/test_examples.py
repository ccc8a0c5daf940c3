"""The example scripts in examples/ run to the end and print their key result."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "key_line"),
    [
        ("distributed_training.py", "distributed_fit: test accuracy 0."),
        ("fault_tolerance.py", "resuming from epoch 1, step "),
        ("input_pipelines.py", "resumed stream matches the uninterrupted one: True"),
    ],
)
def test_example_runs(script: str, key_line: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert key_line in result.stdout, result.stdout[-2000:]
    if script == "fault_tolerance.py":
        assert "killed the job: status -9" in result.stdout
        assert "fallback: ckpt-72 is damaged, restored ckpt-70" in result.stdout


def test_slurm_recipe_warns_its_batch_shell_and_handles_every_step_status():
    """The time-limit warning goes to the batch shell (`--signal=B:...`), which passes it on to
    the tasks and so knows the job is being stopped (test_slurm.py: a step that then ends 137 is
    requeued); the recipe requeues on 75 and 143, restarts the step on 137 and 76, traps TERM in
    the batch shell, asks for --no-kill so that a lost host leaves the job running on the hosts
    left, and grows back.
    (tests/python/test_slurm.py runs it on a real cluster.)"""
    script = (Path(__file__).resolve().parents[2] / "examples" / "slurm" / "train.sbatch").read_text()
    signal_lines = [line for line in script.splitlines() if line.startswith("#SBATCH --signal=")]
    assert signal_lines == ["#SBATCH --signal=B:TERM@120"]
    assert "#SBATCH --requeue" in script.splitlines() and "#SBATCH --no-kill" in script.splitlines()
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script and "trap on_term TERM" in script
    for case in ('"$PREEMPTED" | 143)', '137 | "$PEER_LOST" | "$HUNG" | "$HUNG_IN_C")', "PEER_LOST=76", "HUNG=77",
                 "0) exit 0", "hosts_up",
                 "watch_for_hosts", 'requeue "growing back to $wanted hosts"'):
        assert case in script, case
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0


def test_custom_loop_example_trains_checkpoints_and_scores_the_restored_model(tmp_path: Path) -> None:
    """The tutorial's custom loop under kerasdist: 2 replicas, a resumed 4th epoch, the newest
    checkpoint restored and evaluated on the held-out digits."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "custom_loop.py"), "--run-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    lines = result.stdout.splitlines()
    assert "replicas:  2" in lines and "epochs in the history: 4" in lines, result.stdout
    accuracy = float(next(line for line in lines if line.startswith("custom_fit: test accuracy ")).split()[-1])
    assert accuracy > 0.85, result.stdout
    names = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert names == ["ckpt-80", "ckpt-90", "ckpt-96", "runs"]  # keep=3; 24 batches an epoch, every 10; the run log
    assert "latest checkpoint: ckpt-96, epoch 4, global step 96" in lines
    assert "restored from ckpt-96: test loss " in result.stdout
