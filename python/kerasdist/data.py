"""Input pipelines for distributed `fit`: sizing, sharding, and a shuffle that can be rebuilt.

`make_dataset` turns arrays, data frames, an existing `tf.data.Dataset` or TFRecord/CSV files into
a dataset of batches for `model.fit` under the active strategy.

The dataset is a *stream of batches over epochs*: epoch `initial_epoch` first, then the next ones
(for ever when `epochs` is None, so give `fit` the `steps_per_epoch` that `dataset_info()` reports;
Keras then keeps one iterator across its epochs). The order is a pure function of `(seed, epoch)`:
each epoch's permutation is `tf.random.experimental.index_shuffle(i, [seed, epoch], n - 1)`,
computed in the graph, so it depends on nothing else (not the global seed, not the process, not
the worker). `epoch_order(n, seed, epoch)` returns the same permutation. A run resumed after `k`
batches of epoch `e` rebuilds its stream with `make_dataset(..., initial_epoch=e, skip_batches=k)`:
the batches are those the uninterrupted run would have seen next.

In-memory sources (arrays, data frames, lists and dicts of arrays) get an exact permutation per
epoch and batches that never straddle two epochs. Stream sources (files, an existing dataset) cannot
be indexed: their per-epoch order is a permutation of the files plus a permutation of the records
inside each file (or, with `cache`, a permutation inside each block of `shuffle_buffer` records),
and batches run on across epoch ends (files are read 4 at a time, so records of neighbouring
epochs also mix at the boundary), so epoch `e` of the stream means Keras epoch `e`: batches
`e * steps_per_epoch` onwards. Resuming a stream source re-reads the skipped records.
"""

from __future__ import annotations

import glob
import math
import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kerasdist.strategy import run_context

DEFAULT_BATCH_SIZE = 32
FILE_FORMATS = ("tfrecord", "csv")
_EXTENSIONS = {".tfrecord": "tfrecord", ".tfrecords": "tfrecord", ".tfr": "tfrecord", ".csv": "csv"}
_MAX_EPOCH = 2**62

# Datasets kerasdist built, with what it decided for them (weak: a dropped dataset is freed).
_INFOS: weakref.WeakKeyDictionary[Any, DatasetInfo] = weakref.WeakKeyDictionary()


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
    replicas = run_context(strategy).num_replicas if num_replicas is None else _int_arg("num_replicas", num_replicas, 1)
    if batch_size is not None and per_replica_batch_size is not None:
        raise ValueError(
            f"Give batch_size or per_replica_batch_size, not both (got {batch_size!r} and "
            f"{per_replica_batch_size!r})."
        )
    if per_replica_batch_size is not None:
        per_replica = _int_arg("per_replica_batch_size", per_replica_batch_size, 1)
        size, sizing = per_replica * replicas, "per_replica_batch_size"
    else:
        sizing = "default" if batch_size is None else "batch_size"
        size = _int_arg("batch_size", DEFAULT_BATCH_SIZE if batch_size is None else batch_size, 1)
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

    A pure function of `(n, seed, epoch)`: `tf.random.experimental.index_shuffle(range(n),
    [seed, epoch], n - 1)`, the same op `make_dataset` runs in its pipeline.
    """
    n = _int_arg("n", n, 1)
    return _order(n, _int_arg("seed", seed, None), _int_arg("epoch", epoch, 0)).numpy()


def dataset_info(dataset: Any) -> DatasetInfo:
    """What `make_dataset` decided for `dataset`: sizes, steps per epoch, sharding, order."""
    info = _INFOS.get(dataset) if _hashable(dataset) else None
    if info is None:
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
    validation_split: float | None = None,
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
    info = kerasdist.dataset_info(ds)
    model.fit(ds, epochs=10, steps_per_epoch=info.steps_per_epoch)
    # resumed after 7 batches of epoch 3 (0-based):
    ds = kerasdist.make_dataset(x, y, ..., initial_epoch=3, skip_batches=7)
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
        initial_epoch: the first epoch of the stream (0-based, like Keras's `initial_epoch`).
        skip_batches: batches of `initial_epoch` already consumed (a mid-epoch resume).
        epochs: stop after this epoch (exclusive, like Keras's `epochs`); None repeats for ever.
        validation_split: fraction (0, 1) of the samples kept out for validation: the last ones,
            as in Keras. Then returns `(train, validation)`; the validation dataset is one
            unshuffled pass. In-memory sources only.
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
        A `tf.data.Dataset` (a distributed dataset with per_worker=True), or a tuple
        (train, validation) with validation_split. `dataset_info()` tells what was decided.
    """
    check = _Check(
        batch_size=batch_size, per_replica_batch_size=per_replica_batch_size,
        drop_remainder=drop_remainder, seed=seed, initial_epoch=initial_epoch,
        skip_batches=skip_batches, epochs=epochs, validation_split=validation_split,
        cache=cache, map_fn=map_fn, shuffle_buffer=shuffle_buffer,
    )
    check.scalars()
    source = _source(x, y, sample_weight, file_format, label_column, features, check_finite)
    if validation_split is not None and source.kind != "memory":
        raise ValueError(
            f"validation_split needs in-memory data (arrays or a data frame); x is a {source.kind}."
        )
    context = run_context(strategy)
    replicas = context.num_replicas
    n_val = 0
    if validation_split is not None:
        n_val = source.n - math.ceil(source.n * (1.0 - validation_split))
        if n_val < 1 or n_val >= source.n:
            raise ValueError(
                f"validation_split {validation_split} of {source.n} samples leaves "
                f"{source.n - n_val} for training and {n_val} for validation; both need at least 1."
            )
    n_train = source.n - n_val
    sizing = batch_size_info(
        batch_size, per_replica_batch_size, num_replicas=replicas, num_samples=n_train,
        drop_remainder=drop_remainder, require_even_split=per_worker,
    )
    check.resume(sizing.steps_per_epoch)
    plan = _Plan(
        sizing=sizing, shuffle=bool(shuffle), seed=int(seed), initial_epoch=int(initial_epoch),
        skip_batches=int(skip_batches), epochs=None if epochs is None else int(epochs),
        map_fn=map_fn, cache=cache, shuffle_buffer=int(shuffle_buffer), check_finite=check_finite,
    )
    if per_worker:
        dataset = _per_worker(source, plan, context.strategy, n_train)
        policy = "per_worker"
    else:
        dataset, policy = _auto_sharded(source, plan, n_train, context.num_workers)
        dataset = _with_known_length(dataset, plan, context.num_workers)
    info = DatasetInfo(
        source=source.kind, num_samples=n_train, batch_size=sizing.batch_size,
        per_replica_batch_size=sizing.per_replica_batch_size, num_replicas=sizing.num_replicas,
        sizing=sizing.sizing, steps_per_epoch=sizing.steps_per_epoch,
        drop_remainder=bool(drop_remainder), shard_policy=policy, per_worker=bool(per_worker),
        shuffle=bool(shuffle), seed=int(seed), initial_epoch=int(initial_epoch),
        skip_batches=int(skip_batches), epochs=plan.epochs, num_batches=plan.num_batches(),
        validation_samples=n_val,
    )
    _INFOS[dataset] = info
    if validation_split is None:
        return dataset
    validation = _validation(source, sizing, n_train, drop_remainder)
    val_steps = (n_val // sizing.batch_size) if drop_remainder else math.ceil(n_val / sizing.batch_size)
    _INFOS[validation] = replace(
        info, num_samples=n_val, steps_per_epoch=val_steps, shuffle=False, initial_epoch=0,
        skip_batches=0, epochs=1, num_batches=val_steps, shard_policy="DATA", per_worker=False,
        role="validation",
    )
    return dataset, validation


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

    def scalars(self) -> None:
        if self.batch_size is not None:
            _int_arg("batch_size", self.batch_size, 1)
        if self.per_replica_batch_size is not None:
            _int_arg("per_replica_batch_size", self.per_replica_batch_size, 1)
        _int_arg("seed", self.seed, None)
        _int_arg("initial_epoch", self.initial_epoch, 0)
        _int_arg("skip_batches", self.skip_batches, 0)
        _int_arg("shuffle_buffer", self.shuffle_buffer, 1)
        if self.epochs is not None and _int_arg("epochs", self.epochs, 1) <= self.initial_epoch:
            raise ValueError(
                f"epochs ({self.epochs}) must be larger than initial_epoch ({self.initial_epoch}): "
                "it is the epoch to stop before, as in Keras fit."
            )
        if self.validation_split is not None:
            v = self.validation_split
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
                raise ValueError(f"validation_split must be a fraction in (0, 1), got {v!r}.")
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


def _int_arg(name: str, value: Any, minimum: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, float, np.floating)) or (
        isinstance(value, (float, np.floating)) and (not math.isfinite(value) or value != int(value))
    ):
        raise ValueError(f"{name} must be an integer, got {value!r}.")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}.")
    return value


def _hashable(obj: Any) -> bool:
    try:
        hash(obj)
        return True
    except TypeError:
        return False


# ---------------------------------------------------------------------------------------------
# Sources


@dataclass
class _Source:
    kind: str  # "memory", "files" or "dataset"
    n: int
    arrays: Any = None  # memory: the element structure of NumPy arrays
    files: tuple[str, ...] = ()
    reader: Callable[[Any], Any] | None = None  # files: path tensor -> dataset of elements
    dataset: Any = None  # dataset: unbatched elements
    counts: tuple[int, ...] = ()  # files: records per file


def _source(x, y, sample_weight, file_format, label_column, features, check_finite) -> _Source:
    import tensorflow as tf

    if isinstance(x, (str, os.PathLike)) or (
        isinstance(x, (list, tuple)) and x and all(isinstance(p, (str, os.PathLike)) for p in x)
    ):
        if y is not None or sample_weight is not None:
            raise ValueError("y and sample_weight cannot be given with files: use label_column.")
        return _file_source(x, file_format, label_column, features, check_finite)
    if isinstance(x, tf.data.Dataset):
        if y is not None or sample_weight is not None:
            raise ValueError("y and sample_weight cannot be given with a tf.data.Dataset x: put them in its elements.")
        return _dataset_source(x)
    if _is_data_frame(x) and isinstance(y, str):
        if y not in x.columns:
            raise ValueError(f"y: the column {y!r} is not in the data frame.")
        x, y = x.drop(columns=[y]), x[y]
    xs = _arrays("x", x)
    parts = [xs]
    if y is not None:
        parts.append(_arrays("y", y))
    if sample_weight is not None:
        if y is None:
            raise ValueError("sample_weight needs y.")
        parts.append(_arrays("sample_weight", sample_weight))
    lengths = {}
    # parts holds x, then y and sample_weight only when given: the names run out first.
    for name, part in zip(("x", "y", "sample_weight"), parts, strict=False):
        for leaf in tf.nest.flatten(part):
            lengths.setdefault(name, set()).add(leaf.shape[0])
    if len(lengths["x"]) > 1:
        raise ValueError(f"x: the inputs have different numbers of samples: {sorted(lengths['x'])}.")
    n = next(iter(lengths["x"]))
    for name in ("y", "sample_weight"):
        if name in lengths and lengths[name] != {n}:
            raise ValueError(
                f"x and {name} have different lengths: {n} samples in x, "
                f"{sorted(lengths[name])[0]} in {name}."
            )
    if n == 0:
        raise ValueError("x has zero samples: there is nothing to batch.")
    if check_finite:
        for i, leaf in enumerate(tf.nest.flatten(xs)):
            if np.issubdtype(leaf.dtype, np.floating) and not np.isfinite(leaf).all():
                bad = int(np.argwhere(~np.isfinite(leaf))[0][0])
                raise ValueError(
                    f"x has NaN or Inf values (check_finite=True): first in sample {bad}"
                    + (f" of input {i}" if len(tf.nest.flatten(xs)) > 1 else "") + "."
                )
    arrays = tuple(parts)  # (x,), (x, y) or (x, y, w): Keras reads a 1-tuple as x alone
    return _Source("memory", n, arrays=arrays)


def _is_data_frame(x: Any) -> bool:
    return type(x).__name__ == "DataFrame" and hasattr(x, "dtypes")


def _arrays(name: str, value: Any) -> Any:
    """NumPy arrays in C order (R hands over Fortran-ordered ones), floats as float32."""
    if isinstance(value, Mapping):
        if not value:
            raise ValueError(f"{name} is an empty dict.")
        return {str(k): _arrays(f"{name}[{k!r}]", v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and value and all(_array_like(v) for v in value):
        return tuple(_arrays(f"{name}[{i}]", v) for i, v in enumerate(value))
    if _is_data_frame(value):
        from pandas.api.types import is_bool_dtype, is_numeric_dtype

        bad = [str(c) for c, t in value.dtypes.items() if not (is_numeric_dtype(t) or is_bool_dtype(t))]
        if bad:
            raise ValueError(
                f"{name}: the data frame has non-numeric columns: {', '.join(bad)}. Encode them "
                "as numbers first (factors/strings as integer codes or one-hot columns)."
            )
        value = value.to_numpy(dtype="float32")
    elif type(value).__name__ == "Series":
        from pandas.api.types import is_bool_dtype, is_numeric_dtype

        if not (is_numeric_dtype(value.dtype) or is_bool_dtype(value.dtype)):
            raise ValueError(f"{name} is not numeric (dtype {value.dtype}).")
        value = value.to_numpy()
    array = np.asarray(value)
    if array.ndim == 0:
        raise ValueError(f"{name} must have a sample axis; got a scalar.")
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise ValueError(f"{name} is not numeric (dtype {array.dtype}).")
    if np.issubdtype(array.dtype, np.floating):
        return np.ascontiguousarray(array, dtype=np.float32)  # one copy, also for R's column order
    return np.ascontiguousarray(array)


def _array_like(v: Any) -> bool:
    return isinstance(v, np.ndarray) or _is_data_frame(v) or type(v).__name__ == "Series" or (
        isinstance(v, (list, tuple)) and len(v) > 0 and not isinstance(v[0], (int, float))
    )


def _dataset_source(dataset: Any) -> _Source:
    import tensorflow as tf

    n = int(dataset.cardinality())
    if n == tf.data.INFINITE_CARDINALITY:
        raise ValueError("x is an infinite tf.data.Dataset: give one pass over the data (no repeat()).")
    if n == tf.data.UNKNOWN_CARDINALITY:
        n = int(dataset.reduce(np.int64(0), lambda count, *_: count + 1))
    if n == 0:
        raise ValueError("x has zero samples: the tf.data.Dataset is empty.")
    return _Source("dataset", n, dataset=dataset)


def _file_source(pattern, file_format, label_column, features, check_finite) -> _Source:
    patterns = [os.fspath(pattern)] if isinstance(pattern, (str, os.PathLike)) else [os.fspath(p) for p in pattern]
    files = tuple(sorted({f for p in patterns for f in glob.glob(p)}))
    if not files:
        raise ValueError(f"x: the file pattern {', '.join(map(repr, patterns))} matches no file.")
    if file_format is None:
        formats = {_EXTENSIONS.get(os.path.splitext(f)[1].lower()) for f in files}
        if len(formats) != 1 or None in formats:
            raise ValueError(
                "file_format: cannot tell the format from the extensions of "
                f"{files[0]!r}...; give file_format='tfrecord' or 'csv'."
            )
        file_format = formats.pop()
    if file_format not in FILE_FORMATS:
        raise ValueError(f"Unknown file_format {file_format!r}. Expected one of: {', '.join(FILE_FORMATS)}.")
    if file_format == "csv":
        reader = _csv_reader(files, label_column, check_finite)
    else:
        reader = _tfrecord_reader(features, label_column, check_finite)
    counts = _count(files, reader)
    if sum(counts) == 0:
        raise ValueError(f"x: the files {patterns} hold zero records.")
    return _Source("files", sum(counts), files=files, reader=reader, counts=tuple(counts))


def _csv_reader(files, label_column, check_finite):
    import csv

    import tensorflow as tf

    with open(files[0], newline="") as handle:
        rows = csv.reader(handle)
        header = next(rows, None)
        first = next(rows, None)
    if not header:
        raise ValueError(f"x: {files[0]!r} has no header line (CSV files need column names).")
    if label_column is not None and label_column not in header:
        raise ValueError(f"label_column {label_column!r} is not a column of {files[0]!r} ({', '.join(header)}).")
    if first is not None:
        # A row with too few or too many fields is not this check's business: decode_csv names it.
        bad = [name for name, value in zip(header, first, strict=False) if not _is_number(value)]
        if bad:
            raise ValueError(f"x: {files[0]!r} has non-numeric columns: {', '.join(bad)}.")
    label = header.index(label_column) if label_column is not None else None
    feature_idx = [i for i in range(len(header)) if i != label]

    def read(path):
        # TextLineDataset + decode_csv rather than CsvDataset: FILE auto-shard knows only the
        # line/record readers (TextLine, TFRecord, FixedLengthRecord) as file sources.
        lines = tf.data.TextLineDataset(path).skip(1)
        records = lines.map(lambda line: tf.io.decode_csv(line, [[0.0]] * len(header)))

        def to_element(*columns):
            xs = tf.stack([columns[i] for i in feature_idx])
            xs = _finite(xs, check_finite)
            return xs if label is None else (xs, columns[label])

        return records.map(to_element)

    return read


def _tfrecord_reader(features, label_column, check_finite):
    import tensorflow as tf

    if not features:
        raise ValueError('features: TFRecord files need {name: shape}, e.g. {"x": [3], "y": []}.')
    if label_column is not None and label_column not in features:
        raise ValueError(f"label_column {label_column!r} is not one of features ({', '.join(features)}).")
    spec = {
        name: shape if isinstance(shape, tf.io.FixedLenFeature)
        else tf.io.FixedLenFeature([int(s) for s in np.atleast_1d(shape)] if np.size(shape) else [], tf.float32)
        for name, shape in features.items()
    }
    names = [name for name in spec if name != label_column]

    def read(path):
        def parse(record):
            parsed = tf.io.parse_single_example(record, spec)
            parts = [tf.reshape(tf.cast(parsed[k], tf.float32), [-1]) for k in names]
            xs = _finite(parts[0] if len(parts) == 1 else tf.concat(parts, 0), check_finite)
            return xs if label_column is None else (xs, parsed[label_column])

        return tf.data.TFRecordDataset(path).map(parse)

    return read


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _finite(tensor, check):
    import tensorflow as tf

    return tf.debugging.check_numerics(tensor, "x has NaN or Inf values (check_finite=True)") if check else tensor


def _count(files, reader) -> list[int]:
    """Records per file (one read of every file: steps per epoch and the shuffle need them)."""
    return [int(reader(f).reduce(np.int64(0), lambda count, *_: count + 1)) for f in files]


# ---------------------------------------------------------------------------------------------
# Pipelines


@dataclass(frozen=True)
class _Plan:
    sizing: BatchSizeInfo
    shuffle: bool
    seed: int
    initial_epoch: int
    skip_batches: int
    epochs: int | None
    map_fn: Any
    cache: Any
    shuffle_buffer: int
    check_finite: bool

    def num_batches(self) -> int | None:
        if self.epochs is None:
            return None
        return (self.epochs - self.initial_epoch) * self.sizing.steps_per_epoch - self.skip_batches

    def epoch_range(self):
        import tensorflow as tf

        end = _MAX_EPOCH if self.epochs is None else self.epochs
        return tf.data.Dataset.range(self.initial_epoch, end)


def _order(n, seed, epoch):
    """The epoch's permutation of range(n), in the graph: a pure function of (seed, epoch)."""
    import tensorflow as tf

    index = tf.range(tf.cast(n, tf.int64), dtype=tf.int64)
    seeds = tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.random.experimental.index_shuffle(index, seeds, tf.cast(n, tf.int64) - 1)


def _finish(dataset, policy: str):
    import tensorflow as tf

    options = tf.data.Options()
    options.deterministic = True
    policies = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = getattr(policies, policy)
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)


def _auto_sharded(source: _Source, plan: _Plan, n_train: int, workers: int):
    """The pipeline tf.data shards over the `workers` input pipelines (RunContext.num_workers)."""
    if source.kind == "memory":
        return _finish(_memory_pipeline(source.arrays, n_train, plan, plan.sizing.batch_size), "DATA"), "DATA"
    if source.kind == "files" and plan.cache in (None, False):
        policy = "FILE" if len(source.files) >= workers else "DATA"
        shares = workers if policy == "FILE" else 1
        return _finish(_file_pipeline(source, plan, plan.sizing.batch_size, shares=shares), policy), policy
    return _finish(_stream_pipeline(source, plan, plan.sizing.batch_size), "DATA"), "DATA"


def _with_known_length(dataset, plan: _Plan, workers: int):
    """Tell tf.data how many batches a finite pipeline has (its flat_map hides it). Keras then
    ends each pass cleanly instead of warning "Your input ran out of data" after every
    evaluation, and counts its steps right. Only where no worker's share is cut out of the
    pipeline later (one worker): a sharded share would trip the assertion."""
    import tensorflow as tf

    total = plan.num_batches()
    if total is None or workers > 1:
        return dataset
    return dataset.apply(tf.data.experimental.assert_cardinality(total))


def _memory_pipeline(arrays, n, plan: _Plan, batch, share=(0, 1)):
    """Per epoch: the epoch's permutation (or range), this pipeline's share, batched, gathered."""
    import tensorflow as tf

    tensors = tf.nest.map_structure(tf.constant, arrays)
    index, count = share
    skip = plan.skip_batches * batch  # elements of this pipeline's share
    first = plan.initial_epoch
    drop = plan.sizing.drop_remainder

    def gather(indices):
        return tf.nest.map_structure(lambda t: tf.gather(t, indices), tensors)

    def epoch(ep):
        order = _order(n, plan.seed, ep) if plan.shuffle else tf.range(n, dtype=tf.int64)
        ds = tf.data.Dataset.from_tensor_slices(order[index::count])
        ds = ds.skip(tf.where(tf.equal(ep, first), tf.constant(skip, tf.int64), 0))
        if plan.map_fn is None:
            return ds.batch(batch, drop_remainder=drop).map(
                gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
            )
        ds = ds.map(gather).map(plan.map_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return ds.batch(batch, drop_remainder=drop)

    return plan.epoch_range().flat_map(epoch)


def _file_pipeline(source: _Source, plan: _Plan, batch, share=None, shares: int = 1):
    """Files permuted per epoch, records permuted inside each file; FILE auto-shard finds the
    file-name stream (range -> map -> unbatch) in front of the reader and shards it.

    `shares`: how many workers the file names will be dealt out to (by FILE auto-shard, or by
    `share`). The reader interleaves no more files than one worker gets per epoch, so with
    files of equal length a worker's epoch holds exactly its files' records, not some of the
    next epoch's."""
    import tensorflow as tf

    files = tf.constant(list(source.files))
    counts = tf.constant(list(source.counts), tf.int64)
    n_files = len(source.files)

    def epoch_files(ep):
        idx = _order(n_files, plan.seed, ep) if plan.shuffle else tf.range(n_files, dtype=tf.int64)
        return tf.gather(files, idx), tf.fill([n_files], ep), idx, tf.gather(counts, idx)

    def read(path, ep, file_id, count):
        records = source.reader(path)
        if not plan.shuffle:
            return records
        block = records.batch(tf.maximum(count, 1))  # the whole file

        def permute(*element):  # tf.data spreads a tuple element over the arguments
            element = element[0] if len(element) == 1 else element
            size = tf.shape(tf.nest.flatten(element)[0], out_type=tf.int64)[0]
            seed = tf.random.experimental.stateless_fold_in(tf.stack([tf.cast(plan.seed, tf.int64), ep]), file_id)
            order = tf.random.experimental.index_shuffle(tf.range(size), seed, size - 1)
            return tf.nest.map_structure(lambda t: tf.gather(t, order), element)

        return block.map(permute).unbatch()

    names = tf.data.Dataset.range(0, _MAX_EPOCH).map(epoch_files).unbatch()
    if share is not None and share[1] > 1 and n_files >= share[1]:
        names = names.shard(share[1], share[0])
        shares, share = share[1], None
    records = names.interleave(
        read, cycle_length=max(1, min(n_files // shares, 4)), block_length=1, num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if share is not None and share[1] > 1:
        records = records.shard(share[1], share[0])
    return _batch_stream(records, plan, batch)


def _stream_pipeline(source: _Source, plan: _Plan, batch, share=None):
    """An existing dataset, or cached file records: blocks of shuffle_buffer records, each
    permuted with a seed folded from (seed, block number) along the repeated stream."""
    import tensorflow as tf

    if source.kind == "files":
        records = tf.data.Dataset.from_tensor_slices(list(source.files)).interleave(
            source.reader, cycle_length=1
        )
    else:
        records = source.dataset
    if plan.cache not in (None, False):
        records = records.cache("" if plan.cache in (True, "memory") else os.fspath(plan.cache))
    if share is not None and share[1] > 1:
        records = records.shard(share[1], share[0])
    if plan.shuffle:
        blocks = records.batch(plan.shuffle_buffer).repeat()
        numbered = tf.data.Dataset.zip((tf.data.Dataset.counter(), blocks))

        def permute(number, element):
            size = tf.shape(tf.nest.flatten(element)[0], out_type=tf.int64)[0]
            seed = tf.random.experimental.stateless_fold_in(
                tf.constant([plan.seed, 0], tf.int64), number
            )
            order = tf.random.experimental.index_shuffle(tf.range(size), seed, size - 1)
            return tf.nest.map_structure(lambda t: tf.gather(t, order), element)

        records = numbered.map(permute).unbatch()
    else:
        records = records.repeat()
    return _batch_stream(records, plan, batch)


def _batch_stream(records, plan: _Plan, batch):
    """A continuous record stream -> batches; epoch e starts at batch e * steps_per_epoch."""
    import tensorflow as tf

    if plan.map_fn is not None:
        records = records.map(plan.map_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    batches = records.batch(batch, drop_remainder=True)
    start = plan.initial_epoch * plan.sizing.steps_per_epoch + plan.skip_batches
    if start:
        batches = batches.skip(start)
    total = plan.num_batches()
    return batches if total is None else batches.take(total)


def _per_worker(source: _Source, plan: _Plan, strategy: Any, n_train: int):
    """One pipeline per worker: its share of each epoch's order, batched per replica."""
    import tensorflow as tf

    global_batch = plan.sizing.batch_size

    def dataset_fn(context: tf.distribute.InputContext):
        per_replica = context.get_per_replica_batch_size(global_batch)
        share = (context.input_pipeline_id, context.num_input_pipelines)
        # A global step takes one per-replica batch from each replica; this pipeline feeds
        # replicas_in_sync / num_input_pipelines of them, so skipping k steps skips k such groups.
        replicas_here = context.num_replicas_in_sync // context.num_input_pipelines
        worker_plan = replace(plan, skip_batches=plan.skip_batches * replicas_here)
        if source.kind == "memory":
            ds = _memory_pipeline(source.arrays, n_train, worker_plan, per_replica, share)
        elif source.kind == "files" and plan.cache in (None, False):
            ds = _file_pipeline(source, _stream_plan(worker_plan, replicas_here), per_replica, share)
        else:
            ds = _stream_pipeline(source, _stream_plan(worker_plan, replicas_here), per_replica, share)
        return _finish(ds, "OFF")

    return strategy.distribute_datasets_from_function(dataset_fn)


def _stream_plan(plan: _Plan, replicas_here: int) -> _Plan:
    """Stream sources count epochs in batches: a worker's epoch is replicas_here times as many."""
    sizing = replace(plan.sizing, steps_per_epoch=plan.sizing.steps_per_epoch * replicas_here)
    return replace(plan, sizing=sizing)


def _validation(source: _Source, sizing: BatchSizeInfo, n_train: int, drop_remainder: bool):
    import tensorflow as tf

    tail = tf.nest.map_structure(lambda a: a[n_train:], source.arrays)
    ds = tf.data.Dataset.from_tensor_slices(tail).batch(sizing.batch_size, drop_remainder=drop_remainder)
    return _finish(ds, "DATA")
