"""TensorFlow's collective all-reduce, timed per worker: the seconds this process's all-reduces
took in the steps it samples, each from its input being ready to its result (`CollectiveWaits`).
In synchronous training every worker leaves an all-reduce together, so a worker that arrives late
(a slow input pipeline, slow callbacks, a slow device) waits least, and the others wait for it:
the step times of `checkpoint/step_times.py` compare these sums between workers.

Every dense all-reduce of a MultiWorkerMirroredStrategy goes through
`CollectiveReplicaLauncher.all_reduce` (the gradients' packs, the check that every worker still has
input, `strategy.reduce`), a private TensorFlow class: the patch reads the clock before and after
it and adds the difference to a variable, in functions traced while a `CollectiveWaits` is
active (never in eager calls, never inside XLA: the caller leaves jit-compiled steps out). The
clock is Python's (`tf.numpy_function`): `tf.timestamp` refuses to run under
`enable_op_determinism()`, which bitwise resumes need. A clock read costs tens of microseconds, so
only the steps the caller samples read it (`CollectiveWaits.sample`; the others pass a `tf.cond`).
The clock is declared stateless, its reads told apart by their inputs and ordered by explicit
control dependencies, and only the first local replica's all-reduces are timed: TensorFlow chains
stateful ops in program order, which across a process's replicas would make each replica's
all-reduce wait for another's (a deadlock).
Gated on the TensorFlow versions checked; its canary is in tests/python/test_compat.py
(docs/upstream.md).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import cross_device_utils

from kerasdist.compat.versions import version_within

# TensorFlow releases whose MultiWorkerMirroredStrategy makes every dense all-reduce in
# CollectiveReplicaLauncher.all_reduce (2.21 checked).
COLLECTIVE_WAIT_VERSIONS = ((2, 0), (2, 22))
_LAUNCHER = cross_device_utils.CollectiveReplicaLauncher
_original_all_reduce = _LAUNCHER.all_reduce
_active: list[CollectiveWaits] = []  # the one being traced for, if any


class CollectiveWaits:
    """Seconds this process's all-reduces took in the sampled steps, summed by the functions
    traced while it is active (`time_collectives`), in local variables (not a model's:
    checkpoints never see them)."""

    def __init__(self) -> None:
        made: list[Any] = []

        def make() -> None:
            made.extend([tf.Variable(0.0, dtype=tf.float64, trainable=False), tf.Variable(False, trainable=False)])

        # A thread of its own: strategy scopes are per thread, and these variables must be plain
        # local ones, not mirrored ones (whose creation would be a collective itself).
        maker = threading.Thread(target=make)
        maker.start()
        maker.join()
        self.total, self.sampling = made
        self.device: str | None = None  # the first local replica's, the one timed

    def seconds(self) -> float:
        """The seconds summed so far (one read of the variable)."""
        return float(self.total.numpy())

    def sample(self, on: bool) -> None:
        """Time the all-reduces of the steps that run from now on (True) or not (False)."""
        self.sampling.assign(on)


def tensorflow_times_collectives(version: str = tf.__version__) -> bool:
    """Whether this TensorFlow's all-reduces are known to go through the patched method."""
    return version_within(version, COLLECTIVE_WAIT_VERSIONS)


def time_collectives(waits: CollectiveWaits | None) -> bool:
    """From now on, functions traced add their all-reduces' seconds to `waits` (None: stop).
    Returns whether that is in place (False on other TensorFlow versions)."""
    _active.clear()
    if waits is None or not tensorflow_times_collectives():
        return False
    _LAUNCHER.all_reduce = _timed_all_reduce
    _active.append(waits)
    return True


def _timed_all_reduce(self: Any, input_tensor: Any, control_input: Any = None, options: Any = None) -> Any:
    waits = _active[0] if _active else None
    if waits is None or tf.executing_eagerly():
        return _original_all_reduce(self, input_tensor, control_input, options)
    waits.device = waits.device or self._device
    if self._device != waits.device:
        return _original_all_reduce(self, input_tensor, control_input, options)
    input_tensor = tf.convert_to_tensor(input_tensor)
    before = _clock(waits, input_tensor)
    with tf.control_dependencies([before]):
        result = _original_all_reduce(self, input_tensor, control_input, options)
    waits.total.assign_add(_clock(waits, result) - before)
    return result


def _clock(waits: CollectiveWaits, after: Any) -> Any:
    """Python's clock, read once `after` is computed, while `waits` samples (0 otherwise)."""
    size = tf.size(after)

    def read() -> Any:
        return tf.numpy_function(lambda _: time.time(), [size], tf.float64, stateful=False)

    with tf.control_dependencies([after]):
        return tf.cond(waits.sampling, read, lambda: tf.constant(0.0, tf.float64))
