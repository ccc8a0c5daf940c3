"""What a symbolic checkpoint (`tf.data.Options().experimental_symbolic_checkpoint`) costs a
shuffle, and what it saves (why data/structure.py reads a pipeline with a shuffle without one).

One process, no training: the Keras guide's `from_tensor_slices -> shuffle(n) -> batch(128)` over
float samples, each read with and without symbolic checkpoints (`repeat()`, 10 batches of warm-up,
then timed `get_next` calls), and the size of `compat.iterator_state` after 20 batches.

usage: .venv/bin/python bench/history/probes/probe_symbolic_shuffle.py

Measured 2026-11-30 (TensorFlow 2.21.0, 2 cores, nothing else running):

    8x8x1 samples, shuffle(8192):     plain 0.18-0.21 ms a batch, symbolic 2.8-2.9 ms
    8x8x1 samples, shuffle(1000):     plain 0.17 ms, symbolic 0.75 ms
    28x28 samples, shuffle(60000):    plain 0.29 ms, symbolic 32.9 ms
    no shuffle (slices -> batch):     plain and symbolic alike (0.20 ms)
    state after 20 batches, shuffle(8192) -> batch -> prefetch(2): plain 3.4 MB, symbolic 4.2 MB
    state, shuffle(1000) -> batch: plain 508 KB, symbolic 507 KB

A symbolic shuffle spends time in proportion to its buffer on every element, and its state holds
the buffer's elements all the same. custom_fit over the hand-written tutorial loop
(bench/run.sh custom_loop, which reads such a pipeline) went from 0.80 (0.73-1.00, 7 runs) with
symbolic checkpoints to 1.19 (0.97-1.37) without, measured side by side the same morning.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from kerasdist import compat  # noqa: E402

CASES = [((8, 8, 1), 8192, 8192), ((8, 8, 1), 8192, 1000), ((28, 28), 60000, 60000), ((8, 8, 1), 8192, 0)]


def pipeline(shape: tuple[int, ...], samples: int, buffer: int, symbolic: bool) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices((rng.random((samples, *shape), dtype=np.float32),
                                               rng.integers(0, 10, samples)))
    if buffer:
        data = data.shuffle(buffer, seed=0)
    options = tf.data.Options()
    options.experimental_symbolic_checkpoint = symbolic
    return data.batch(128).with_options(options).repeat()


def per_batch_ms(dataset: tf.data.Dataset, batches: int) -> float:
    iterator = iter(dataset)
    for _ in range(10):
        iterator.get_next()
    began = time.perf_counter()
    for _ in range(batches):
        iterator.get_next()
    return (time.perf_counter() - began) / batches * 1e3


def state_bytes(dataset: tf.data.Dataset) -> int:
    iterator = iter(dataset)
    for _ in range(20):
        iterator.get_next()
    return len(compat.iterator_state(iterator))


def main() -> None:
    print(f"TensorFlow {tf.__version__}")
    for shape, samples, buffer in CASES:
        figures = []
        for symbolic in (False, True):
            dataset = pipeline(shape, samples, buffer, symbolic)
            batches = 10 if symbolic and buffer > 10000 else 200
            figures.append(f"{'symbolic' if symbolic else 'plain'} {per_batch_ms(dataset, batches):.2f} ms a batch, "
                           f"state {state_bytes(dataset) / 1e6:.2f} MB")
        print(f"{shape} samples, shuffle({buffer}): " + "; ".join(figures), flush=True)


if __name__ == "__main__":
    main()
