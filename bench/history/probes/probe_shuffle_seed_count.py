"""Which mid-pass iterator states of a reshuffling tf.data pipeline restore exactly in a new
process (issue #58: the "pass start" rule, the family of tensorflow#48178).

A shuffle's seed generator (which draws each pass's reshuffle) belongs to the dataset; an
iterator's state holds its count (`epoch_num_random_samples`) only while the shuffle has a live
iterator. A parallel interleave drops its input's iterator once its input is exhausted, a second
shuffle once its buffer holds the rest of its input, and a shuffle opens its input lazily.

One process reads each pipeline (repeated) for 2.5 passes over small TFRecord files and keeps its
iterator's state before every batch (`compat.iterator_state`); a second process restores each
state into a new iterator of a newly built pipeline (new seed generators, as in a new process)
and compares the next pass's worth of batches with the first process's. Prints, per pipeline and
file set, how many states held every shuffle's count ("complete") and how many restored exactly.

usage: .venv/bin/python bench/history/probes/probe_shuffle_seed_count.py [--count-first]
       (--count-first: the saving process reads one whole pass of a pipeline before iterating it,
       as kerasdist's count_steps does; the restoring one does not)

Measured 2026-11-30 (TensorFlow 2.21.0, 2 shared cores; about 80 s CPU a run). Of 731 states
that held every shuffle's count, all restored exactly; of those that did not (near a pass's end,
and the two-shuffle pipeline's very first state), 63 of 69 restored wrongly:

    count first: False                                 equal files        one long file
    bench pipeline, complete                           98 exact           95 exact
    bench pipeline, incomplete                         2 WRONG (37-38)    5 WRONG (38-39, 78-80)
    two shuffles, complete                             86 exact           87 exact
    two shuffles, incomplete                           13 WRONG, 1 exact  12 WRONG, 1 exact (0)
    count first: True
    bench pipeline, complete                           98 exact           96 exact
    bench pipeline, incomplete                         2 exact (75-76)    2 WRONG, 2 exact
    two shuffles, complete                             85 exact           86 exact
    two shuffles, incomplete                           15 WRONG (0 too)   14 WRONG (0 too)

(An incomplete state restores exactly only when the new process's own iterators happen to have
left the generator at the count the saving process had.)
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

from kerasdist import compat  # noqa: E402

PER_PASS, BATCH = 40, 8  # 320 records a file set
FILE_SETS = {"equal": [40] * 8, "one-long": [10] * 7 + [250]}


def pipelines(folder: str) -> dict:
    def names():
        return tf.data.Dataset.list_files(folder + "/*.tfrecord", shuffle=True, seed=4)

    def parallel(files):
        return files.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=4, deterministic=True)

    return {  # (pipeline, its shuffles)
        "bench: list_files(shuffle) |> parallel interleave |> map |> batch |> prefetch":
            (lambda: parallel(names()).map(lambda r: r).batch(BATCH).prefetch(2), 1),
        "two shuffles: list_files(shuffle) |> interleave |> shuffle(40) |> batch |> prefetch":
            (lambda: parallel(names()).shuffle(40, seed=6).batch(BATCH).prefetch(2), 2),
    }


def make_files(folder: str, sizes: list[int]) -> None:
    for index, size in enumerate(sizes):
        with tf.io.TFRecordWriter(f"{folder}/part-{index:02d}.tfrecord") as writer:
            for record in range(size):
                writer.write(f"{index:02d}-{record:03d}".encode())


def batch_key(batch) -> str:
    return "|".join(value.decode() for value in batch.numpy().reshape(-1))


def save(folder: str, count_first: bool, out: str) -> None:
    saved = {}
    for name, (build, shuffles) in pipelines(folder).items():
        dataset = build()
        if count_first:
            dataset.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1)
        iterator = iter(dataset.repeat())
        states, batches = [], []
        for _ in range(PER_PASS * 5 // 2 + PER_PASS):
            states.append(compat.iterator_state(iterator))
            batches.append(batch_key(next(iterator)))
        saved[name] = (shuffles, states[:PER_PASS * 5 // 2], batches)
    Path(out).write_bytes(pickle.dumps(saved))


def restore(folder: str, out: str) -> None:
    saved = pickle.loads(Path(out).read_bytes())
    builders = pipelines(folder)
    for name, (shuffles, states, batches) in saved.items():
        table: dict[tuple[bool, bool], list[int]] = {}
        for at, state in enumerate(states):
            iterator = iter(builders[name][0]().repeat())
            compat.restore_iterator_state(iterator, state)
            right = [batch_key(next(iterator)) for _ in range(PER_PASS)] == batches[at:at + PER_PASS]
            complete = compat.shuffle_counts_kept(state) >= shuffles
            table.setdefault((complete, right), []).append(at)
        print(f"  {name}")
        for (complete, right), points in sorted(table.items()):
            print(f"    {'complete' if complete else 'incomplete':10} {'exact' if right else 'WRONG':5} "
                  f"{len(points):3} states, at batches {points[:16]}{' ...' if len(points) > 16 else ''}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count-first", action="store_true")
    parser.add_argument("--side", choices=["save", "restore"])
    parser.add_argument("--folder")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.side == "save":
        return save(args.folder, args.count_first, args.out)
    if args.side == "restore":
        return restore(args.folder, args.out)
    print(f"TensorFlow {tf.__version__}; {PER_PASS} batches a pass; count first: {args.count_first}")
    for label, sizes in FILE_SETS.items():
        with tempfile.TemporaryDirectory() as folder:
            make_files(folder, sizes)
            out = f"{folder}/states.pkl"
            me = [sys.executable, __file__, "--folder", folder, "--out", out]
            subprocess.run([*me, "--side", "save", *(["--count-first"] if args.count_first else [])], check=True)
            print(f"files of {label} sizes ({sizes}):", flush=True)
            subprocess.run([*me, "--side", "restore"], check=True)


if __name__ == "__main__":
    main()
