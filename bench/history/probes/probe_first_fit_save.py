"""What the first save of a fit blocks training for, with the save memory prepared at the fit's
start (`SaveMemory.prepare`: sized for the model and touched in a thread) against without (issue
#47: the first save paid the first touch of a state-sized buffer). Prints JSON lines.

Each round is a fresh process (as a restarted job's is): bench_checkpoint_scale's model at
`--width` (3520: about 595 MB of state with Adam's slots), a fit of `--steps` batches of 8 with
the checkpoint callback saving every `--every` steps, synchronously or in the background. The two
variants alternate. Per round: the training thread's blocked seconds at each save, the fit's
wall time, and the mean step time before the first save (what the touching thread costs the
steps it runs beside).

usage: .venv/bin/python bench/history/probes/probe_first_fit_save.py [--width 3520] [--rounds 2]
       [--mode sync,background]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]  # bench/, whose modules a probe imports


def child(width: int, steps: int, every: int, background: bool, prepared: bool) -> dict:
    import numpy as np

    sys.path.insert(0, str(HERE))
    import keras

    from bench_checkpoint_scale import prepared_model
    from kerasdist.checkpoint import CheckpointCallback
    from kerasdist.checkpoint.saver import Saver

    if not prepared:
        Saver.prepare = lambda self, model: None  # the code before the change
    model = prepared_model(width)
    x = np.random.default_rng(2).normal(size=(8 * steps, width)).astype("float32")
    step_ends: list[float] = []
    timer = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: step_ends.append(time.perf_counter()))
    with tempfile.TemporaryDirectory(dir=HERE.parent) as scratch:
        callback = CheckpointCallback(Path(scratch) / "ckpt", every_steps=every, every_epoch=False,
                                      async_save=background, keep=2)
        started = time.perf_counter()
        model.fit(x, x, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[timer, callback])
        fit_seconds = time.perf_counter() - started
    before_first = np.diff(step_ends[:every - 1])  # the first step (tracing) left out
    return {"blocked": [round(b, 3) for b in callback.blocked_seconds], "fit": round(fit_seconds, 2),
            "step_before_first_save": round(float(before_first.mean()), 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=3520)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mode", default="sync,background")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, variant = args.child.split(":")
        print(json.dumps(child(args.width, args.steps, args.every, mode == "background", variant == "prepared")))
        return
    results: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for mode in args.mode.split(","):
            for variant in ("prepared", "unprepared"):
                out = subprocess.run([sys.executable, __file__, "--child", f"{mode}:{variant}", "--width",
                                      str(args.width), "--steps", str(args.steps), "--every", str(args.every)],
                                     capture_output=True, text=True, check=True,
                                     env={"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ})
                result = json.loads(out.stdout.strip().splitlines()[-1])
                print(json.dumps({"mode": mode, "variant": variant, **result}), flush=True)
                results.setdefault(f"{mode}:{variant}", []).append(result)
    for key, rounds in results.items():
        firsts = [r["blocked"][0] for r in rounds]
        laters = [b for r in rounds for b in r["blocked"][1:]]
        print(json.dumps({"summary": key, "first_save_blocked": firsts, "later_median": statistics.median(laters),
                          "fit": [r["fit"] for r in rounds],
                          "step_before_first_save": [r["step_before_first_save"] for r in rounds]}))


if __name__ == "__main__":
    main()
