"""#59's figures: from a hang to the first resumed step, under `kerasdist launch` and under the
Slurm recipe on the 2-host test cluster (RELIABILITY.md, "Hangs").

  python tools/hang_recovery.py --trials 5 [--timeout 30] [--kind python|c] [--slurm] [--json FILE]

Each trial trains tests/python/scripts/train_hang.py on 2 workers (a checkpoint every step, 0.1 s
paced steps, hang_timeout --timeout) and has worker 1 block for good after step 8, in a callback
(`python`) or in C code that holds the GIL (`c`). Two clocks: the outside stopwatch runs from the
moment the stuck process blocked (it writes the time just before) to the first step line this
tool reads from the restarted group's output (the launcher's, or the Slurm job's file, polled
every 20 ms); kerasdist's own figure is goodput's recovery of the restarted attempt (from the end
of the last step the hung attempt completed to the new attempt's first step), with its parts.
Prints one line per trial, then the median and range of each. --slurm needs root (a real Slurm
cluster in network namespaces, tools/slurm_cluster.py, torn down at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "python" / "scripts" / "train_hang.py"
HANG_STEP = 8
LAUNCH = (
    "import sys, kerasdist\n"
    "r = kerasdist.launch(sys.argv[1:], num_workers=2, max_restarts=1, warm_start=True, timeout=900)\n"
    "sys.exit(r.exit_code)\n"
)


def training_args(folder: Path, timeout: float, kind: str) -> list[str]:
    return [str(SCRIPT), "--checkpoint-dir", str(folder / "ckpt"), "--out-dir", str(folder / "out"),
            "--step-seconds", "0.1", "--hang-timeout", f"{timeout:g}", "--hang", f"{kind}:worker:1:{HANG_STEP}"]


def hung_at(folder: Path) -> float:
    return float((folder / "hangs-at").read_text().split()[1])


def launcher_trial(folder: Path, timeout: float, kind: str) -> dict:
    """One hang under `kerasdist launch` (its own warm-start server): both clocks."""
    command = [sys.executable, "-c", LAUNCH, sys.executable, *training_args(folder, timeout, kind)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    restarted, first_step = False, None
    for line in process.stdout:
        seen = time.time()
        if "kerasdist launch: restarting the group" in line:
            restarted = True
        elif restarted and first_step is None and re.match(r"^\[worker \d\] step \d+$", line.strip()):
            first_step = seen
    code = process.wait()
    return summary(folder / "ckpt", code, hung_at(folder), first_step)


def slurm_trial(cluster, folder: Path, timeout: float, kind: str) -> dict:
    """One hang under the Slurm recipe (each task under its supervisor, restarted in place)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import slurm_chaos as chaos

    python = os.environ.get("KERASDIST_PYTHON", sys.executable)
    job_id = cluster.submit(chaos.RECIPE, python, *training_args(folder, timeout, kind), options=chaos.JOB_OPTIONS,
                            cwd=ROOT)
    cluster.wait_started(job_id)
    chaos.wait_for_output(cluster, job_id, rf"^step {HANG_STEP}$", timeout=300)
    first_step = chaos.first_step_after(cluster, job_id, 0, timeout=600)
    job = cluster.wait_final(job_id, 600)
    return summary(folder / "ckpt", 0 if job.state == "COMPLETED" else 1, hung_at(folder), first_step)


def summary(checkpoint_dir: Path, code: int, hung: float, first_step: float | None) -> dict:
    import kerasdist

    report = kerasdist.goodput(checkpoint_dir)
    hung_attempt, resumed = report.attempts[0], report.attempts[1]
    return {"exit_code": code, "statuses": [a.status for a in report.attempts],
            "stuck_worker": (hung_attempt.hang or {}).get("worker"),
            "stopwatch": round(first_step - hung, 2) if first_step else None,
            "recovery": resumed.recovery, "hang_seconds": hung_attempt.seconds["hang"],
            "load": " ".join(Path("/proc/loadavg").read_text().split()[:3])}


def print_spread(name: str, values: list[float]) -> None:
    if values:
        print(f"{name}: median {statistics.median(values):.1f} s, range {min(values):.1f}-{max(values):.1f} s "
              f"({len(values)} trials)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=30.0, help="hang_timeout (seconds)")
    parser.add_argument("--kind", choices=["python", "c"], default="python")
    parser.add_argument("--slurm", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    trials = []
    cluster = None
    if args.slurm:
        sys.path.insert(0, str(ROOT / "tools"))
        import slurm_cluster

        cluster = slurm_cluster.SlurmCluster(2)
        cluster.up()
    try:
        for index in range(args.trials):
            if cluster is not None:
                folder = cluster.shared / f"hang-{index}"
                folder.mkdir(parents=True)
                trial = slurm_trial(cluster, folder, args.timeout, args.kind)
            else:
                folder = Path(tempfile.mkdtemp(prefix="kerasdist-hang-"))
                trial = launcher_trial(folder, args.timeout, args.kind)
            trials.append(trial)
            print(json.dumps(trial), flush=True)
    finally:
        if cluster is not None:
            cluster.down()
    done = [t for t in trials if t["stopwatch"] is not None and t["recovery"]]
    print_spread("stopwatch (hang to first resumed step)", [t["stopwatch"] for t in done])
    print_spread("goodput's recovery (last step to first resumed step)", [t["recovery"]["total"] for t in done])
    print_spread("stopwatch minus goodput's recovery", [t["stopwatch"] - t["recovery"]["total"] for t in done])
    for part in ("detection", "down", "python_and_tensorflow", "cluster", "restore", "first_step"):
        print_spread(f"  {part}", [t["recovery"][part] for t in done])
    if args.json:
        Path(args.json).write_text(json.dumps(trials, indent=1))
    ok = all(t["exit_code"] == 0 and t["statuses"][-1] == "completed" for t in trials)
    return 0 if ok and len(done) == len(trials) else 1


if __name__ == "__main__":
    sys.exit(main())
