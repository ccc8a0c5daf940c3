"""The data users bring (#58): what reading it step by step costs, what its position adds to a
checkpoint, and how long a resume takes at the start and at the end of an epoch.

- step: steps/s of a small model's fit on a batched tf.data pipeline (shuffle, batch, prefetch)
  fed by kerasdist's reader (one batch pulled per step just before it, split over the replicas:
  what every trainer does with such data) over Keras's own fit of the same dataset
  (tf.distribute's iterator, prefetching to the replicas), under 2 CPU replicas; each round times
  one fit of each, in alternating order.
- checkpoint: a pipeline of 32x32x3 float images behind a 10,000-element shuffle buffer: the
  bytes of a checkpoint with the input's position over without it (the model's files alone), and
  the time of that save (the position serialized and written) over the same save without it.
- resume: a file set of TFRecord files (1 GB by default), read through list_files, an interleave
  and a batch: the time from a new reader to its first batch when resuming at the first and at
  the last batch of an epoch, with the files in order (the position kept where it is: a symbolic
  checkpoint) and reshuffled each pass (the position where it is when its state holds the
  shuffle's random state, else the last one that did, the batches since read again:
  data/resumable.py says why). Each resume is a fresh dataset and reader in this process,
  the files in the page cache (read once before).
Prints one JSON line and writes bench/results/user_data.json.

    .venv/bin/python bench/bench_user_data.py [--reps 5] [--file-gb 1.0] [--buffer 10000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasdist  # noqa: E402

kerasdist.simulate_devices(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from _common import figure, write_result  # noqa: E402
from kerasdist.checkpoint.manager import as_manager  # noqa: E402
from kerasdist.checkpoint.record import Progress  # noqa: E402
from kerasdist.data.resumable import DatasetInput  # noqa: E402


def small_model(strategy, width=64):
    with strategy.scope():
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(width, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def step_figures(reps: int, strategy) -> list[dict]:
    rng = np.random.default_rng(0)
    x, y = rng.random((8192, 32), dtype=np.float32), rng.integers(0, 10, 8192)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(8192, seed=1).batch(128).prefetch(2)
    steps, ours, theirs = 64, [], []
    source = DatasetInput(data)
    source.start(kerasdist.context.context_of(strategy), None, 0, 0)
    models = {"ours": small_model(strategy), "keras": small_model(strategy)}
    for _ in range(2):  # warm-up: tracing
        fit(models, source, data, steps, "ours"), fit(models, source, data, steps, "keras")
    for rep in range(reps):
        order = ("ours", "keras") if rep % 2 == 0 else ("keras", "ours")
        times = {name: fit(models, source, data, steps, name) for name in order}
        ours.append(steps / times["ours"])
        theirs.append(steps / times["keras"])
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return [figure("user_data_steps_vs_keras_fit", ratios, None,
                   "steps/s of fit on a batched dataset read by kerasdist (one batch per step, position kept) "
                   "over Keras's own fit of it (2 CPU replicas)",
                   ours_steps_per_s=statistics.median(ours), keras_steps_per_s=statistics.median(theirs))]


def fit(models, source, data, steps, name) -> float:
    """One fit of `steps` steps: on kerasdist's reader of `data` (`source`), or Keras's own."""
    started = time.perf_counter()
    models[name].fit(source.keras_input() if name == "ours" else data, epochs=1, steps_per_epoch=steps, verbose=0)
    return time.perf_counter() - started


def checkpoint_figures(reps: int, buffer: int, strategy) -> list[dict]:
    images = np.random.default_rng(1).random((buffer + 2048, 32, 32, 3), dtype=np.float32)
    labels = np.arange(len(images)) % 10
    data = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(buffer, seed=2).batch(64)
    with strategy.scope():
        model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
                                  keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    source = DatasetInput(data)
    source.count_steps()
    source.start(kerasdist.context.context_of(strategy), None, 0, 0)
    source.next_batch()  # the shuffle buffer filled
    sizes, times = [], []
    for rep in range(reps):
        folder = Path(tempfile.mkdtemp(prefix="bench-user-data-ckpt-"))
        timed = {}
        for with_input in ((True, False) if rep % 2 == 0 else (False, True)):
            started = time.perf_counter()
            position = source.state() if with_input else None
            info = as_manager(folder / str(with_input)).save(model, Progress.of(0, 1, input=position))
            timed[with_input] = (time.perf_counter() - started, info.size)
        times.append(timed[True][0] / timed[False][0])
        sizes.append(timed[True][1] / timed[False][1])
    return [
        figure("user_data_checkpoint_bytes_with_position", sizes, None,
               f"bytes of a checkpoint keeping the position of a pipeline with a {buffer}-image shuffle buffer "
               "over the same checkpoint without it", position_bytes=timed[True][1] - timed[False][1],
               model_bytes=timed[False][1]),
        figure("user_data_checkpoint_save_with_position", times, None,
               "time of that save with the position (serialized, written) over without it"),
    ]


def resume_figures(reps: int, gigabytes: float) -> list[dict]:
    folder = Path(tempfile.mkdtemp(prefix="bench-user-data-files-"))
    record = np.random.default_rng(3).bytes(64 * 1024)
    files, per_file = 16, int(gigabytes * 2**30 / 16 / len(record)) + 1
    for index in range(files):
        with tf.io.TFRecordWriter(str(folder / f"part-{index:02d}.tfrecord")) as writer:
            for _ in range(per_file):
                writer.write(record)
    figures = []
    for shuffled in (False, True):
        def pipeline(shuffled=shuffled):
            names = tf.data.Dataset.list_files(str(folder / "*.tfrecord"), shuffle=shuffled, seed=4)
            records = names.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=4,
                                       deterministic=True)
            return records.map(lambda r: tf.strings.length(r)).batch(32).prefetch(2)

        steps = DatasetInput(pipeline()).count_steps()  # also reads the files into the page cache
        first, last = position_at(pipeline, 1, steps), position_at(pipeline, steps - 1, steps)
        at_first, at_last = [], []
        for _ in range(reps):
            at_first.append(resume_seconds(pipeline, first, steps))
            at_last.append(resume_seconds(pipeline, last, steps))
        name, kept = (("reshuffled", "list_files reshuffled each pass: kept where it holds its seeds") if shuffled
                      else ("in_order", "files in order: kept where it is"))
        ratios = [b / a for a, b in zip(at_first, at_last, strict=True)]
        figures.append(figure(
            f"user_data_resume_last_over_first_batch_{name}", ratios, "<= 1.5",
            f"time to resume at the last batch of an epoch of a {gigabytes:g} GB file set over at its first ({kept})",
            first_seconds=statistics.median(at_first), last_seconds=statistics.median(at_last), steps=steps))
    return figures


def position_at(pipeline, batches: int, steps: int) -> bytes:
    source = DatasetInput(pipeline(), steps_per_epoch=steps)
    source.start(None, None, 0, 0)
    for _ in range(batches):
        source.next_batch()
    return source.state()


def resume_seconds(pipeline, state: bytes, steps: int) -> float:
    started = time.perf_counter()
    source = DatasetInput(pipeline(), steps_per_epoch=steps)
    source.start(None, state, 0, 0)
    source.next_batch()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--file-gb", type=float, default=1.0)
    parser.add_argument("--buffer", type=int, default=10_000)
    args = parser.parse_args()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    figures = [*step_figures(args.reps, strategy), *checkpoint_figures(args.reps, args.buffer, strategy),
               *resume_figures(args.reps, args.file_gb)]
    write_result("user_data", figures, reps=args.reps, file_gb=args.file_gb)


if __name__ == "__main__":
    main()
