"""Keras's `fit` fed by kerasdist's own stream of batches, one pulled just before each step, so
that the position of the batches handed out is the position of the batches trained, exactly, at
every step end (`data/resumable.py` keeps it in checkpoints).

Keras 3.15 gives this through three of its internals, checked by tests/python/test_compat.py:
- `fit(x=<a DataAdapter>)` uses that adapter as it is (`data_adapters.get_data_adapter`);
- a `tf.distribute.DistributedDataset` from the adapter is taken as distributed already
  (`TFEpochIterator`), so tf.distribute neither rebatches nor prefetches it;
- an iterator that is neither a `tf.data.Iterator` nor a `DistributedIterator` is stepped through
  in Python (`_make_function`'s `function`): `next(iterator)`, then the compiled step on that
  batch, `steps_per_execution` times per call. A batch is pulled only when a step takes it.
Before fit's loop, Keras under a strategy peeks at one batch to build the model
(`_maybe_symbolic_build`) through an iterator it then drops (`epoch_iterator.reset()`): what that
first iterator pulled is handed out again by the next one.

`route_fit` lets `model.fit(data, callbacks=[..., checkpoint_callback(dir), ...])` go through
kerasdist's resume (Keras's fit method replaced in its trainer class, as `keras_training` does).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf
from keras.src.trainers.data_adapters import data_adapter

from kerasdist.compat.keras_training import TRAINER
from kerasdist.compat.versions import version_within

# Keras releases whose fit takes an adapter and steps a Python iterator as above (3.15.1 checked).
KERAS_STREAM_VERSIONS = ((3, 0), (3, 16))


def keras_takes_streams(version: str = keras.__version__) -> bool:
    """Whether this Keras is one whose fit was checked to take `keras_stream`'s adapter."""
    return version_within(version, KERAS_STREAM_VERSIONS)


def keras_stream(next_batch: Callable[[], Any], element_spec: Any) -> data_adapter.DataAdapter:
    """What to give `fit` as `x` (with `steps_per_epoch`): each step's batch is `next_batch()`
    (already distributed over the replicas), called just before that step."""
    return _StreamAdapter(_Batches(next_batch, element_spec))


class _Batches(tf.distribute.DistributedDataset):
    """The stream as Keras sees it: a distributed dataset whose iterators pull from one source.
    The batches the first iterator pulled (Keras's peek) go to the second one first."""

    def __init__(self, next_batch: Callable[[], Any], element_spec: Any):
        self._next_batch = next_batch
        self._element_spec = element_spec
        self._iterators = 0
        self._pulled_by_first: list[Any] = []
        self._held: list[Any] = []

    def __iter__(self) -> _Iterator:
        self._iterators += 1
        if self._iterators == 2:
            self._held, self._pulled_by_first = self._pulled_by_first, []
        return _Iterator(self, first=self._iterators == 1)

    def take(self, first: bool) -> Any:
        batch = self._held.pop(0) if self._held else self._next_batch()
        if first:
            self._pulled_by_first.append(batch)
        return batch

    @property
    def element_spec(self) -> Any:
        return self._element_spec

    @property
    def cardinality(self) -> int:
        return int(tf.data.INFINITE_CARDINALITY)

    def __repr__(self) -> str:
        return f"<kerasdist stream of {self._element_spec}>"


class _Iterator:
    """A plain Python iterator (not a tf.data or distributed one): Keras steps it in Python."""

    def __init__(self, batches: _Batches, first: bool):
        self._batches, self._first = batches, first

    def __iter__(self) -> _Iterator:
        return self

    def __next__(self) -> Any:
        return self._batches.take(self._first)


class _StreamAdapter(data_adapter.DataAdapter):
    def __init__(self, batches: _Batches):
        self._batches = batches

    def get_tf_dataset(self) -> _Batches:
        return self._batches

    def get_numpy_iterator(self) -> Any:
        raise NotImplementedError("kerasdist's stream feeds the TensorFlow backend only")

    @property
    def num_batches(self) -> None:
        return None  # fit's steps_per_epoch says; None keeps one iterator across its epochs

    @property
    def batch_size(self) -> None:
        return None

    @property
    def has_partial_batch(self) -> None:
        return None

    @property
    def partial_batch_size(self) -> None:
        return None


# -- fit with a kerasdist checkpoint callback --------------------------------------------------

_original_fit = TRAINER.fit
_router: Callable[[Any, dict[str, Any]], Any] | None = None
_unrouted = threading.local()


def route_fit(router: Callable[[Any, dict[str, Any]], Any]) -> None:
    """Make `model.fit(...)` first ask `router(model, arguments)` (every argument of fit by name,
    defaults filled in): a result other than None is fit's result. kerasdist's own calls of fit
    (inside `fit_unrouted()`) are never routed."""
    global _router
    _router = router
    TRAINER.fit = _routed_fit


@contextlib.contextmanager
def fit_unrouted() -> Iterator[None]:
    """Within this block (on this thread), `model.fit` is Keras's own."""
    before = getattr(_unrouted, "active", False)
    _unrouted.active = True
    try:
        yield
    finally:
        _unrouted.active = before


@functools.wraps(_original_fit)  # help(model.fit) and IDEs still show Keras's keywords
def _routed_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
    if _router is not None and not getattr(_unrouted, "active", False):
        bound = _FIT_SIGNATURE.bind(self, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop("self")
        routed = _router(self, arguments)
        if routed is not None:
            return routed
    return _original_fit(self, *args, **kwargs)


_FIT_SIGNATURE = inspect.signature(inspect.unwrap(_original_fit))
