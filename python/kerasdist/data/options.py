"""make_dataset's options as one typed record: each field documented once and checked once, when
the record is made (before any TensorFlow work). `make_dataset`, `make_dataset_split`,
`plan_dataset` and `distributed_fit` take the fields as keywords and build this record; the
planned dataset, its pipelines and its `DatasetInfo` read from it."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from kerasdist.step_guard import is_r_function
from kerasdist.validation import (
    boolean,
    choice,
    fraction,
    integer,
    optional_integer,
    unknown_fields,
)

FILE_FORMATS = ("tfrecord", "csv")


@dataclass(frozen=True)
class DatasetOptions:
    """How `make_dataset` turns x and y into batches: every make_dataset argument but `x` and
    `y`, at its defaults, and make_dataset_split's `validation_split`. Made from keywords
    (`DatasetOptions(seed=1)`) or a dict (`validation.record_of`); a bad value is refused when
    the record is made, naming the argument.

    Args:
        sample_weight: optional per-sample weights (arrays only).
        batch_size: global batch size (all replicas together).
        per_replica_batch_size: batch size of one replica; the global size is this times the
            strategy's replicas. Give one of the two; neither means 32.
        strategy: the strategy fit will run under; None: the one whose scope is active.
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
        validation_split: fraction in (0, 1) of the samples (the last ones, as Keras's `fit`
            holds out) kept out of training (`make_dataset_split`); in-memory data only.
    """

    sample_weight: Any = None
    batch_size: int | None = None
    per_replica_batch_size: int | None = None
    strategy: Any = None
    drop_remainder: bool = False
    shuffle: bool = True
    seed: int = 0
    initial_epoch: int = 0
    skip_batches: int = 0
    epochs: int | None = None
    repeat: bool = False
    per_worker: bool = False
    cache: bool | str | os.PathLike[str] | None = None
    map_fn: Callable[..., Any] | None = None
    check_finite: bool = False
    file_format: str | None = None
    label_column: str | None = None
    features: Mapping[str, Any] | None = None
    shuffle_buffer: int = 10_000
    validation_split: float | None = None

    def __post_init__(self) -> None:
        for name, value in self._checked().items():
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, **options: Any) -> DatasetOptions:
        """The options given by name, as make_dataset's keywords; the others at their defaults."""
        unknown = unknown_fields(cls, options)
        if unknown:
            raise TypeError(f"make_dataset() got unexpected arguments: {', '.join(unknown)}.")
        return cls(**options)

    def replaced(self, **changes: Any) -> DatasetOptions:
        """These options with `changes` (checked as when made)."""
        return DatasetOptions.of(**{**{field.name: getattr(self, field.name) for field in fields(self)}, **changes})

    @property
    def form(self) -> str:
        """"one_epoch" (the default), "epochs" (epochs=) or "repeat" (repeat=True)."""
        return "repeat" if self.repeat else ("one_epoch" if self.epochs is None else "epochs")

    def _checked(self) -> dict[str, Any]:
        """Every check that needs no data, in the order the errors are reported: the values in
        their plain Python form."""
        boolean("repeat", self.repeat)
        if self.repeat and self.epochs is not None:
            raise ValueError(
                f"repeat=True and epochs={self.epochs!r}: give one of them (repeat is the endless "
                "stream, epochs a stream that stops before that epoch)."
            )
        checked = dict(
            batch_size=optional_integer("batch_size", self.batch_size, 1),
            per_replica_batch_size=optional_integer("per_replica_batch_size", self.per_replica_batch_size, 1),
            seed=integer("seed", self.seed),
            initial_epoch=integer("initial_epoch", self.initial_epoch, 0),
            skip_batches=integer("skip_batches", self.skip_batches, 0),
            shuffle_buffer=integer("shuffle_buffer", self.shuffle_buffer, 1),
            epochs=optional_integer("epochs", self.epochs, 1),
        )
        if checked["epochs"] is not None and checked["epochs"] <= checked["initial_epoch"]:
            raise ValueError(
                f"epochs ({self.epochs}) must be larger than initial_epoch ({self.initial_epoch}): "
                "it is the epoch to stop before, as in Keras fit."
            )
        for name in ("shuffle", "drop_remainder", "per_worker", "check_finite"):
            checked[name] = boolean(name, getattr(self, name))
        if self.validation_split is not None:
            checked["validation_split"] = fraction("validation_split", self.validation_split)
        if self.file_format is not None:
            choice("file_format", self.file_format, FILE_FORMATS)
        self._check_cache()
        self._check_map_fn()
        return checked

    def _check_cache(self) -> None:
        if self.cache not in (None, False, True, "memory") and not isinstance(self.cache, (str, os.PathLike)):
            raise ValueError(f'cache must be True, "memory" or a file path prefix, got {self.cache!r}.')
        if isinstance(self.cache, (str, os.PathLike)) and self.cache != "memory":
            parent = os.path.dirname(os.fspath(self.cache)) or "."
            if not os.path.isdir(parent):
                raise ValueError(f"cache: the directory {parent!r} does not exist.")

    def _check_map_fn(self) -> None:
        if self.map_fn is not None and not callable(self.map_fn):
            raise ValueError(f"map_fn must be callable, got {type(self.map_fn).__name__}.")
        if is_r_function(self.map_fn):
            raise ValueError(
                "map_fn must be a Python function: TensorFlow runs it on its own threads, where an R "
                "function cannot run (see reticulate::py_run_string())."
            )

    def check_skip_batches(self, steps_per_epoch: int) -> None:
        """skip_batches against the epoch's length and the dataset's form."""
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
