"""make_dataset's options as one record, and their checks (all made before any TensorFlow work)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from kerasdist.step_guard import is_r_function
from kerasdist.validation import boolean, fraction, integer, optional_integer


@dataclass(frozen=True)
class DatasetOptions:
    """Every `make_dataset` argument but `x` and `y`, at make_dataset's defaults (see its
    docstring for each), and make_dataset_split's `validation_split`."""

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
    cache: bool | str | None = None
    map_fn: Callable[..., Any] | None = None
    check_finite: bool = False
    file_format: str | None = None
    label_column: str | None = None
    features: Mapping[str, Any] | None = None
    shuffle_buffer: int = 10_000
    validation_split: float | None = None

    @classmethod
    def of(cls, **options: Any) -> DatasetOptions:
        """The options given by name, as make_dataset's keywords; the others at their defaults."""
        unknown = sorted(set(options) - {field.name for field in fields(cls)})
        if unknown:
            raise TypeError(f"make_dataset() got unexpected arguments: {', '.join(unknown)}.")
        return cls(**options)

    def replaced(self, **changes: Any) -> DatasetOptions:
        """These options with `changes` (checked for their names as `of` does)."""
        return DatasetOptions.of(**{**{field.name: getattr(self, field.name) for field in fields(self)}, **changes})

    @property
    def form(self) -> str:
        """"one_epoch" (the default), "epochs" (epochs=) or "repeat" (repeat=True)."""
        return "repeat" if self.repeat else ("one_epoch" if self.epochs is None else "epochs")

    def check(self) -> None:
        """Every check that needs no data, in the order the errors are reported."""
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
        self._check_cache()
        if self.map_fn is not None and not callable(self.map_fn):
            raise ValueError(f"map_fn must be callable, got {type(self.map_fn).__name__}.")
        if is_r_function(self.map_fn):
            raise ValueError(
                "map_fn must be a Python function: TensorFlow runs it on its own threads, where an R "
                "function cannot run (see reticulate::py_run_string())."
            )

    def _check_cache(self) -> None:
        if self.cache not in (None, False, True, "memory") and not isinstance(self.cache, (str, os.PathLike)):
            raise ValueError(f'cache must be True, "memory" or a file path prefix, got {self.cache!r}.')
        if isinstance(self.cache, (str, os.PathLike)) and self.cache != "memory":
            parent = os.path.dirname(os.fspath(self.cache)) or "."
            if not os.path.isdir(parent):
                raise ValueError(f"cache: the directory {parent!r} does not exist.")

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
