"""Input pipelines for distributed `fit`: sizing, sharding, and a shuffle that can be rebuilt.

`make_dataset` turns arrays, data frames, an existing `tf.data.Dataset` or TFRecord/CSV files into
a dataset of batches for `model.fit` under the active strategy.

By default the dataset is *one epoch*, as tf.data users expect: `model.fit(ds, epochs=N)` and a
plain `for` loop work, its cardinality is known, and each new pass over it (each new iterator that
reads it to the end) is the next epoch: pass k is epoch `initial_epoch + k`, reproducibly, like
`shuffle(reshuffle_each_iteration=True)` but the same in every process and after a restart. A pass
counts once its last batch is handed out, so one abandoned early does not (Keras peeks at a batch
under a strategy and makes a spare iterator at each epoch end). Under several replicas,
tf.distribute's iterator prefetches batches to the devices, and on an epoch of only a few
batches (4 or fewer with 2 CPU replicas, measured; `SHORT_EPOCH_STEPS`) the peek Keras takes to
build the model reads the whole first pass: `fit` then starts at epoch `initial_epoch + 1`. How
far the prefetch runs is up to tf.distribute's threads, so make_dataset warns (`ShortEpochWarning`)
instead of promising an epoch number there. resume_fit and distributed_fit never rely on the
count: they rebuild the stream of the epochs they need; so does the stream form below.

With `epochs=` (or `repeat=True`) it is instead one *stream of batches over epochs*: epoch
`initial_epoch` first, then the next ones up to `epochs` (for ever with `repeat=True`; give `fit`
the `steps_per_epoch` that `dataset_info()` reports). The order is a pure function of `(seed, epoch)`:
each epoch's permutation is `tf.random.experimental.stateless_shuffle(range(n), [seed, epoch])`
(Philox, on the CPU), computed in the graph, so it depends on nothing else (not the global seed,
not the process, not the worker). `epoch_order(n, seed, epoch)` returns the same permutation. A run resumed after `k`
batches of epoch `e` rebuilds its stream with `make_dataset(..., initial_epoch=e, skip_batches=k)`:
the batches are those the uninterrupted run would have seen next.

In-memory sources (arrays, data frames, lists and dicts of arrays) get an exact permutation per
epoch and batches that never straddle two epochs. Stream sources (files, an existing dataset) cannot
be indexed: their per-epoch order is a permutation of the files plus a permutation of the records
inside each file (or, with `cache`, a permutation inside each block of `shuffle_buffer` records),
and batches run on across epoch ends (files are read 4 at a time, so records of neighbouring
epochs also mix at the boundary), so epoch `e` of the stream means Keras epoch `e`: batches
`e * steps_per_epoch` onwards. Resuming a stream source re-reads the skipped records, and so
does each pass of the one-epoch form: pass k reaches epoch `initial_epoch + k` by reading the k
epochs before it (the boundary batches depend on them), so k passes read about k*k/2 epochs in
all. For more than a few epochs over files or a dataset, use the stream form (`epochs=`), which
reads each record once, or `distributed_fit`/`resume_fit`, which build that stream.

This module holds the public functions and the argument checks; the sources are read in
`_data_sources.py` and the pipelines built in `_data_pipelines.py`.
"""

from __future__ import annotations

import inspect
import math
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from kerasdist import _data_pipelines
from kerasdist._data_pipelines import (
    _auto_sharded,
    _order,
    _per_worker,
    _Plan,
    _validation,
    _with_known_length,
)
from kerasdist._data_sources import FILE_FORMATS, _source  # noqa: F401  (FILE_FORMATS: kerasdist.data.FILE_FORMATS as before)
from kerasdist.strategy import run_context
from kerasdist.validation import boolean, fraction, integer, optional_integer

DEFAULT_BATCH_SIZE = 32
# One-epoch datasets of at most this many batches under several replicas may lose their first
# pass to tf.distribute's prefetch (measured: 4 on 2 CPU replicas; see the module docstring).
SHORT_EPOCH_STEPS = 4


class ShortEpochWarning(UserWarning):
    """A one-epoch dataset short enough that `fit` under several replicas may skip its first epoch."""

_INFO_ATTR = "_kerasdist_info"  # the DatasetInfo a dataset made by make_dataset carries
_REBUILD_ATTR = "_kerasdist_rebuild"  # make_dataset with the same arguments, for other epochs


@dataclass(frozen=True)
class BatchSizeInfo:
    """Which batch size was used and how it was reached.

    `sizing` is "batch_size" (a global size was given), "per_replica_batch_size" (the per-replica
    size times `num_replicas`) or "default" (32, as in Keras). `per_replica_batch_size` is None
    when the global size does not split evenly over the replicas.
    """

    batch_size: int
    per_replica_batch_size: int | None
    num_replicas: int
    sizing: str
    num_samples: int | None = None
    steps_per_epoch: int | None = None
    drop_remainder: bool = False


@dataclass(frozen=True)
class DatasetInfo:
    """What `make_dataset` decided: sizes, steps, sharding, order. `dataset_info()` returns it."""

    source: str
    num_samples: int
    batch_size: int
    per_replica_batch_size: int | None
    num_replicas: int
    sizing: str
    steps_per_epoch: int
    drop_remainder: bool
    shard_policy: str
    per_worker: bool
    shuffle: bool
    seed: int
    initial_epoch: int
    skip_batches: int
    epochs: int | None
    num_batches: int | None
    validation_samples: int = 0
    role: str = "train"
    form: str = "one_epoch"  # "one_epoch" (the default), "epochs" (epochs=) or "repeat" (repeat=True)
    epoch_order: str | None = None  # the name of the shuffle's order function (None: in order)


def batch_size_info(
    batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    *,
    strategy: Any = None,
    num_replicas: int | None = None,
    num_samples: int | None = None,
    drop_remainder: bool = False,
    require_even_split: bool = False,
) -> BatchSizeInfo:
    """Work out the global and per-replica batch sizes, without building anything.

    Args:
        batch_size: the global batch size (all replicas together).
        per_replica_batch_size: the batch size of one replica; the global size is this times the
            strategy's `num_replicas_in_sync`. Give one of the two; neither means 32.
        strategy: the strategy to size for; default the one whose scope is active.
        num_replicas: the replica count, instead of asking a strategy.
        num_samples: when given, `steps_per_epoch` is computed and the sizes are checked
            against it.
        drop_remainder: whether a last, smaller batch is dropped.
        require_even_split: the global size must split evenly over the replicas (per-worker
            pipelines need that).

    Returns:
        A `BatchSizeInfo`.
    """
    replicas = run_context(strategy).num_replicas if num_replicas is None else integer("num_replicas", num_replicas, 1)
    if batch_size is not None and per_replica_batch_size is not None:
        raise ValueError(
            f"Give batch_size or per_replica_batch_size, not both (got {batch_size!r} and "
            f"{per_replica_batch_size!r})."
        )
    if per_replica_batch_size is not None:
        per_replica = integer("per_replica_batch_size", per_replica_batch_size, 1)
        size, sizing = per_replica * replicas, "per_replica_batch_size"
    else:
        sizing = "default" if batch_size is None else "batch_size"
        size = integer("batch_size", DEFAULT_BATCH_SIZE if batch_size is None else batch_size, 1)
        per_replica = size // replicas if size % replicas == 0 else None
        if require_even_split and per_replica is None:
            raise ValueError(
                f"batch_size {size} is not divisible by the {replicas} replicas in sync: a "
                "per-worker pipeline needs the same batch on every replica. Use a multiple of "
                f"{replicas} or give per_replica_batch_size."
            )
    steps = None
    if num_samples is not None:
        if drop_remainder and size > num_samples:
            raise ValueError(
                f"batch_size {size} is larger than the {num_samples} samples and drop_remainder "
                "is set: no batch would be left."
            )
        steps = num_samples // size if drop_remainder else math.ceil(num_samples / size)
    return BatchSizeInfo(size, per_replica, replicas, sizing, num_samples, steps, bool(drop_remainder))


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
        return _order(n, seed, epoch).numpy()


def dataset_info(dataset: Any) -> DatasetInfo:
    """What `make_dataset` decided for `dataset`: sizes, steps per epoch, sharding, order.

    The plan travels on the dataset object itself; a dataset derived from it (`ds.take(3)`) is a
    new dataset without one. `plan_dataset()` gives the same without building a pipeline."""
    info = getattr(dataset, _INFO_ATTR, None)
    if not isinstance(info, DatasetInfo):
        raise ValueError(
            f"dataset was not made by make_dataset (got {type(dataset).__name__}); only those "
            "carry their sizing."
        )
    return info


def make_dataset(
    x: Any,
    y: Any = None,
    *,
    sample_weight: Any = None,
    batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    strategy: Any = None,
    drop_remainder: bool = False,
    shuffle: bool = True,
    seed: int = 0,
    initial_epoch: int = 0,
    skip_batches: int = 0,
    epochs: int | None = None,
    repeat: bool = False,
    per_worker: bool = False,
    cache: bool | str | None = None,
    map_fn: Callable[..., Any] | None = None,
    check_finite: bool = False,
    file_format: str | None = None,
    label_column: str | None = None,
    features: Mapping[str, Any] | None = None,
    shuffle_buffer: int = 10_000,
) -> Any:
    """Build a `tf.data.Dataset` of batches ready for `model.fit` under the active strategy.

    Example:

    ```python
    strategy = kerasdist.select_strategy()
    ds = kerasdist.make_dataset(x, y, per_replica_batch_size=32, strategy=strategy, seed=1)
    model.fit(ds, epochs=10)          # one epoch per pass, reshuffled reproducibly each pass
    kerasdist.dataset_info(ds).steps_per_epoch
    # one stream, resumed after 7 batches of epoch 3 (0-based):
    ds = kerasdist.make_dataset(x, y, ..., initial_epoch=3, skip_batches=7, epochs=10)
    model.fit(ds, initial_epoch=3, epochs=10, steps_per_epoch=...)  # or let resume_fit do it
    ```

    Args:
        x: features: a NumPy array (first axis = samples), a list/tuple or dict of arrays (a
            multi-input model), a pandas DataFrame (numeric columns; they become one float
            matrix), a `tf.data.Dataset` of unbatched elements (x, (x, y) or (x, y, w)), or a
            file pattern (str, or list of them) of TFRecord or CSV files.
        y: targets, same first-axis length as x; for a DataFrame also a column name.
        sample_weight: optional per-sample weights (arrays only).
        batch_size: global batch size (all replicas together).
        per_replica_batch_size: batch size of one replica; the global size is this times the
            strategy's replicas. Give one of the two; neither means 32.
        strategy: the strategy fit will run under; default the one whose scope is active.
        drop_remainder: drop each epoch's last, smaller batch.
        shuffle: permute each epoch; the order is a pure function of (seed, epoch).
        seed: the shuffle seed (an integer).
        initial_epoch: the epoch of the first pass (0-based, like Keras's `initial_epoch`), or
            the first epoch of the stream.
        skip_batches: batches of `initial_epoch` already consumed (a mid-epoch resume); needs
            the stream form (`epochs` or `repeat`), since a one-epoch dataset's passes all have
            the same length.
        epochs: None (default): the dataset is one epoch, the next one on each new pass.
            An integer: one stream of the epochs `initial_epoch` .. `epochs - 1` (exclusive,
            like Keras's `epochs`).
        repeat: True for one endless stream of epochs (give `fit` its `steps_per_epoch`).
        per_worker: build one pipeline per worker through
            `strategy.distribute_datasets_from_function`, each reading only its share; returns a
            distributed dataset. Otherwise the dataset carries the auto-shard policy of its
            source: DATA for in-memory data, FILE for files when there are at least as many files
            as workers, DATA otherwise.
        cache: True or "memory" to cache in memory, or a file path prefix; caches the source
            records (files, an existing dataset) before shuffling. In-memory arrays are already
            in memory, so it changes nothing for them.
        map_fn: a per-element transform, called as map_fn(x, y[, w]) (or map_fn(x)) after
            shuffling, in parallel (AUTOTUNE) with the order kept. Must be a TensorFlow-traceable
            Python function.
        check_finite: refuse NaN or Inf in the features (checked up front for in-memory data,
            while reading for files).
        file_format: "tfrecord" or "csv"; default from the file extension.
        label_column: for CSV/TFRecord files: the column (feature) that is y.
        features: for TFRecord files of `tf.train.Example`: {name: shape} of float features,
            e.g. {"x": [3], "y": []}. The non-label features, concatenated, are x.
        shuffle_buffer: block size of the stream-source shuffle with `cache`.

    Returns:
        A `tf.data.Dataset` (a distributed dataset with per_worker=True); `dataset_info()` tells
        what was decided. For a validation split, see `make_dataset_split`.
    """
    options = {name: value for name, value in locals().items() if name not in ("x", "y")}
    return _plan(x, y, **options).build()


class DatasetSplit(NamedTuple):
    """`make_dataset_split`'s result: the training dataset and the validation dataset."""

    train: Any
    validation: Any


def make_dataset_split(x: Any, y: Any = None, *, validation_split: float, **kwargs: Any) -> DatasetSplit:
    """`make_dataset` for all but the last `validation_split` of the samples (as Keras's
    `fit(validation_split=)` holds out the last ones), and one unshuffled, finite pass over those.

    ```python
    train, validation = kerasdist.make_dataset_split(x, y, validation_split=0.2, batch_size=64)
    model.fit(train, validation_data=validation, epochs=5)
    ```

    Args:
        x, y: in-memory data (arrays, data frames, lists or dicts of arrays).
        validation_split: fraction in (0, 1) of the samples kept out for validation.
        **kwargs: the other `make_dataset` arguments; they shape the training dataset, and the
            validation dataset has its batch size (and `drop_remainder`).

    Returns:
        A `DatasetSplit(train, validation)`; `dataset_info()` of each tells its sizes
        (`validation_samples` on the training one).
    """
    fraction("validation_split", validation_split)
    planned = _plan(x, y, validation_split=validation_split, **kwargs)
    return DatasetSplit(planned.build(), planned.validation())


def plan_dataset(x: Any, y: Any = None, **kwargs: Any) -> DatasetInfo:
    """What `make_dataset(x, y, **kwargs)` would decide (sizes, steps per epoch, sharding),
    without building its pipeline: the same `DatasetInfo` that `dataset_info()` returns (with
    `validation_split=`, of `make_dataset_split`'s training part)."""
    return _plan(x, y, **kwargs).info


@dataclass(frozen=True)
class _Planned:
    """A dataset planned but not built: its source read once, its sizing decided."""

    x: Any
    y: Any
    args: Mapping[str, Any]
    source: Any
    info: DatasetInfo
    plan: _Plan
    context: Any

    def build(self) -> Any:
        """The pipeline (`replace_epochs` first to move the stream)."""
        info, plan = self.info, self.plan
        if info.per_worker:
            dataset = _per_worker(self.source, plan, self.context.strategy, info.num_samples)
        else:
            dataset = _auto_sharded(self.source, plan, info.num_samples, self.context.num_workers, info.shard_policy)
            if not plan.one_epoch:  # the one-epoch form asserts its length per pass (in _finish)
                dataset = _with_known_length(dataset, plan, self.context.num_workers)
        if plan.one_epoch and info.num_replicas > 1 and info.steps_per_epoch <= SHORT_EPOCH_STEPS:
            warnings.warn(
                f"make_dataset: an epoch of {info.steps_per_epoch} batches under {info.num_replicas} replicas "
                "is short enough for tf.distribute's prefetch to read a whole pass that Keras only peeks "
                "at, so fit(ds) may start at epoch initial_epoch + 1. For exact epoch numbers use the "
                "stream form (epochs=, and fit's steps_per_epoch), distributed_fit or resume_fit.",
                ShortEpochWarning, stacklevel=3,
            )
        _attach(dataset, info, self)
        return dataset

    def validation(self) -> Any:
        """The held-out samples (validation_split) as one unshuffled, finite pass."""
        info = self.info
        validation = _validation(self.source, self.plan.sizing, info.num_samples, bool(info.drop_remainder))
        n_val = info.validation_samples
        size = info.batch_size
        val_steps = (n_val // size) if info.drop_remainder else math.ceil(n_val / size)
        _attach(validation, replace(
            info, num_samples=n_val, steps_per_epoch=val_steps, shuffle=False, initial_epoch=0,
            skip_batches=0, epochs=1, num_batches=val_steps, shard_policy="DATA", per_worker=False,
            role="validation", form="epochs",
        ), None)
        return validation


def replace_epochs(planned: _Planned, **epochs: Any) -> _Planned:
    """The same plan over other epochs: a resumed run moves the stream, not the data."""
    args = {**planned.args, "repeat": False, **epochs}
    return _plan(planned.x, planned.y, _source_of=planned, **args)


def _one_epoch_rebuild(dataset: Any) -> Callable[..., Any] | None:
    """For make_dataset's default one-epoch form (each pass the next epoch, counted by passes):
    `rebuild(initial_epoch=, epochs=, skip_batches=)`, the stream of exactly those epochs, so a
    trainer can give every epoch, a resumed one included, its own order whatever passes came
    before. None for any other data."""
    info = getattr(dataset, _INFO_ATTR, None)
    rebuild = getattr(dataset, _REBUILD_ATTR, None)
    return rebuild if isinstance(info, DatasetInfo) and info.form == "one_epoch" else None


def _attach(dataset: Any, info: DatasetInfo, planned: _Planned | None) -> None:
    setattr(dataset, _INFO_ATTR, info)
    if planned is not None:
        setattr(dataset, _REBUILD_ATTR, lambda **epochs: replace_epochs(planned, **epochs).build())


# make_dataset's options and their defaults, read from its signature (plus make_dataset_split's).
_DEFAULTS = {
    name: parameter.default for name, parameter in inspect.signature(make_dataset).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY
} | {"validation_split": None}


def _plan(x: Any, y: Any = None, *, _source_of: _Planned | None = None, **args: Any) -> _Planned:
    """Check every argument, read the source (once), decide sizes and steps: no pipeline yet."""
    unknown = sorted(set(args) - set(_DEFAULTS))
    if unknown:
        raise TypeError(f"make_dataset() got unexpected arguments: {', '.join(unknown)}.")
    a = {**_DEFAULTS, **args}
    check = _Check(**{name: a[name] for name in (
        "batch_size", "per_replica_batch_size", "drop_remainder", "seed", "initial_epoch",
        "skip_batches", "epochs", "validation_split", "cache", "map_fn", "shuffle_buffer", "repeat")})
    check.scalars()
    if _source_of is not None:
        source = _source_of.source
    else:
        source = _source(x, y, a["sample_weight"], a["file_format"], a["label_column"], a["features"],
                         a["check_finite"])
    context = run_context(a["strategy"])
    n_val = _validation_rows(source, a["validation_split"])
    sizing = batch_size_info(
        a["batch_size"], a["per_replica_batch_size"], num_replicas=context.num_replicas,
        num_samples=source.n - n_val, drop_remainder=a["drop_remainder"], require_even_split=a["per_worker"],
    )
    check.resume(sizing.steps_per_epoch)
    form = "repeat" if a["repeat"] else ("one_epoch" if a["epochs"] is None else "epochs")
    plan = _Plan(
        sizing=sizing, shuffle=bool(a["shuffle"]), seed=int(a["seed"]), initial_epoch=int(a["initial_epoch"]),
        skip_batches=int(a["skip_batches"]), epochs=None if a["epochs"] is None else int(a["epochs"]),
        map_fn=a["map_fn"], cache=a["cache"], shuffle_buffer=int(a["shuffle_buffer"]),
        check_finite=a["check_finite"], one_epoch=form == "one_epoch",
    )
    info = DatasetInfo(
        source=source.kind, num_samples=source.n - n_val, batch_size=sizing.batch_size,
        per_replica_batch_size=sizing.per_replica_batch_size, num_replicas=sizing.num_replicas,
        sizing=sizing.sizing, steps_per_epoch=sizing.steps_per_epoch,
        drop_remainder=bool(a["drop_remainder"]), shard_policy=_shard_policy(source, a, context),
        per_worker=bool(a["per_worker"]), shuffle=bool(a["shuffle"]), seed=int(a["seed"]),
        initial_epoch=int(a["initial_epoch"]), skip_batches=int(a["skip_batches"]), epochs=plan.epochs,
        num_batches=sizing.steps_per_epoch if plan.one_epoch else plan.num_batches(),
        validation_samples=n_val, form=form, epoch_order=_data_pipelines.EPOCH_ORDER if plan.shuffle else None,
    )
    return _Planned(x, y, dict(args), source, info, plan, context)


def _validation_rows(source: Any, validation_split: float | None) -> int:
    """How many of the last rows validation_split holds out (as Keras does); 0 without it."""
    if validation_split is None:
        return 0
    if source.kind != "memory":
        raise ValueError(
            f"validation_split needs in-memory data (arrays or a data frame); x is a {source.kind}."
        )
    n_val = source.n - math.ceil(source.n * (1.0 - validation_split))
    if n_val < 1 or n_val >= source.n:
        raise ValueError(
            f"validation_split {validation_split} of {source.n} samples leaves "
            f"{source.n - n_val} for training and {n_val} for validation; both need at least 1."
        )
    return n_val


def _shard_policy(source: Any, a: dict[str, Any], context: Any) -> str:
    if a["per_worker"]:
        return "per_worker"
    if source.kind == "files" and a["cache"] in (None, False) and len(source.files) >= context.num_workers:
        return "FILE"
    return "DATA"


# ---------------------------------------------------------------------------------------------
# Argument checks (all before any TensorFlow work)


@dataclass
class _Check:
    batch_size: Any
    per_replica_batch_size: Any
    drop_remainder: Any
    seed: Any
    initial_epoch: Any
    skip_batches: Any
    epochs: Any
    validation_split: Any
    cache: Any
    map_fn: Any
    shuffle_buffer: Any
    repeat: Any = False

    def scalars(self) -> None:
        boolean("repeat", self.repeat)
        if self.repeat and self.epochs is not None:
            raise ValueError(
                f"repeat=True and epochs={self.epochs!r}: give one of them (repeat is the endless "
                "stream, epochs a stream that stops before that epoch)."
            )
        optional_integer("batch_size", self.batch_size, 1)
        optional_integer("per_replica_batch_size", self.per_replica_batch_size, 1)
        integer("seed", self.seed)
        integer("initial_epoch", self.initial_epoch, 0)
        integer("skip_batches", self.skip_batches, 0)
        integer("shuffle_buffer", self.shuffle_buffer, 1)
        if self.epochs is not None and integer("epochs", self.epochs, 1) <= self.initial_epoch:
            raise ValueError(
                f"epochs ({self.epochs}) must be larger than initial_epoch ({self.initial_epoch}): "
                "it is the epoch to stop before, as in Keras fit."
            )
        if self.validation_split is not None:
            fraction("validation_split", self.validation_split)
        if self.cache not in (None, False, True, "memory") and not isinstance(self.cache, (str, os.PathLike)):
            raise ValueError(f'cache must be True, "memory" or a file path prefix, got {self.cache!r}.')
        if isinstance(self.cache, (str, os.PathLike)) and self.cache != "memory":
            parent = os.path.dirname(os.fspath(self.cache)) or "."
            if not os.path.isdir(parent):
                raise ValueError(f"cache: the directory {parent!r} does not exist.")
        if self.map_fn is not None and not callable(self.map_fn):
            raise ValueError(f"map_fn must be callable, got {type(self.map_fn).__name__}.")

    def resume(self, steps_per_epoch: int) -> None:
        if self.skip_batches and self.skip_batches >= steps_per_epoch:
            raise ValueError(
                f"skip_batches ({self.skip_batches}) must be smaller than the {steps_per_epoch} "
                "batches of an epoch: count whole epochs in initial_epoch."
            )

        if self.skip_batches and self.epochs is None and not self.repeat:
            raise ValueError(
                f"skip_batches ({self.skip_batches}) needs the stream form: give epochs= (or "
                "repeat=True). A one-epoch dataset (the default) has passes of the same length."
            )

