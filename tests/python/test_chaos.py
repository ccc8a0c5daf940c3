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
import signal
import subprocess
import sys
from pathlib import Path

import pytest

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
def references(tmp_path_factory):
    """One uninterrupted run per variant, made when first asked for."""
    made = {}

    def reference(name: str) -> Path:
        if name not in made:
            made[name] = kill_resume.reference_run(tmp_path_factory.mktemp(name), kill_resume.VARIANTS[name])
        return made[name]

    return reference


@pytest.mark.parametrize("name, sig", [("mirrored", signal.SIGKILL), ("mirrored", signal.SIGTERM),
                                       ("launcher", signal.SIGKILL), ("r", signal.SIGKILL)],
                         ids=["mirrored-sigkill", "mirrored-sigterm", "launcher-sigkill", "r-sigkill"])
def test_three_kills_then_resume_is_bitwise_identical(references, tmp_path, name, sig):
    if name == "r" and (os.environ.get("KERASDIST_SKIP_R_CHAOS") or not r_can_run()):
        pytest.skip("Rscript cannot load kerasdist and keras3 here")
    variant = kill_resume.VARIANTS[name]
    rng = random.Random(15)
    kill_steps = sorted(rng.sample(range(1, variant.steps), KILLS))
    result = kill_resume.kill_and_resume(tmp_path, references(name), kill_steps, rng, sig, variant)
    print(kill_resume.summary_line(variant, [result]), result)
    if variant.external:
        expected = -signal.SIGKILL if sig == signal.SIGKILL else kill_resume.PREEMPTED
        assert result["exit_codes"] == [expected] * KILLS, result
        assert result["final_exit_code"] == 0
    else:  # one launch: on each attempt a random worker dies, the group restarts, the last finishes
        [(code, seen)] = result["exit_codes"]
        assert code == 0 and seen.startswith(f"0 {KILLS} "), result
        assert seen.split(" ", 2)[2] == "|".join(f"worker {v[-1]} was killed by SIGKILL" for v in result["victims"])
    assert result["bitwise_identical"], result
