"""2-worker MultiWorkerMirroredStrategy across processes vs one process on the same 2 cores; and
what the step watchdog and the step times cost a step there (#59).

For a few model widths, trains the same global batches (a) in one process with the default
strategy and (b) in 2 worker processes on 127.0.0.1 started by the launcher, and reports the
steps/s ratio (2 workers / 1 process) measured inside fit, start-up excluded. Variants are
interleaved, several repetitions, median. One informational figure per width (bench/_common.py; no
target: on one machine the ratio shows the cost of the collectives, not a speed-up to meet), the
rows in the details.

Then, at the smallest width (the shortest steps, where a fixed cost per step shows most), the same
2 workers train with kerasdist's checkpoint callback (one checkpoint, at the end) with
`hang_timeout="auto"` (the step watchdog, and the step times' sampled clock around the
all-reduces) and with `hang_timeout=None` (neither), interleaved, `--watchdog-repeats` pairs:
the figure is steps/s with over without (target: within the spread of the runs without it, i.e.
at least their slowest over their median). Prints one JSON line; writes
bench/results/multi_worker.json.

usage: python bench/bench_multi_worker.py [--widths 64,512,2048] [--repeats 2] [--steps 60]
                                          [--watchdog-repeats 4] [--watchdog-steps 200]
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


def worker(width: int, steps: int, watchdog: str | None = None) -> None:
    """One training process (one of the workers, or the single process); with `watchdog` ("auto"
    or "off"), kerasdist's checkpoint callback trains along with that hang_timeout."""
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
    callbacks = []
    if watchdog is not None:
        import tempfile

        directory = kerasdist.chief_path(tempfile.mkdtemp(prefix="kerasdist-bench-"))
        callbacks = [kerasdist.checkpoint_callback(directory, hang_timeout=None if watchdog == "off" else "auto")]
    model.fit(data, steps_per_epoch=5, epochs=1, verbose=0, callbacks=callbacks)  # trace, connect, warm up
    start = time.perf_counter()
    # With kerasdist's checkpoint callback, fit resumes and `epochs` counts in total: the warm-up was epoch 0.
    model.fit(data, steps_per_epoch=steps, epochs=2 if callbacks else 1, verbose=0, callbacks=callbacks)
    seconds = time.perf_counter() - start
    print("RESULT " + json.dumps({"steps_per_second": steps / seconds, "params": model.count_params()}), flush=True)


def run_single(width: int, steps: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", str(width), "--steps", str(steps)],
                         capture_output=True, text=True, env={**os.environ, "TF_CONFIG": ""}, check=True).stdout
    return _result(out)


def run_two_workers(width: int, steps: int, watchdog: str | None = None) -> dict:
    extra = ["--watchdog", watchdog] if watchdog else []
    out = subprocess.run([sys.executable, "-m", "kerasdist", "launch", "-n", "2", "--timeout", "600", "--",
                          __file__, "--worker", str(width), "--steps", str(steps), *extra],
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
    parser.add_argument("--watchdog", choices=["auto", "off"], help=argparse.SUPPRESS)
    parser.add_argument("--watchdog-repeats", type=int, default=4)
    parser.add_argument("--watchdog-steps", type=int, default=200)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps, args.watchdog)
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
    watchdog = watchdog_cost(min(int(w) for w in args.widths.split(",")), args.watchdog_steps, args.watchdog_repeats)
    figures.append(watchdog.pop("figure"))
    write_result("multi_worker", figures, global_batch=GLOBAL_BATCH, steps=args.steps,
                 repeats=args.repeats, rows=rows, watchdog=watchdog)


def stepped_microseconds(calls: int = 200_000) -> float:
    """The watchdog's own work at a step end (`StepWatchdog.stepped`, its backstop moved on every
    half second), timed alone in this process: microseconds a call, the median of 5 rounds."""
    from kerasdist.checkpoint.watchdog import StepWatchdog

    watchdog = StepWatchdog("auto")
    watchdog.start(step=0, task=None, is_chief=True, peers=None, record=None)
    rounds = []
    try:
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                watchdog.stepped(1)
            rounds.append((time.perf_counter() - start) / calls * 1e6)
    finally:
        watchdog.stop()
    return round(statistics.median(rounds), 3)


def watchdog_cost(width: int, steps: int, repeats: int) -> dict:
    """2 workers with the checkpoint callback, hang_timeout "auto" and None interleaved (the
    order reversed every other pair): steps/s with over without, the target within the spread."""
    rates: dict[str, list[float]] = {"auto": [], "off": []}
    for index in range(repeats):
        for variant in ("auto", "off") if index % 2 == 0 else ("off", "auto"):
            rates[variant].append(run_two_workers(width, steps, variant)["steps_per_second"])
    off = statistics.median(rates["off"])
    ratios = [rate / off for rate in rates["auto"]]
    spread = min(rates["off"]) / off  # the runs without it: their slowest over their median
    details = {"width": width, "steps": steps, "repeats": repeats,
               "auto_steps_per_s": [round(r, 2) for r in rates["auto"]],
               "off_steps_per_s": [round(r, 2) for r in rates["off"]], "off_spread": round(spread, 4),
               "stepped_microseconds": stepped_microseconds()}
    details["figure"] = figure(
        "watchdog_steps_per_s_with_over_without", ratios, f">= {spread:.4f}",
        f"steps/s of 2 workers (Dense({width}) x2, the shortest steps) with kerasdist's checkpoint callback, "
        "hang_timeout=\"auto\" (the step watchdog and the step times' sampled clock) over hang_timeout=None, "
        "each pair interleaved; target: within the spread of the runs without it (their slowest over their median)",
        width=width)
    print(json.dumps({k: v for k, v in details.items() if k != "figure"}), flush=True)
    return details


if __name__ == "__main__":
    main()
