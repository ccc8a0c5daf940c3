"""The public functions that make datasets: `make_dataset`, `make_dataset_split`, and
`plan_dataset`, which tells what make_dataset would decide without building anything."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from kerasdist.data.info import DatasetInfo
from kerasdist.data.options import DatasetOptions
from kerasdist.data.plan import PlannedDataset
from kerasdist.validation import fraction, record_from, with_field_docs


@with_field_docs(DatasetOptions, leave_out=("validation_split",))
def make_dataset(
    x: Any,
    y: Any = None,
    *,
    sample_weight: Any = DatasetOptions.sample_weight,
    batch_size: int | None = DatasetOptions.batch_size,
    per_replica_batch_size: int | None = DatasetOptions.per_replica_batch_size,
    strategy: Any = DatasetOptions.strategy,
    drop_remainder: bool = DatasetOptions.drop_remainder,
    shuffle: bool = DatasetOptions.shuffle,
    seed: int = DatasetOptions.seed,
    initial_epoch: int = DatasetOptions.initial_epoch,
    skip_batches: int = DatasetOptions.skip_batches,
    epochs: int | None = DatasetOptions.epochs,
    repeat: bool = DatasetOptions.repeat,
    per_worker: bool = DatasetOptions.per_worker,
    cache: bool | str | os.PathLike[str] | None = DatasetOptions.cache,
    map_fn: Callable[..., Any] | None = DatasetOptions.map_fn,
    check_finite: bool = DatasetOptions.check_finite,
    file_format: str | None = DatasetOptions.file_format,
    label_column: str | None = DatasetOptions.label_column,
    features: Mapping[str, Any] | None = DatasetOptions.features,
    shuffle_buffer: int = DatasetOptions.shuffle_buffer,
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

    The other arguments are the fields of `DatasetOptions`, each documented there.

    Returns:
        A `tf.data.Dataset` (a distributed dataset with per_worker=True); `dataset_info()` tells
        what was decided. For a validation split, see `make_dataset_split`.
    """
    return PlannedDataset.of(x, y, record_from(DatasetOptions, locals())).build()


class DatasetSplit(NamedTuple):
    """`make_dataset_split`'s result: the training dataset and the validation dataset."""

    train: Any
    validation: Any


@with_field_docs(DatasetOptions, leave_out=("validation_split",))
def make_dataset_split(
    x: Any,
    y: Any = None,
    *,
    validation_split: float,
    sample_weight: Any = DatasetOptions.sample_weight,
    batch_size: int | None = DatasetOptions.batch_size,
    per_replica_batch_size: int | None = DatasetOptions.per_replica_batch_size,
    strategy: Any = DatasetOptions.strategy,
    drop_remainder: bool = DatasetOptions.drop_remainder,
    shuffle: bool = DatasetOptions.shuffle,
    seed: int = DatasetOptions.seed,
    initial_epoch: int = DatasetOptions.initial_epoch,
    skip_batches: int = DatasetOptions.skip_batches,
    epochs: int | None = DatasetOptions.epochs,
    repeat: bool = DatasetOptions.repeat,
    per_worker: bool = DatasetOptions.per_worker,
    cache: bool | str | os.PathLike[str] | None = DatasetOptions.cache,
    map_fn: Callable[..., Any] | None = DatasetOptions.map_fn,
    check_finite: bool = DatasetOptions.check_finite,
    file_format: str | None = DatasetOptions.file_format,
    label_column: str | None = DatasetOptions.label_column,
    features: Mapping[str, Any] | None = DatasetOptions.features,
    shuffle_buffer: int = DatasetOptions.shuffle_buffer,
) -> DatasetSplit:
    """`make_dataset` for all but the last `validation_split` of the samples (as Keras's
    `fit(validation_split=)` holds out the last ones), and one unshuffled, finite pass over those.

    ```python
    train, validation = kerasdist.make_dataset_split(x, y, validation_split=0.2, batch_size=64)
    model.fit(train, validation_data=validation, epochs=5)
    ```

    Args:
        x: in-memory data (arrays, data frames, lists or dicts of arrays).
        y: targets, as `x` (for a data frame `x`, a column name), or None when `x` holds them.
        validation_split: fraction in (0, 1) of the samples kept out for validation.

    The other arguments are `make_dataset`'s, the fields of `DatasetOptions`, each documented
    there; they shape the training dataset, and the validation dataset has its batch size (and
    `drop_remainder`).

    Returns:
        A `DatasetSplit(train, validation)`; `dataset_info()` of each tells its sizes
        (`validation_samples` on the training one).
    """
    fraction("validation_split", validation_split)
    planned = PlannedDataset.of(x, y, record_from(DatasetOptions, locals()))
    return DatasetSplit(planned.build(), planned.validation())


@with_field_docs(DatasetOptions)
def plan_dataset(
    x: Any,
    y: Any = None,
    *,
    sample_weight: Any = DatasetOptions.sample_weight,
    batch_size: int | None = DatasetOptions.batch_size,
    per_replica_batch_size: int | None = DatasetOptions.per_replica_batch_size,
    strategy: Any = DatasetOptions.strategy,
    drop_remainder: bool = DatasetOptions.drop_remainder,
    shuffle: bool = DatasetOptions.shuffle,
    seed: int = DatasetOptions.seed,
    initial_epoch: int = DatasetOptions.initial_epoch,
    skip_batches: int = DatasetOptions.skip_batches,
    epochs: int | None = DatasetOptions.epochs,
    repeat: bool = DatasetOptions.repeat,
    per_worker: bool = DatasetOptions.per_worker,
    cache: bool | str | os.PathLike[str] | None = DatasetOptions.cache,
    map_fn: Callable[..., Any] | None = DatasetOptions.map_fn,
    check_finite: bool = DatasetOptions.check_finite,
    file_format: str | None = DatasetOptions.file_format,
    label_column: str | None = DatasetOptions.label_column,
    features: Mapping[str, Any] | None = DatasetOptions.features,
    shuffle_buffer: int = DatasetOptions.shuffle_buffer,
    validation_split: float | None = DatasetOptions.validation_split,
) -> DatasetInfo:
    """What `make_dataset(x, y, ...)` would decide (sizes, steps per epoch, sharding), without
    building its pipeline: the same `DatasetInfo` that `dataset_info()` returns (with
    `validation_split=`, of `make_dataset_split`'s training part).

    Args:
        x: as in `make_dataset`.
        y: as in `make_dataset`.

    The other arguments are `make_dataset`'s and `make_dataset_split`'s `validation_split`, the
    fields of `DatasetOptions`, each documented there.

    Returns:
        The `DatasetInfo` of the dataset `make_dataset` would build.
    """
    return PlannedDataset.of(x, y, record_from(DatasetOptions, locals())).info
