"""The public functions that make datasets: `make_dataset`, `make_dataset_split`, and
`plan_dataset`, which tells what make_dataset would decide without building anything."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from kerasdist.data.info import DatasetInfo
from kerasdist.data.options import DatasetOptions
from kerasdist.data.plan import PlannedDataset, planned_dataset
from kerasdist.validation import fraction, with_field_docs


@with_field_docs(DatasetOptions, leave_out=("validation_split",))
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

    The other arguments are the fields of `DatasetOptions`, each documented there.

    Returns:
        A `tf.data.Dataset` (a distributed dataset with per_worker=True); `dataset_info()` tells
        what was decided. For a validation split, see `make_dataset_split`.
    """
    options = DatasetOptions(**{name: value for name, value in locals().items() if name not in ("x", "y")})
    return PlannedDataset.of(x, y, options).build()


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
        x: in-memory data (arrays, data frames, lists or dicts of arrays).
        y: targets, as `x` (or None when `x` holds them).
        validation_split: fraction in (0, 1) of the samples kept out for validation.
        **kwargs: the other `make_dataset` arguments; they shape the training dataset, and the
            validation dataset has its batch size (and `drop_remainder`).

    Returns:
        A `DatasetSplit(train, validation)`; `dataset_info()` of each tells its sizes
        (`validation_samples` on the training one).
    """
    fraction("validation_split", validation_split)
    planned = planned_dataset(x, y, validation_split=validation_split, **kwargs)
    return DatasetSplit(planned.build(), planned.validation())


def plan_dataset(x: Any, y: Any = None, **kwargs: Any) -> DatasetInfo:
    """What `make_dataset(x, y, **kwargs)` would decide (sizes, steps per epoch, sharding),
    without building its pipeline: the same `DatasetInfo` that `dataset_info()` returns (with
    `validation_split=`, of `make_dataset_split`'s training part)."""
    return planned_dataset(x, y, **kwargs).info
