"""A fresh process's first `save_checkpoint`, two source trees side by side (issue #47: the first
save of a process built its file in a buffer of the state's size, fresh memory that this VM
charges seconds a GB to touch; it now builds it as pieces, views of the variables).

Each round, for each tree (`--old`, then this one), a fresh process (its `python/` first on the
path) restores the model with `make_or_restore_model`, waits `--settle` seconds (memory it freed
is taken back by the VM meanwhile, as in a job that restores and then trains), then times two
`save_checkpoint`s and a `dd`-style write of the same number of bytes with fsync (64 MB writes
from memory already touched: `bench_checkpoint_scale`'s `dd_write`), each with its peak extra
memory. Prints a line per process and the medians.

usage: .venv/bin/python bench/history/probes/probe_first_save.py --old /tmp/old-tree [--size 600M] [--rounds 3]
       [--settle 10]   (the old tree: e.g. `git worktree add /tmp/old-tree <commit>`)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]  # bench/, whose modules a probe imports
sys.path.insert(0, str(HERE))


def child(tree: str, checkpoint: str, scratch: str, width: int, settle: float) -> dict:
    sys.path.insert(0, str(Path(tree) / "python"))
    import numpy as np

    import bench_checkpoint_scale as scale
    import kerasdist
    from kerasdist.checkpoint import save_checkpoint

    model = kerasdist.make_or_restore_model(checkpoint, lambda: scale.build_model(width))
    if not model.optimizer.built:
        raise RuntimeError(f"nothing restored from {checkpoint}")
    time.sleep(settle)
    result: dict = {}
    for name in ("first_save", "second_save"):
        target = Path(scratch) / name
        seconds, extra, _ = scale.measured(lambda t=target: save_checkpoint(model, t, epoch=1))
        result[name], result[name + "_extra_mb"] = seconds, extra / 2 ** 20
        shutil.rmtree(target)
    size = (Path(kerasdist.latest_checkpoint(checkpoint).path) / "model.keras").stat().st_size
    payload = np.frombuffer(np.random.default_rng(0).bytes(size), np.uint8)
    started = time.perf_counter()
    with open(Path(scratch) / "dd.bin", "wb", buffering=0) as stream:
        view = memoryview(payload)
        for start in range(0, len(view), 64 << 20):
            stream.write(view[start:start + (64 << 20)])
        os.fsync(stream.fileno())
    result["dd_write"] = time.perf_counter() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the other source tree (its python/ is imported)")
    parser.add_argument("--size", default="600M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    import bench_checkpoint_scale as scale

    width = scale.width_for(scale.parse_size(args.size))
    if args.child:
        tree, checkpoint, scratch = args.child[:3]
        print("RESULT " + json.dumps(child(tree, checkpoint, scratch, width, args.settle)))
        return
    sys.path.insert(0, str(HERE.parent / "python"))
    import numpy as np

    from kerasdist.checkpoint import save_checkpoint

    with tempfile.TemporaryDirectory(prefix="kerasdist-first-save-", dir="/var/tmp") as work:
        checkpoint, scratch = Path(work) / "ckpt", Path(work) / "scratch"
        model = scale.build_model(width)
        model.fit(np.zeros((2, width), "float32"), np.zeros((2, width), "float32"), verbose=0)
        save_checkpoint(model, checkpoint, epoch=1)
        model = None
        trees = {"old": args.old, "new": str(HERE.parent)}
        ratios: dict[str, list[float]] = {f"{t}_{s}": [] for t in trees for s in ("first", "second")}
        for round_ in range(args.rounds):
            for label, tree in trees.items():
                shutil.rmtree(scratch, ignore_errors=True)
                scratch.mkdir()
                command = [sys.executable, __file__, "--old", args.old, "--size", args.size, "--settle",
                           str(args.settle), "--child", tree, str(checkpoint), str(scratch), "0"]
                done = subprocess.run(command, capture_output=True, text=True)
                lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                if not lines:
                    sys.exit(f"the {label} tree's process failed:\n{done.stderr[-3000:]}")
                result = json.loads(lines[0][7:])
                for save in ("first", "second"):
                    ratios[f"{label}_{save}"].append(result[f"{save}_save"] / result["dd_write"])
                print(round_, label, {k: round(v, 3) for k, v in result.items()}, flush=True)
        for name, values in ratios.items():
            print(f"{name}_save / dd_write: {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}, "
                  f"{len(values)})")


if __name__ == "__main__":
    main()
