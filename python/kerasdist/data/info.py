"""What make_dataset decides: the batch sizes (`batch_size_info`) and the whole plan of a dataset
(`DatasetInfo`), which the dataset carries with it (`dataset_info`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kerasdist.context import context_of
from kerasdist.validation import boolean, integer, optional_integer

DEFAULT_BATCH_SIZE = 32
_INFO_ATTR = "_kerasdist_info"  # the DatasetInfo a dataset made by make_dataset carries


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
    epoch_order: str | None = None  # how epochs are ordered, as checkpoints record it (plan._epoch_order)


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
    boolean("drop_remainder", drop_remainder)
    boolean("require_even_split", require_even_split)
    num_samples = optional_integer("num_samples", num_samples, 1)
    replicas = context_of(strategy).num_replicas if num_replicas is None else integer("num_replicas", num_replicas, 1)
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
    return BatchSizeInfo(size, per_replica, replicas, sizing, num_samples, steps, drop_remainder)


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


def attach_info(dataset: Any, info: DatasetInfo) -> None:
    """Give `dataset` the `info` that `dataset_info(dataset)` returns."""
    setattr(dataset, _INFO_ATTR, info)
