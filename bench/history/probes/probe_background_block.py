"""What a background save's snapshot costs the training thread (issue #47), at SIZE of model state
(bench_checkpoint_scale.py's model: 4 Dense layers with Adam, one step taken). Prints one JSON line.

`steady SIZE [ROUNDS]`: `take_snapshot` into a SaveMemory warmed by three saves, beside `memcopy`
(bench_checkpoint_scale.py's one copy of the state into touched memory) just before it, and Keras's
walk alone (`compat.record_save` with no copy).

`held-reads SIZE [ROUNDS]`: what training really waits, two ways, each followed by two training
steps (`train_on_batch`): the snapshot as it is (the values copied on the training thread), and the
variables' reads held (no copy: TensorFlow copies a variable on write while a read of it is held)
with a thread copying them into the SaveMemory and letting each read go; beside steps alone.

`first-saves SIZE plain|pretouch`: a fresh process's first three snapshots after three training
steps, with the SaveMemory's buffer made and touched (one write per page) in a thread during those
steps (`pretouch`) or not (`plain`): the seconds of the steps and of the saves.

usage: PYTHONPATH=$PWD/python .venv/bin/python bench/history/probes/probe_background_block.py steady 600M
"""

from __future__ import annotations

import json
import mmap
import os
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

import bench_checkpoint_scale as scale  # noqa: E402


def timed(action, *args):
    """(seconds, result) of `action(*args)`."""
    started = time.perf_counter()
    result = action(*args)
    return time.perf_counter() - started, result


def memcopy(model) -> float:
    seconds: dict = {}
    scale.timed_copy(model, seconds)
    return seconds["memcopy"]


def steady(model, rounds: int) -> dict:
    from kerasdist import compat
    from kerasdist.checkpoint.snapshot import SaveMemory, take_snapshot

    memory, out = SaveMemory(), {"memcopy": [], "take_snapshot": [], "walk_without_copies": []}
    for _ in range(3):
        take_snapshot(model, memory).files()
    for _ in range(rounds):
        out["memcopy"].append(memcopy(model))
        seconds, taken = timed(take_snapshot, model, memory)
        out["take_snapshot"].append(seconds)
        taken.files()
        out["walk_without_copies"].append(timed(compat.record_save, model, lambda value: value)[0])
    out["take_snapshot_vs_memcopy"] = [t / m for t, m in zip(out["take_snapshot"], out["memcopy"], strict=True)]
    return out


def held_reads(model, rounds: int) -> dict:
    from kerasdist.checkpoint import snapshot

    x = np.random.default_rng(1).normal(size=(8, model.input_shape[-1])).astype("float32")
    memory = snapshot.SaveMemory()
    for _ in range(3):
        snapshot.take_snapshot(model, memory).files()
    out = {k: [] for k in ("steps_alone", "copied_blocked", "copied_next_steps", "held_blocked",
                           "held_next_steps", "held_thread_copy", "memcopy")}

    def step() -> float:
        return timed(model.train_on_batch, x, x)[0]

    def copy_and_let_go(entries, space) -> None:
        started = time.perf_counter()
        for entry in entries:
            for index, (key, value) in enumerate(entry.values):
                entry.values[index] = (key, space.values.copy_of(np.asarray(value)))
        out["held_thread_copy"].append(time.perf_counter() - started)

    for _ in range(rounds):
        out["steps_alone"] += [step(), step()]
        out["memcopy"].append(memcopy(model))
        seconds, taken = timed(snapshot.take_snapshot, model, memory)
        out["copied_blocked"].append(seconds)
        out["copied_next_steps"] += [step(), step()]
        taken.files()
        seconds, recorded = timed(snapshot._record_model, model, None)  # reads of the variables, held
        out["held_blocked"].append(seconds)
        thread = threading.Thread(target=copy_and_let_go, args=(recorded.entries, memory.next_save()))
        del recorded
        thread.start()
        out["held_next_steps"] += [step(), step()]
        thread.join()
    return out


def first_saves(model, how: str) -> dict:
    from kerasdist.checkpoint.snapshot import SaveMemory, take_snapshot

    x = np.random.default_rng(1).normal(size=(8, model.input_shape[-1])).astype("float32")
    memory, out = SaveMemory(), {"how": how, "steps": [], "saves": [], "waited_for_touch": 0.0}
    thread = None
    if how == "pretouch":
        size = sum(-(-v.numpy().nbytes // 64) * 64 for v in [*model.weights, *model.optimizer.variables])

        def touch(arena) -> None:
            buffer = np.empty(size, np.uint8)
            buffer[::mmap.PAGESIZE] = 0
            arena._buffer = buffer

        thread = threading.Thread(target=touch, args=(memory.next_save().values,))
        thread.start()
    for _ in range(3):
        out["steps"].append(timed(model.train_on_batch, x, x)[0])
    if thread is not None:
        out["waited_for_touch"] = timed(thread.join)[0]
    for _ in range(3):
        seconds, taken = timed(take_snapshot, model, memory)
        out["saves"].append(seconds)
        taken.files()
        model.train_on_batch(x, x)
    return out


def main() -> None:
    mode, size = sys.argv[1], scale.parse_size(sys.argv[2])
    model = scale.prepared_model(scale.width_for(size))
    started_load = os.getloadavg()
    if mode == "steady":
        out = steady(model, int(sys.argv[3]) if len(sys.argv) > 3 else 8)
    elif mode == "held-reads":
        out = held_reads(model, int(sys.argv[3]) if len(sys.argv) > 3 else 4)
    else:
        out = first_saves(model, sys.argv[3])
    medians = {k: round(statistics.median(v), 4) for k, v in out.items() if isinstance(v, list) and v}
    print(json.dumps({"mode": mode, "size": sys.argv[2], "medians": medians,
                      "runs": {k: [round(x, 4) for x in v] if isinstance(v, list) else v for k, v in out.items()},
                      "load": [round(v, 1) for v in (*started_load, *os.getloadavg())],
                      "utc": time.strftime("%H:%M:%S", time.gmtime())}))


if __name__ == "__main__":
    main()
