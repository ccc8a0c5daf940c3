"""Chaos test: kill a seeded training run at random steps, restart it until it finishes, and
compare its final weights with an uninterrupted run of the same variant.

usage: python tools/kill_resume.py [--kills 50] [--seed 0] [--signal KILL|TERM]
                                   [--strategy default|mirrored | --launcher | --r] [--out FILE.json]

Variants (each trial kills once at a random step, restarts to the end, compares):
  --strategy default  tests/python/scripts/train_resumable.py (Dense + Dropout, 36 steps, resume_fit),
                      killed from outside after a random delay past a random step: bitwise.
  --strategy mirrored tests/python/scripts/train_anywhere.py through distributed_fit on 2 simulated
                      CPU devices (20 steps), killed from outside: bitwise against a mirrored reference
                      (mirrored is deterministic run to run; it is not bitwise equal to the default
                      strategy, see tests/python/test_reliability.py).
  --launcher          the same script (distributed_fit) as 2 multi-worker processes under kerasdist.launch
                      (max_restarts=1); a random worker signals itself at a random step; compared with
                      an uninterrupted 2-worker run.
  --r                 tests/testthat/scripts/train_resumable.R: distributed_fit from R (default strategy),
                      killed from outside: bitwise.
--signal TERM sends SIGTERM (preemption: save, exit 75) instead of SIGKILL.
Prints one line per trial and `K/N bitwise identical` (or `K/N equal within tolerance T`, when a
trial is not bitwise but within T = steps x float32 eps, the bound test_reliability.py justifies).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = ROOT / "tests" / "python" / "scripts" / "train_resumable.py"
ANYWHERE = ROOT / "tests" / "python" / "scripts" / "train_anywhere.py"
R_SCRIPT = ROOT / "tests" / "testthat" / "scripts" / "train_resumable.R"
TOTAL_STEPS = 36  # train_resumable.py: 3 epochs x 12 batches
PREEMPTED = 75
LAUNCH = (
    "import json, sys, kerasdist\n"
    "r = kerasdist.launch(sys.argv[3:], num_workers=2, max_restarts=int(sys.argv[1]),\n"
    "                     grace_period=float(sys.argv[2]), timeout=300)\n"
    "print('launch', r.exit_code, r.restarts, '|'.join(f.description for f in r.failures), flush=True)\n"
    "print('exits', json.dumps(r.exit_codes), flush=True)\n"
    "sys.exit(r.exit_code)\n"
)


@dataclass(frozen=True)
class Variant:
    name: str
    steps: int  # optimizer steps of a whole run
    external: bool  # killed by this tool (else the run signals itself, under the launcher)

    def command(self, ckpt: Path, out: Path, kill_at: list[int] = (), tasks: list[str] = (),
                sig: str = "KILL") -> list[str]:
        if self.name == "default":
            return [sys.executable, str(TRAIN_SCRIPT), str(ckpt), str(out)]
        if self.name == "mirrored":
            return [sys.executable, str(ANYWHERE), str(ckpt), str(out), "--strategy", "mirrored", "--devices", "2"]
        if self.name == "r":  # more runs in one process: the triples after the first (R_SCRIPT's usage)
            return ["Rscript", str(R_SCRIPT), str(ckpt), str(out), "default"]
        kill = ["--kill-at-step", ",".join(map(str, kill_at)), "--kill-task", ",".join(tasks),
                "--kill-signal", sig] if kill_at else []
        # SIGTERM: the workers stop together and exit 75 on their own; 5 s for the last one to
        # finish saving and exiting (on a loaded machine) before the launcher stops it
        grace = "5" if sig == "TERM" else "2"
        return [sys.executable, "-c", LAUNCH, str(len(kill_at)), grace, sys.executable, str(ANYWHERE), str(ckpt),
                str(out), "--strategy", "auto", *kill]


VARIANTS = {"default": Variant("default", TOTAL_STEPS, True), "mirrored": Variant("mirrored", 20, True),
            "launcher": Variant("launcher", 20, False), "r": Variant("r", 20, True)}


def tolerance(variant: Variant) -> float:
    return variant.steps * float(np.finfo(np.float32).eps)


def run(command: list[str], kill_at_step: int | None = None, sig=signal.SIGKILL, delay: float = 0.0):
    """Run `command`, sending `sig` `delay` s after it reports step `kill_at_step`.

    Returns (exit code, last step it reported, its last output lines)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    last, tail = 0, []

    def read(line):
        nonlocal last
        tail[:] = [*tail[-20:], line]
        words = line.split()
        if "step" in words and words.index("step") + 1 < len(words) and words[words.index("step") + 1].isdigit():
            last = max(last, int(words[words.index("step") + 1]))

    for line in process.stdout:
        read(line)
        if kill_at_step is not None and last >= kill_at_step:
            time.sleep(delay)
            process.send_signal(sig)
            break
    for line in process.stdout:  # drain: a closed pipe would kill the child with EPIPE
        read(line)
    return process.wait(timeout=600), last, "".join(tail)


def train(ckpt: Path, out: Path, kill_at_step: int | None = None, sig=signal.SIGKILL, delay: float = 0.0):
    """The default variant's run (kept for tests/python/test_checkpoint.py): (exit code, last step)."""
    code, last, _ = run(VARIANTS["default"].command(ckpt, out), kill_at_step, sig, delay)
    return code, last


def reference_run(workdir: Path, variant: Variant = VARIANTS["default"]) -> Path:
    """An uninterrupted run; returns its final weights file."""
    code, _, tail = run(variant.command(workdir / "reference", workdir / "reference.npz"))
    if code != 0:
        raise RuntimeError(f"the reference run failed with exit code {code}:\n{tail}")
    return workdir / "reference.npz"


def compare(reference: Path, final: Path) -> tuple[bool, float]:
    """(bitwise identical, largest absolute difference)."""
    if not final.exists():
        return False, float("inf")
    expected, resumed = np.load(reference), np.load(final)
    if expected.files != resumed.files:
        return False, float("inf")
    diffs = [float(np.max(np.abs(expected[n] - resumed[n]), initial=0.0)) for n in expected.files]
    identical = all(np.array_equal(expected[n], resumed[n]) for n in expected.files)
    return identical, max(diffs)


def kill_and_resume(workdir: Path, reference: Path | None, kill_steps: list[int], rng: random.Random,
                    sig=signal.SIGKILL, variant: Variant = VARIANTS["default"]) -> dict:
    """Kill one run at each of `kill_steps` in turn, restart it to the end, compare with reference.

    With `reference` None (the R variant), the process of the run to the end trains the
    uninterrupted run first, into workdir/reference: one R and TensorFlow start-up fewer.

    Under the launcher all kills are one launch with max_restarts = the number of kills: on
    attempt k a random worker signals itself at the k-th step (or at once, when the restart
    resumed past it), the launcher restarts the group, and the last attempt runs to the end."""
    codes, victims = [], []
    ckpt, final = workdir / "ckpt", workdir / "final.npz"
    sig_name = signal.Signals(sig).name.removeprefix("SIG")
    if not variant.external:
        victims = [f"worker:{rng.randrange(2)}" for _ in kill_steps]
        code, _, tail = run(variant.command(ckpt, final, kill_steps, victims, sig_name))
        seen = tail.rsplit("\nlaunch ", 1)[-1].split("\n", 1)[0].strip()  # the launcher's summary line
        exits = json.loads(tail.rsplit("\nexits ", 1)[-1].split("\n", 1)[0]) if "\nexits " in tail else []
        codes.append((code, seen, [attempt for attempt in exits if attempt]))  # every worker, per attempt
    for step in kill_steps if variant.external else ():
        code, _, _ = run(variant.command(ckpt, final), step, sig, delay=rng.uniform(0, 0.05))
        codes.append(code)
    final_code = 0
    if variant.external:
        command = variant.command(ckpt, final)
        if reference is None:
            if variant.name != "r":
                raise ValueError("only the R script trains several runs in one process")
            reference = workdir / "reference.npz"
            command = [*variant.command(workdir / "reference", reference), *command[2:]]
        final_code, _, tail = run(command)
        if final_code != 0:
            print(tail, file=sys.stderr)
    identical, diff = compare(reference, final)
    return {"kill_steps": kill_steps, "signal": sig_name, "victims": victims, "exit_codes": codes,
            "final_exit_code": final_code, "bitwise_identical": bool(identical), "max_abs_diff": diff,
            "within_tolerance": bool(diff <= tolerance(variant))}


def summary_line(variant: Variant, trials: list[dict]) -> str:
    n = len(trials)
    identical = sum(t["bitwise_identical"] for t in trials)
    if identical == n:
        return f"{identical}/{n} bitwise identical"
    close = sum(t["within_tolerance"] for t in trials)
    worst = max(t["max_abs_diff"] for t in trials)
    return (f"{identical}/{n} bitwise identical; {close}/{n} equal within tolerance {tolerance(variant):.2g} "
            f"(steps x float32 eps; largest difference {worst:.2g})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50, help="independent kill-and-resume trials")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--signal", choices=["KILL", "TERM"], default="KILL")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--strategy", choices=["default", "mirrored"], default="default")
    which.add_argument("--launcher", action="store_true", help="2 multi-worker processes under kerasdist.launch")
    which.add_argument("--r", action="store_true", help="the run from R (Rscript)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    variant = VARIANTS["launcher" if args.launcher else "r" if args.r else args.strategy]
    sig = getattr(signal, f"SIG{args.signal}")
    rng = random.Random(args.seed)
    trials = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        reference = reference_run(Path(tmp), variant)
        for trial in range(args.kills):
            step = rng.randrange(1, variant.steps)
            result = kill_and_resume(Path(tmp) / f"trial{trial}", reference, [step], rng, sig, variant)
            trials.append(result)
            who = f" on {result['victims'][0]}" if result["victims"] else ""
            exits = result["exit_codes"][0]
            if not variant.external:  # the killed attempt's exit status of every worker
                exits = ", ".join(f"{task} {code}" for task, code in exits[2][0].items()) if exits[2] else exits
            print(f"trial {trial + 1}/{args.kills}: {variant.name} SIG{args.signal} at step {step}{who}, "
                  f"exit {exits}, bitwise identical: {result['bitwise_identical']}, "
                  f"max |diff| {result['max_abs_diff']:.2g}", flush=True)
    line = summary_line(variant, trials)
    summary = {"benchmark": "kill_resume", "variant": variant.name, "signal": args.signal, "trials": args.kills,
               "identical": sum(t["bitwise_identical"] for t in trials),
               "within_tolerance": sum(t["within_tolerance"] for t in trials), "tolerance": tolerance(variant),
               "seconds": round(time.perf_counter() - started, 1), "summary": line,
               "load_average": os.getloadavg()}
    print(line)
    print(json.dumps(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**summary, "details": trials}, indent=1))
    return 0 if summary["within_tolerance"] == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
