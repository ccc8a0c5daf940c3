"""What a fit with checkpoints holds in memory beyond its model, two source trees side by side
(issue #47: background saves kept a copy of the state and a buffer of the file built from it,
about twice the state; they now write the file as pieces of the copy).

Each round, for each tree (`--old`, then this one), a fresh process (its `python/` first on the
path) builds bench_checkpoint_scale's model at `--size`, trains one step without a callback (the
optimizer's slots made), then fits `--steps` batches of 8 with `checkpoint_callback(every_steps=
--every)`, in the background or synchronously (`--mode`). Printed per process: the peak RSS over
the RSS before that fit (`/proc/self/status` VmHWM, reset first), the fit's seconds, the
training thread's blocked seconds per save, and the state's size; then the medians.

usage: .venv/bin/python bench/history/probes/probe_fit_save_memory.py --old /tmp/old-tree [--size 600M] [--rounds 2]
       [--mode background]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]  # bench/, whose modules a probe imports
sys.path.insert(0, str(HERE))


def child(tree: str, scratch: str, width: int, steps: int, every: int, background: bool) -> dict:
    sys.path.insert(0, str(Path(tree) / "python"))
    import numpy as np

    import bench_checkpoint_scale as scale
    import kerasdist

    model = scale.build_model(width)
    x = np.random.default_rng(2).normal(size=(8 * steps, width)).astype("float32")
    model.fit(x[:8], x[:8], batch_size=8, epochs=1, verbose=0)
    state = sum(v.numpy().nbytes for v in [*model.weights, *model.optimizer.variables])
    callback = kerasdist.checkpoint_callback(Path(scratch) / "ckpt", every_steps=every, every_epoch=False,
                                             async_save=background, keep=1)
    seconds, extra, _ = scale.measured(lambda: model.fit(x, x, batch_size=8, epochs=1, verbose=0, shuffle=False,
                                                         callbacks=[callback]))
    return {"peak_extra_mb": extra / 2 ** 20, "state_mb": state / 2 ** 20, "fit_seconds": seconds,
            "blocked": [round(b, 3) for b in callback.blocked_seconds]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the other source tree (its python/ is imported)")
    parser.add_argument("--size", default="600M")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--mode", choices=["background", "sync"], default="background")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    import bench_checkpoint_scale as scale

    width = scale.width_for(scale.parse_size(args.size))
    background = args.mode == "background"
    if args.child:
        tree, scratch = args.child
        print("RESULT " + json.dumps(child(tree, scratch, width, args.steps, args.every, background)))
        return
    trees = {"old": args.old, "new": str(HERE.parent)}
    peaks: dict[str, list[float]] = {label: [] for label in trees}
    for round_ in range(args.rounds):
        for label, tree in trees.items():
            with tempfile.TemporaryDirectory(prefix="kerasdist-fit-memory-", dir="/var/tmp") as scratch:
                command = [sys.executable, __file__, "--old", args.old, "--size", args.size, "--steps",
                           str(args.steps), "--every", str(args.every), "--mode", args.mode, "--child", tree, scratch]
                done = subprocess.run(command, capture_output=True, text=True)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if not lines:
                sys.exit(f"the {label} tree's process failed:\n{done.stderr[-3000:]}")
            result = json.loads(lines[0][7:])
            peaks[label].append(result["peak_extra_mb"] / result["state_mb"])
            print(round_, label, {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}, flush=True)
    for label, values in peaks.items():
        print(f"{label}: peak extra memory of the fit / state {statistics.median(values):.2f} "
              f"({min(values):.2f}-{max(values):.2f}, {len(values)})")


if __name__ == "__main__":
    main()
