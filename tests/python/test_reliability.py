"""#15 items 6 and 8: one run, the same answer on every strategy and after a resume on other hardware.

All runs are tests/python/scripts/train_anywhere.py (distributed_fit, a Dense model, 320 samples,
global batch 32: 20 optimizer steps, a checkpoint every step) in fresh processes, so that each can
split the CPU or join a cluster before TensorFlow starts.

Tolerance. The default strategy is bitwise reproducible (op determinism, seeded order). Mirrored on
2 replicas and 2 multi-worker processes add the same per-sample gradients in another order (two
half-batch sums, then their sum), so each step's update can differ by float32 rounding: about one
ulp of the weights (|w| < 1, eps = 1.19e-7). The problem is smooth and the step small (SGD 0.05),
so those differences do not grow over 20 steps beyond one ulp per step: TOL = STEPS * eps = 2.4e-6,
absolute. Measured on 2026-11-23: 6e-8 (one ulp of the largest weight). A resume at the wrong
sample moves the weights by the size of one step (~1e-3 and more), far outside TOL.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kerasdist

SCRIPT = Path(__file__).parent / "scripts" / "train_anywhere.py"
STEPS = 20  # 2 epochs x 10 steps
TOL = STEPS * float(np.finfo(np.float32).eps)
MIRRORED = ("--strategy", "mirrored", "--devices", "2")
DEFAULT = ("--strategy", "default")


def train(ckpt: Path, out: Path, *args: str, expect: int = 0) -> list[int]:
    """Run the script to its end (or its kill); returns the steps it printed."""
    done = subprocess.run([sys.executable, str(SCRIPT), str(ckpt), str(out), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == expect, done.stderr[-3000:]
    return [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("step ")]


def launch(ckpt: Path, out: Path, *args: str, api: str = "distributed_fit", **options) -> kerasdist.LaunchResult:
    """2 workers under the launcher, training through `api` (distributed_fit or resume_fit)."""
    command = [sys.executable, str(SCRIPT), str(ckpt), str(out), "--strategy", "auto", "--api", api, *args]
    return kerasdist.launch(command, num_workers=2, grace_period=2, timeout=240, **options)


def weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as saved:
        return [saved[name] for name in saved.files]


def assert_close(a: Path, b: Path, tol: float = TOL) -> None:
    for x, y in zip(weights(a), weights(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=tol)


@pytest.fixture(scope="module")
def reference(made_once) -> Path:
    """An uninterrupted run on the default strategy (one process, one replica); once for all workers."""

    def make(work: Path) -> Path:
        assert train(work / "ckpt", work / "final.npz", *DEFAULT) == list(range(1, STEPS + 1))
        return work / "final.npz"

    return made_once("reliability-reference", make)


def test_default_mirrored_and_two_workers_train_to_the_same_weights(reference, tmp_path, capfd):
    train(tmp_path / "mirrored", tmp_path / "mirrored.npz", *MIRRORED)
    assert_close(tmp_path / "mirrored.npz", reference)
    # distributed_fit with a checkpoint every step: the chief's saves once failed under multi-worker
    # (it saved inside the strategy scope, running a collective the other worker did not join)
    result = launch(tmp_path / "mw", tmp_path / "mw.npz")
    out = capfd.readouterr().out
    assert result.ok, out[-3000:]
    assert "done replicas=2 workers=2" in out
    assert_close(tmp_path / "mw.npz", reference)
    for a, b in zip(weights(tmp_path / "mw.npz"), weights(tmp_path / "mw-worker1.npz"), strict=True):
        np.testing.assert_array_equal(a, b)  # the workers hold one model


@pytest.mark.parametrize("written, resumed", [(MIRRORED, DEFAULT), (DEFAULT, MIRRORED)],
                         ids=["2-replicas-to-1", "1-replica-to-2"])
def test_checkpoint_resumes_on_another_replica_count_at_the_next_unseen_sample(reference, tmp_path, written,
                                                                                 resumed):
    ckpt = tmp_path / "ckpt"
    assert train(ckpt, tmp_path / "final.npz", *written, "--kill-at-step", "7", expect=-9)[-1] == 7
    assert kerasdist.latest_checkpoint(ckpt).global_batch_size == 32
    assert train(ckpt, tmp_path / "final.npz", *resumed) == list(range(8, STEPS + 1))
    assert_close(tmp_path / "final.npz", reference)


def test_checkpoint_of_two_workers_resumes_in_one_process(reference, tmp_path, capfd):
    """Worker 1 is SIGKILLed at step 13; with min_workers=1 the launcher goes on with one worker
    (#30 item 6), which resumes the chief's newest checkpoint with the same global batch of 32
    and trains each remaining step once, ending within TOL of the one-process reference."""
    ckpt = tmp_path / "ckpt"
    result = launch(ckpt, tmp_path / "final.npz", "--kill-at-step", "13", "--kill-task", "worker:1", api="resume_fit",
                    min_workers=1)
    out = capfd.readouterr().out
    assert result.ok and (result.restarts, result.num_workers) == (1, 1), out[-3000:]
    assert [f.description for f in result.failures] == ["worker 1 was killed by SIGKILL"]
    assert "[worker 0] done replicas=1 workers=1" in out
    first, second = kerasdist.goodput(ckpt).attempts  # the chief's run log: the 2-worker and the 1-worker run
    assert 12 <= second.restored_step <= 13 and first.status != "completed"
    steps = [int(s) for s in re.findall(r"^\[worker 0\] step (\d+)$", out, re.M)]
    left = STEPS - second.restored_step
    assert steps[-left:] == list(range(second.restored_step + 1, STEPS + 1)), steps
    latest = kerasdist.latest_checkpoint(ckpt)
    assert (latest.global_step, latest.global_batch_size, latest.writer) == (STEPS, 32, "worker:0")
    assert_close(tmp_path / "final.npz", reference)


def test_another_global_batch_says_it_cannot_continue_exactly_and_what_it_does(tmp_path):
    ckpt = tmp_path / "ckpt"
    train(ckpt, tmp_path / "final.npz", *DEFAULT, "--kill-at-step", "7", expect=-9)
    done = subprocess.run([sys.executable, str(SCRIPT), str(ckpt), str(tmp_path / "final.npz"), *DEFAULT,
                           "--batch-size", "48"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # 7 steps of 32 = 224 samples seen; in batches of 48 that is 4 whole batches (192): 32 again
    assert ("was written with a global batch of 32 samples, this run uses 48: the sample stream is not the same, "
            "so it cannot continue exactly. It resumes epoch 0 at sample 192 (batch 4 of 48); the 224 samples "
            "already trained in that epoch are skipped except the last 32, which are trained again.") in done.stderr
    steps = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("step ")]
    assert steps == list(range(8, 8 + 3 + 7))  # the rest of epoch 0 (7 - 4 batches), then epoch 1 (7)
    assert kerasdist.latest_checkpoint(ckpt).global_batch_size == 48
