"""A dataset planned but not built: make_dataset's options (a record checked when made), its
source read once, its sizes and epochs decided (`PlannedDataset`). Building it makes the
pipeline; `replace_epochs` plans the same data over other epochs (a resumed run moves the
stream, not the data)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kerasdist.context import context_of
from kerasdist.data import order
from kerasdist.data.info import BatchSizeInfo, DatasetInfo, attach_info, batch_size_info
from kerasdist.data.options import DatasetOptions
from kerasdist.data.pipelines import PipelinePlan, training_pipeline, validation_pipeline
from kerasdist.data.sources import Source, read_source

# One-epoch datasets of at most this many batches under several replicas may lose their first
# pass to tf.distribute's prefetch (measured: 4 on 2 CPU replicas; see kerasdist.data's docstring).
SHORT_EPOCH_STEPS = 4
_PLANNED_ATTR = "_kerasdist_planned"  # the PlannedDataset a training dataset was built from


IN_ORDER = "in order"  # DatasetInfo.epoch_order of unshuffled data


class ShortEpochWarning(UserWarning):
    """A one-epoch dataset short enough that `fit` under several replicas may skip its first epoch."""


@dataclass(frozen=True)
class PlannedDataset:
    """A dataset planned but not built: its source read once, its sizing decided."""

    x: Any
    y: Any
    options: DatasetOptions
    source: Source
    info: DatasetInfo
    plan: PipelinePlan
    context: Any

    @classmethod
    def of(cls, x: Any, y: Any, options: DatasetOptions, source: Source | None = None) -> PlannedDataset:
        """Read the source (unless it is given: the same data again), decide sizes and steps: no
        pipeline yet. The options were checked when made."""
        if source is None:
            source = read_source(x, y, options)
        context = context_of(options.strategy)
        n_val = _validation_rows(source, options.validation_split)
        sizing = batch_size_info(
            options.batch_size, options.per_replica_batch_size, num_replicas=context.num_replicas,
            num_samples=source.n - n_val, drop_remainder=options.drop_remainder,
            require_even_split=options.per_worker,
        )
        options.check_skip_batches(sizing.steps_per_epoch)
        plan = PipelinePlan.of(options, sizing)
        info = _dataset_info(options, source, context, sizing, plan, n_val)
        return cls(x, y, options, source, info, plan, context)

    def build(self) -> Any:
        """The pipeline (`replace_epochs` first to move the stream)."""
        info, plan = self.info, self.plan
        dataset = training_pipeline(self.source, plan, info, self.context)
        if plan.one_epoch and info.num_replicas > 1 and info.steps_per_epoch <= SHORT_EPOCH_STEPS:
            warnings.warn(
                f"make_dataset: an epoch of {info.steps_per_epoch} batches under {info.num_replicas} replicas "
                "is short enough for tf.distribute's prefetch to read a whole pass that Keras only peeks "
                "at, so fit(ds) may start at epoch initial_epoch + 1. For exact epoch numbers use the "
                "stream form (epochs=, and fit's steps_per_epoch), distributed_fit or resume_fit.",
                ShortEpochWarning, stacklevel=3,
            )
        attach_info(dataset, info)
        setattr(dataset, _PLANNED_ATTR, self)
        return dataset

    def rebuild(self, **epochs: Any) -> Any:
        """The pipeline of the same data over other epochs (`initial_epoch=`, `epochs=`,
        `skip_batches=`), as one stream."""
        return replace_epochs(self, **epochs).build()

    def validation(self) -> Any:
        """The held-out samples (validation_split) as one unshuffled, finite pass."""
        info = self.info
        validation = validation_pipeline(self.source, self.plan.sizing, info.num_samples, bool(info.drop_remainder))
        n_val = info.validation_samples
        size = info.batch_size
        val_steps = (n_val // size) if info.drop_remainder else math.ceil(n_val / size)
        attach_info(validation, replace(
            info, num_samples=n_val, steps_per_epoch=val_steps, shuffle=False, initial_epoch=0,
            skip_batches=0, epochs=1, num_batches=val_steps, shard_policy="DATA", per_worker=False,
            role="validation", form="epochs",
        ))
        return validation


def planned_dataset(x: Any, y: Any = None, **options: Any) -> PlannedDataset:
    """`make_dataset(x, y, **options)` planned, not built (with `validation_split=`,
    `make_dataset_split`'s): every argument checked, the source read, sizes and steps decided."""
    return PlannedDataset.of(x, y, DatasetOptions.of(**options))


def replace_epochs(planned: PlannedDataset, **epochs: Any) -> PlannedDataset:
    """The same plan over other epochs: a resumed run moves the stream, not the data."""
    options = planned.options.replaced(**{"repeat": False, **epochs})
    return PlannedDataset.of(planned.x, planned.y, options, source=planned.source)


def one_epoch_rebuild(dataset: Any) -> Callable[..., Any] | None:
    """For make_dataset's default one-epoch form (each pass the next epoch, counted by passes):
    `rebuild(initial_epoch=, epochs=, skip_batches=)`, the stream of exactly those epochs, so a
    trainer can give every epoch, a resumed one included, its own order whatever passes came
    before. None for any other data."""
    planned = getattr(dataset, _PLANNED_ATTR, None)
    if not isinstance(planned, PlannedDataset) or planned.info.form != "one_epoch":
        return None
    return planned.rebuild


def _dataset_info(options: DatasetOptions, source: Source, context: Any, sizing: BatchSizeInfo,
                  plan: PipelinePlan, n_val: int) -> DatasetInfo:
    shard_policy = _shard_policy(source, options, context)
    return DatasetInfo(
        source=source.kind, num_samples=source.n - n_val, batch_size=sizing.batch_size,
        per_replica_batch_size=sizing.per_replica_batch_size, num_replicas=sizing.num_replicas,
        sizing=sizing.sizing, steps_per_epoch=sizing.steps_per_epoch,
        drop_remainder=options.drop_remainder, shard_policy=shard_policy,
        per_worker=options.per_worker, shuffle=options.shuffle, seed=options.seed,
        initial_epoch=options.initial_epoch, skip_batches=options.skip_batches, epochs=options.epochs,
        num_batches=sizing.steps_per_epoch if plan.one_epoch else plan.num_batches(),
        validation_samples=n_val, form=options.form,
        epoch_order=_epoch_order(options.shuffle, shard_policy, context.num_workers),
    )


def _epoch_order(shuffle: bool, shard_policy: str, workers: int) -> str | None:
    """How each epoch's samples are ordered, as checkpoints record it: the order function's name
    (or "in order"), and, where each worker reads a share of its own (`per_worker`, FILE
    auto-shard), over how many workers, since that number decides what each global batch holds."""
    name = order.EPOCH_ORDER if shuffle else IN_ORDER
    if workers > 1 and shard_policy in ("per_worker", "FILE"):
        return f"{name}, split over {workers} workers"
    return name


def _validation_rows(source: Source, validation_split: float | None) -> int:
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


def _shard_policy(source: Source, options: DatasetOptions, context: Any) -> str:
    if options.per_worker:
        return "per_worker"
    if source.kind == "files" and options.cache in (None, False) and len(source.files) >= context.num_workers:
        return "FILE"
    return "DATA"
