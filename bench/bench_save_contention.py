"""Why background checkpoint saves do not shorten fits on a small CPU machine: how much another
thread's work slows a training step.

One training step of bench_checkpoint.py's model (5.27M parameters, batch 128) is timed
--steps times alone, then while another thread loops on one kind of work:
- `files`: building a checkpoint's files from a snapshot (`Snapshot.files()`: the HDF5
  weights and the zip, what a background save does first);
- `sha256`: hashing 63 MB, C code that releases the GIL (CPU contention only);
- `python`: a pure-Python loop, which holds the GIL (CPU and GIL contention);
- `files_idle`: `files` in a thread of Linux's SCHED_IDLE class, as the background writer runs
  while nobody waits for it (kerasdist.checkpoint.background).
Rounds interleave the conditions (alone and the four above); each figure is a condition's median step time / the
median step time alone in the same round. If `files` is near `sha256` and well below `python`,
the write slows training by taking a core, not by holding the GIL.

usage: python bench/bench_save_contention.py [--steps 30] [--repeats 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import threading
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from _common import figure, write_result  # noqa: E402  (bench/ is the script's directory)
from bench_checkpoint import BATCH, CLASSES, FEATURES, build_model  # noqa: E402
from kerasdist.checkpoint import background  # noqa: E402
from kerasdist.checkpoint.snapshot import take_snapshot  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=4096)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).cache().repeat()
    model = build_model()
    model.fit(data, steps_per_epoch=20, epochs=1, verbose=0)  # trace and build
    batches, train_step = iter(data), model.make_train_function()
    state, big = take_snapshot(model), os.urandom(63_000_000)
    work: dict[str, Callable[[], object] | None] = {
        "alone": None,
        "files": state.files,
        "sha256": lambda: hashlib.sha256(big).digest(),
        "python": lambda: sum(range(2_000_000)),
        "files_idle": state.files,
    }

    def step_times(name: str) -> float:
        beside, stop = work[name], threading.Event()

        def loop() -> None:
            if name.endswith("_idle"):
                background._set_policy(0, os.SCHED_IDLE)
            while not stop.is_set():
                beside()

        thread = threading.Thread(target=loop) if beside else None
        if thread:
            thread.start()
        times = []
        for _ in range(args.steps):
            started = time.perf_counter()
            train_step(batches)
            times.append(time.perf_counter() - started)
        stop.set()
        if thread:
            thread.join()
        return statistics.median(times)

    medians: dict[str, list[float]] = {name: [] for name in work}
    for round_ in range(args.repeats):
        for name in (list(work) if round_ % 2 == 0 else list(reversed(work))):
            medians[name].append(step_times(name))
    what = "median training step beside a thread doing {} / the median step alone, per round"
    figures = [
        figure(f"step_beside_{name}", [m / a for m, a in zip(medians[name], medians["alone"], strict=True)],
               None, what.format(description))
        for name, description in (("files", "Snapshot.files()"), ("sha256", "sha256 of 63 MB (GIL released)"),
                                  ("python", "a pure-Python loop (GIL held)"),
                                  ("files_idle", "Snapshot.files() at SCHED_IDLE, as the writer runs"))
    ]
    write_result("save_contention", figures, step_ms_alone=[round(m * 1000, 1) for m in medians["alone"]],
                 steps=args.steps, repeats=args.repeats, load_average=[round(v, 2) for v in os.getloadavg()])


if __name__ == "__main__":
    main()
