"""Each epoch's order: a permutation that is a pure function of `(seed, epoch)`, and its name."""

from __future__ import annotations

import numpy as np

from kerasdist.validation import integer

# The name of the function `epoch_permutation` draws epochs with, recorded in checkpoints: a resume
# whose kerasdist orders epochs otherwise is told so (`checkpoint.callback.check_epoch_order`).
# Give it a new name whenever `epoch_permutation`'s permutation changes. Read it as
# `order.EPOCH_ORDER` at the time of use, not imported by name: tests replace it here.
EPOCH_ORDER = "stateless_shuffle/1"


def epoch_order(n: int, seed: int = 0, epoch: int = 0) -> np.ndarray:
    """The permutation of `range(n)` that epoch `epoch` uses with `seed` (0-based indices).

    A pure function of `(n, seed, epoch)`: `tf.random.experimental.stateless_shuffle(range(n),
    [seed, epoch])` on the CPU (Philox), the same op `make_dataset` runs in its pipeline. Like every
    stateless TensorFlow op it is the same in every process and on every CPU and GPU, but a
    TensorFlow release may change it (a test pins it for the version in use).
    """
    import tensorflow as tf

    n = integer("n", n, 1)
    seed, epoch = integer("seed", seed), integer("epoch", epoch, 0)
    with tf.device("/CPU:0"):  # where make_dataset's pipeline computes it
        return epoch_permutation(n, seed, epoch).numpy()


def epoch_permutation(n, seed, epoch):
    """The epoch's permutation of range(n), in the graph: a pure function of (seed, epoch)."""
    import tensorflow as tf

    return stateless_permutation(n, tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64)]))


def stateless_permutation(size, seeds):
    """A permutation of range(size) drawn from the two int64 `seeds`, statelessly.

    stateless_shuffle rather than index_shuffle: the same kind of pure function, much cheaper to
    run and to instantiate for each new iterator. Its default algorithm is Philox on the CPU, where
    tf.data runs (and where epoch_order pins it); `alg` is not named, as naming it made each new
    iterator slower for the same permutation (figures: bench/history/2026-11-21-to-23-make-bench.md)."""
    import tensorflow as tf

    index = tf.range(tf.cast(size, tf.int64), dtype=tf.int64)
    return tf.random.experimental.stateless_shuffle(index, seeds)
