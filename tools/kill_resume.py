"""Fault injection: kill a seeded training run at random steps, restart it until it finishes, and
compare its final weights bitwise with an uninterrupted run.

usage: python tools/kill_resume.py [--kills 50] [--seed 0] [--signal KILL|TERM] [--out FILE.json]
The pytest suite runs the same thing with 5 kills.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TRAIN_SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "python" / "scripts" / "train_resumable.py"
TOTAL_STEPS = 36  # the script's 3 epochs x 12 batches


def train(ckpt: Path, out: Path, kill_at_step: int | None = None, sig=signal.SIGKILL, delay: float = 0.0):
    """Run the training script, killing it `delay` s after it reports `kill_at_step`.

    Returns (exit code, last step it reported).
    """
    process = subprocess.Popen(
        [sys.executable, str(TRAIN_SCRIPT), str(ckpt), str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    last = 0
    for line in process.stdout:
        if line.startswith("step "):
            last = int(line.split()[1])
            if kill_at_step is not None and last >= kill_at_step:
                time.sleep(delay)
                process.send_signal(sig)
                break
    for line in process.stdout:  # drain: a closed pipe would kill the child with EPIPE
        if line.startswith("step "):
            last = int(line.split()[1])
    return process.wait(timeout=300), last


def reference_run(workdir: Path) -> Path:
    """An uninterrupted run; returns its final weights file."""
    code, _ = train(workdir / "reference", workdir / "reference.npz")
    if code != 0:
        raise RuntimeError(f"the reference run failed with exit code {code}")
    return workdir / "reference.npz"


def kill_and_resume(workdir: Path, reference: Path, kill_steps: list[int], rng: random.Random,
                    sig=signal.SIGKILL) -> dict:
    """Kill one run at each of `kill_steps` in turn, restart it to the end, compare with reference."""
    codes = []
    for step in kill_steps:
        code, _ = train(workdir / "ckpt", workdir / "final.npz", step, sig, delay=rng.uniform(0, 0.05))
        codes.append(code)
    final_code, _ = train(workdir / "ckpt", workdir / "final.npz")
    expected, resumed = np.load(reference), np.load(workdir / "final.npz")
    identical = expected.files == resumed.files and all(
        np.array_equal(expected[name], resumed[name]) for name in expected.files
    )
    return {"kill_steps": kill_steps, "exit_codes": codes, "final_exit_code": final_code,
            "bitwise_identical": bool(identical)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50, help="independent kill-and-resume trials")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    trials = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        reference = reference_run(Path(tmp))
        for trial in range(args.kills):
            step = rng.randrange(1, TOTAL_STEPS)
            result = kill_and_resume(Path(tmp) / f"trial{trial}", reference, [step], rng)
            trials.append(result)
            print(f"trial {trial + 1}/{args.kills}: SIGKILL at step {step}, exit {result['exit_codes'][0]}, "
                  f"resumed bitwise identical: {result['bitwise_identical']}", flush=True)
    summary = {"benchmark": "kill_resume", "trials": args.kills,
               "identical": sum(t["bitwise_identical"] for t in trials),
               "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**summary, "details": trials}, indent=1))
    return 0 if summary["identical"] == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
