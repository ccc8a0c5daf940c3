"""What warm start saves on a restart (`launch(warm_start=True)`, kerasdist.launch.warm_start).

A 2-worker launch whose worker 1 SIGKILLs itself once both workers are up; the launcher restarts
the group. Measured from the kill to the moment both restarted workers have imported kerasdist
and run a TensorFlow operation (what a restart must do before it can form its cluster), with warm
start and without, alternating, `--repeats` times each; plus the CPU seconds of the whole launch
(this process's children, the server included). Figures: each side's seconds and the ratio
cold / warm, pair by pair.

    .venv/bin/python bench/bench_warm_start.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kerasdist  # noqa: E402
from _common import figure, write_result  # noqa: E402

TASK = """
import os, signal, time
import kerasdist, tensorflow as tf
tf.reduce_sum(tf.ones(4)).numpy()
print(f"ready {time.time():.6f}", flush=True)
if os.environ["KERASDIST_RESTART"] == "0":
    if os.environ["KERASDIST_TASK_INDEX"] == "1":
        time.sleep(1)  # worker 0 up too
        print(f"killed {time.time():.6f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
"""


def restart_seconds(script: Path, warm: bool) -> tuple[float, float]:
    """(kill -> both restarted workers ready, CPU seconds of the launch's processes)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    read, write = os.pipe()
    saved = os.dup(1)
    os.dup2(write, 1)  # the launcher echoes the workers' lines to stdout: read them back
    try:
        result = kerasdist.launch([str(script)], num_workers=2, max_restarts=1, warm_start=warm,
                                  grace_period=2, timeout=300)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(write)
    out = os.read(read, 1 << 20).decode()
    os.close(read)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not result.ok or result.restarts != 1:
        raise RuntimeError(f"the launch ended {result.message}:\n{out[-2000:]}")
    killed = float(re.search(r"killed (\S+)", out)[1])
    ready = [float(t) for t in re.findall(r"ready (\S+)", out)]
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return max(ready[-2:]) - killed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"warm": [], "cold": [], "warm_cpu": [], "cold_cpu": []}
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "task.py"
        script.write_text(TASK)
        for _ in range(args.repeats):
            for side in ("warm", "cold"):
                seconds, cpu = restart_seconds(script, side == "warm")
                runs[side].append(seconds)
                runs[f"{side}_cpu"].append(cpu)
    figures = [
        figure("restart seconds, warm start", runs["warm"], None,
               "from a worker's SIGKILL to both restarted workers past `import kerasdist` and a TF op"),
        figure("restart seconds, cold", runs["cold"], None, "the same without warm start"),
        figure("restart cold / warm", [c / w for c, w in zip(runs["cold"], runs["warm"], strict=True)], None,
               "pair by pair"),
        figure("launch CPU seconds cold / warm", [c / w for c, w in zip(runs["cold_cpu"], runs["warm_cpu"],
                                                                         strict=True)], None,
               "CPU of every process of the launch (2 starts of 2 workers; warm: and its server)"),
    ]
    write_result("warm_start", figures, warm_cpu_seconds=runs["warm_cpu"], cold_cpu_seconds=runs["cold_cpu"])


if __name__ == "__main__":
    main()
