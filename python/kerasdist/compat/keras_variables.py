"""Keras 3 variables' `assign_add` / `assign_sub` as one atomic update, for the steps a
parameter-server strategy runs on several workers at once against the same variables
(`atomic_variable_increments`, used by `training/ps.py`; gated on the Keras versions checked,
canary in tests/python/test_compat.py); and a variable's per-replica TensorFlow variables, which
Keras keeps in a private attribute (`replica_variables`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from kerasdist.compat.versions import version_within

# Keras releases whose `Variable.assign_add(v)` is `assign(read() + v)`, a read then a write
# (keras/src/backend/common/variables.py; 3.15.1 checked).
ASSIGN_ADD_FIX_VERSIONS = ((3, 0), (3, 16))
_UPDATES = ("assign_add", "assign_sub")


def keras_needs_atomic_increments(version: str = keras.__version__) -> bool:
    """Whether this Keras version's variable increments are a read and a separate write."""
    return version_within(version, ASSIGN_ADD_FIX_VERSIONS)


@contextlib.contextmanager
def atomic_variable_increments(force: bool = False) -> Iterator[None]:
    """Make Keras variables' `assign_add`/`assign_sub` single atomic updates while the steps
    are traced (on the Keras versions that need it, or whatever the version with `force`).

    Keras 3 implements `Variable.assign_add(v)` as `assign(read() + v)`. Under a parameter-server
    strategy two workers run steps at the same time against the same ps variables, so one's read
    and write can straddle the other's and an increment is lost: with 2 workers, 30 scheduled
    steps left `optimizer.iterations` at 24, and the metric totals and counts lose updates the
    same way. (The optimizer's own weight updates already use TensorFlow's atomic ops.) Inside
    this block they use `tf.Variable.assign_add`, one locked update on the ps; the steps keep the
    ops they were traced with.
    """
    if not (force or keras_needs_atomic_increments()):
        yield
        return
    from keras.src.backend.tensorflow.core import Variable

    saved = {name: Variable.__dict__.get(name) for name in _UPDATES}
    for name in _UPDATES:
        setattr(Variable, name, _atomic(getattr(Variable, name), name))
    try:
        yield
    finally:
        for name, original in saved.items():
            if original is None:
                delattr(Variable, name)
            else:
                setattr(Variable, name, original)


def _atomic(keras_update: Any, name: str) -> Any:
    """`name` ("assign_add" or "assign_sub") as TensorFlow's own locked update of the variable's
    value; Keras's `keras_update` inside a stateless scope, where no variable is written."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    def update(self: Any, value: Any) -> Any:
        if in_stateless_scope():
            return keras_update(self, value)
        return getattr(self._value, name)(tf.cast(value, self._value.dtype))

    return update


def replica_variables(variable: Any) -> tuple[Any, ...]:
    """A Keras variable's TensorFlow variables: one per replica when it was made under a strategy
    (the `values` of the distributed variable Keras keeps as `_value`), else the variable itself."""
    backing = getattr(variable, "_value", None)
    replicas = getattr(backing, "values", None)
    return tuple(replicas) if isinstance(replicas, tuple) and replicas else (variable,)
