"""2-worker MultiWorkerMirroredStrategy across processes vs one process on the same 2 cores.

For a few model widths, trains the same global batches (a) in one process with the default
strategy and (b) in 2 worker processes on 127.0.0.1 started by the launcher, and reports the
steps/s ratio (2 workers / 1 process) measured inside fit, start-up excluded. Variants are
interleaved, several repetitions, median. One informational figure per width (bench/_common.py; no
target: on one machine the ratio shows the cost of the collectives, not a speed-up to meet), the
rows in the details. Prints one JSON line; writes bench/results/multi_worker.json.

usage: python bench/bench_multi_worker.py [--widths 64,512,2048] [--repeats 2] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from _common import figure, write_result  # bench/ is the script's directory

GLOBAL_BATCH, FEATURES = 256, 256


def worker(width: int, steps: int) -> None:
    """One training process (one of the workers, or the single process)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    import kerasdist

    strategy = kerasdist.select_strategy(tpu=False)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL_BATCH * 8, FEATURES)).astype("float32")
    y = rng.normal(size=(GLOBAL_BATCH * 8, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).repeat()
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(width, activation="relu"),
                                  keras.layers.Dense(width, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(data, steps_per_epoch=5, epochs=1, verbose=0)  # trace, connect, warm up
    start = time.perf_counter()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
    seconds = time.perf_counter() - start
    print("RESULT " + json.dumps({"steps_per_second": steps / seconds, "params": model.count_params()}), flush=True)


def run_single(width: int, steps: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", str(width), "--steps", str(steps)],
                         capture_output=True, text=True, env={**os.environ, "TF_CONFIG": ""}, check=True).stdout
    return _result(out)


def run_two_workers(width: int, steps: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "kerasdist", "launch", "-n", "2", "--timeout", "600", "--",
                          __file__, "--worker", str(width), "--steps", str(steps)],
                         capture_output=True, text=True, check=True).stdout
    rates = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
    return min(rates, key=lambda r: r["steps_per_second"])  # the group goes at its slowest worker


def _result(out: str) -> dict:
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT ")).split(" ", 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--widths", default="64,512,2048")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps)
    rows, figures = [], []
    for width in (int(w) for w in args.widths.split(",")):
        ratios, singles, pairs = [], [], []
        for _ in range(args.repeats):
            single = run_single(width, args.steps)
            pair = run_two_workers(width, args.steps)
            singles.append(single["steps_per_second"])
            pairs.append(pair["steps_per_second"])
            ratios.append(pair["steps_per_second"] / single["steps_per_second"])
        rows.append({"width": width, "params": single["params"],
                     "single_steps_per_s": round(statistics.median(singles), 2),
                     "two_workers_steps_per_s": round(statistics.median(pairs), 2),
                     "ratio_two_workers_over_single_median": round(statistics.median(ratios), 3),
                     "ratios": [round(r, 3) for r in ratios]})
        figures.append(figure(
            f"two_workers_vs_one_process_w{width}", ratios, None,
            f"steps/s of 2 MultiWorkerMirroredStrategy workers on 127.0.0.1 (the slower one) / one "
            f"process, same global batches, two Dense({width}) layers ({single['params']:,} "
            f"parameters), same 2 cores: informational, the cost of the per-step all-reduce",
            width=width, parameters=single["params"]))
        print(json.dumps(rows[-1]), flush=True)
    write_result("multi_worker", figures, global_batch=GLOBAL_BATCH, steps=args.steps,
                 repeats=args.repeats, rows=rows)


if __name__ == "__main__":
    main()
