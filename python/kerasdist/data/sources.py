"""make_dataset's sources: in-memory arrays and data frames, an existing dataset, CSV/TFRecord files.

Each is read once into a `Source`: arrays, or a dataset of unbatched elements, and its length."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kerasdist.data.counts import record_counts
from kerasdist.data.options import DatasetOptions

_EXTENSIONS = {".tfrecord": "tfrecord", ".tfrecords": "tfrecord", ".tfr": "tfrecord", ".csv": "csv"}


@dataclass
class Source:
    """make_dataset's input, read once: what the pipelines draw from and how many samples it has."""

    kind: str  # "memory", "files" or "dataset"
    n: int
    arrays: Any = None  # memory: the element structure of NumPy arrays
    files: tuple[str, ...] = ()
    reader: Callable[[Any], Any] | None = None  # files: path tensor -> dataset of elements
    dataset: Any = None  # dataset: unbatched elements
    counts: tuple[int, ...] = ()  # files: records per file


def read_source(x: Any, y: Any, options: DatasetOptions) -> Source:
    """The `Source` of make_dataset's `x` and `y`: files, a dataset or in-memory arrays, checked."""
    import tensorflow as tf

    sample_weight = options.sample_weight

    if isinstance(x, (str, os.PathLike)) or (
        isinstance(x, (list, tuple)) and x and all(isinstance(p, (str, os.PathLike)) for p in x)
    ):
        if y is not None or sample_weight is not None:
            raise ValueError("y and sample_weight cannot be given with files: use label_column.")
        return _file_source(x, options.file_format, options.label_column, options.features, options.check_finite)
    if isinstance(x, tf.data.Dataset):
        if y is not None or sample_weight is not None:
            raise ValueError("y and sample_weight cannot be given with a tf.data.Dataset x: put them in its elements.")
        return _dataset_source(x)
    return _memory_source(x, y, sample_weight, options.check_finite)


def _memory_source(x, y, sample_weight, check_finite) -> Source:
    """Arrays, data frames, lists and dicts of them: NumPy arrays of one length, checked."""
    import tensorflow as tf

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
    return Source("memory", n, arrays=arrays)


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


def _dataset_source(dataset: Any) -> Source:
    import tensorflow as tf

    n = int(dataset.cardinality())
    if n == tf.data.INFINITE_CARDINALITY:
        raise ValueError("x is an infinite tf.data.Dataset: give one pass over the data (no repeat()).")
    if n == tf.data.UNKNOWN_CARDINALITY:
        n = int(dataset.reduce(np.int64(0), lambda count, *_: count + 1))
    if n == 0:
        raise ValueError("x has zero samples: the tf.data.Dataset is empty.")
    return Source("dataset", n, dataset=dataset)


def _file_source(pattern, file_format, label_column, features, check_finite) -> Source:
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
    if file_format == "csv":
        reader = _csv_reader(files, label_column, check_finite)
    else:
        reader = _tfrecord_reader(features, label_column, check_finite)
    reading = repr((file_format, label_column, features, check_finite))
    counts = record_counts(files, reading, lambda f: _count(f, reader))
    if sum(counts) == 0:
        raise ValueError(f"x: the files {patterns} hold zero records.")
    return Source("files", sum(counts), files=files, reader=reader, counts=tuple(counts))


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


def _count(path, reader) -> int:
    """The file's records, by reading it (steps per epoch and the shuffle need them): once, then
    kept by `counts.record_counts` while the file stays as it is."""
    return int(reader(path).reduce(np.int64(0), lambda count, *_: count + 1))
