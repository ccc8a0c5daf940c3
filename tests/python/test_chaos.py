"""#15 item 5, short runs: 3 kills per variant, chained (kill, restart, kill, ... then run to the
end), final weights compared with an uninterrupted run of the same variant.

The long runs (>= 20 independent kills each) are `python tools/kill_resume.py --kills 20 ...`;
their figures are in RELIABILITY.md. Mirrored on 2 CPU devices and 2 multi-worker processes are
deterministic run to run (the same reduction order every time), so every variant here is held
to bitwise equality with its own reference; against the default strategy they agree within the
tolerance tests/python/test_reliability.py justifies. The default strategy under SIGKILL is
tests/python/test_checkpoint.py's 5-kill test.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import kerasdist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import kill_resume  # noqa: E402

KILLS = 3


def r_can_run() -> bool:
    try:
        done = subprocess.run(["Rscript", "-e", "library(kerasdist); library(keras3)"], capture_output=True,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.fixture(scope="module")
def references(made_once):
    """One uninterrupted run per variant, made when first asked for (once for all workers)."""

    def reference(name: str) -> Path:
        return made_once(f"chaos-{name}", lambda folder: kill_resume.reference_run(folder, kill_resume.VARIANTS[name]))

    return reference


@pytest.mark.parametrize("name, sig", [("mirrored", signal.SIGKILL), ("mirrored", signal.SIGTERM),
                                       ("launcher", signal.SIGKILL), ("r", signal.SIGKILL)],
                         ids=["mirrored-sigkill", "mirrored-sigterm", "launcher-sigkill", "r-sigkill"])
def test_three_kills_then_resume_is_bitwise_identical(references, tmp_path, name, sig):
    if name == "r" and (os.environ.get("KERASDIST_SKIP_R_CHAOS") or not r_can_run()):
        pytest.skip("Rscript cannot load kerasdist and keras3 here")
    variant = kill_resume.VARIANTS[name]
    rng = random.Random(15)
    # The last kill leaves 7 of the 20 steps: on a loaded machine the test reads "step N" late,
    # and a kill at step 17 once came after the run had finished (exit 0).
    kill_steps = sorted(rng.sample(range(1, variant.steps - 6), KILLS))
    # R's uninterrupted run is trained by the process of its run to the end (one R start-up fewer)
    reference = None if name == "r" else references(name)
    result = kill_resume.kill_and_resume(tmp_path, reference, kill_steps, rng, sig, variant)
    print(kill_resume.summary_line(variant, [result]), result)
    if variant.external:
        expected = -signal.SIGKILL if sig == signal.SIGKILL else kill_resume.PREEMPTED
        assert result["exit_codes"] == [expected] * KILLS, result
        assert result["final_exit_code"] == 0
    else:  # one launch: on each attempt a random worker dies, the group restarts, the last finishes
        [(code, seen, _)] = result["exit_codes"]
        assert code == 0 and seen.startswith(f"0 {KILLS} "), result
        assert seen.split(" ", 2)[2] == "|".join(f"worker {v[-1]} was killed by SIGKILL" for v in result["victims"])
    assert result["bitwise_identical"], result


def test_sigterm_to_one_worker_stops_every_worker_at_one_step_and_the_restart_ends_bitwise_equal(
        references, tmp_path, capfd):
    """#15 item 1: worker 1 gets SIGTERM after step 3. TensorFlow's preemption agreement
    (kerasdist/preemption/agreement.py) has it publish step 4 at its next batch end, so both
    workers stop after step 5 (the count after that publication), the chief saves step 5 (no other
    checkpoint is due: --every-steps 1000), both exit 75; the restarted group resumes at step 6."""
    final = tmp_path / "final.npz"
    command = kill_resume.VARIANTS["launcher"].command(tmp_path / "ckpt", final)[5:]  # the script alone
    result = kerasdist.launch([*command, "--every-steps", "1000", "--kill-at-step", "3", "--kill-task", "worker:1",
                               "--kill-signal", "TERM"], num_workers=2, max_restarts=1, grace_period=5, timeout=240)
    out = capfd.readouterr().out
    assert result.ok and result.restarts == 1, out[-3000:]
    assert result.exit_codes == ({"worker 0": 75, "worker 1": 75}, {"worker 0": 0, "worker 1": 0}), out[-3000:]
    for worker in (0, 1):  # every step once: none lost, none trained twice
        steps = [int(s) for s in re.findall(rf"^\[worker {worker}\] step (\d+)$", out, re.M)]
        assert steps == list(range(1, kill_resume.VARIANTS["launcher"].steps + 1)), (worker, steps)
    assert kill_resume.compare(references("launcher"), final) == (True, 0.0)
