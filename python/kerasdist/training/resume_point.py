"""Where a run continues, and how: the resume point and the one resume routine every trainer
uses (`resume_fit` and `distributed_fit` through `fit_resumed`, `ps_fit` under them, `custom_fit`
through `start_at` and `train_segments`).

A checkpoint records the epoch to run next, the batches of it already trained, the history of the
epochs done, the running metrics, and (`RunRecord`) the global batch and the order function of
the data that trained it. A trainer asks the manager once which checkpoint the model continues
from (`CheckpointManager.resume_point`: the one it restored into the model), and `start_at` says
where this run continues in its own terms: the batches to skip are counted in this run's global
batch (`batches_to_skip`), and a mid-epoch point whose epoch another order function drew is
warned of (`check_epoch_order`). `train_from` then runs the trainer's loop from that point: the
rest of a partly trained epoch, then the remaining epochs, with the callbacks' state and a stop
request carried between the two, and one merged `History` (`merged_history`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import keras
import tensorflow as tf

from kerasdist.checkpoint import CheckpointCallback, CheckpointInfo, CheckpointWarning, RunRecord
from kerasdist.data import dataset_info
from kerasdist.data.resumable import DatasetInput, ResumableInput
from kerasdist.validation import integer

EpochData = Callable[[int], tf.data.Dataset]
SegmentRunner = Callable[["Segment"], "keras.callbacks.History | None"]


def check_total_epochs(epochs: Any) -> None:
    """`epochs` of a trainer: the total, epochs of earlier (interrupted) runs included."""
    integer("epochs", epochs, 1, hint="the total, earlier runs included")


@dataclass(frozen=True)
class ResumePoint:
    """Where training continues.

    Attributes:
        epoch: the epoch to run next (0-based).
        skip: batches of `epoch` already trained, in this run's global batch.
        history: per-epoch logs of the epochs done, earlier runs included.
        metrics: the logs when the checkpoint was saved (a mid-epoch checkpoint's running means).
        checkpoint: the checkpoint it comes from, or None for a fresh start.
        input: the position of the data's reader the checkpoint kept (`data/resumable.py`), or None.
    """

    epoch: int = 0
    skip: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: CheckpointInfo | None = None
    input: bytes | None = None


class EpochRange:
    """Epoch data made as one pipeline per range of epochs: `make(first, last, skip)` returns the
    batches of epochs first..last-1, less `skip` at the start of the first.

    resume_fit otherwise builds one dataset per epoch and concatenates them, and each of those
    holds its own copy of in-memory data; one pipeline over the range holds one.
    `global_batch_size` (samples per step) and `epoch_order` (the name of the function that
    orders the epochs), when given, are recorded in checkpoints and checked on resume
    (`batches_to_skip`, `check_epoch_order`).
    """

    def __init__(self, make: Callable[[int, int, int], tf.data.Dataset], global_batch_size: int | None = None,
                 epoch_order: str | None = None):
        self.make = make
        self.global_batch_size = global_batch_size
        self.epoch_order = epoch_order

    def __call__(self, epoch: int) -> tf.data.Dataset:
        return self.make(epoch, epoch + 1, 0)


def start_at(point: CheckpointInfo | None, checkpoint: CheckpointCallback, data: Any = None,
             settings: dict[str, Any] | None = None, position: bytes | None = None) -> ResumePoint:
    """Where a run on `data` with `settings` starts, in its own terms, given the checkpoint `point`
    the model continues from and the data position kept there (`CheckpointManager.run_start`; None: a fresh
    start). The callback is told where the run starts (its history) and what such a run records
    (`run_record_of`; None data, as under parameter servers: nothing of the data), so that its
    checkpoints record it."""
    run = run_record_of(data, settings) if data is not None else RunRecord(dict(settings or {}))
    checkpoint.use_run(run)
    checkpoint.begin_run(point)
    if point is None:
        return ResumePoint()
    check_epoch_order(point, run.epoch_order)
    return ResumePoint(point.epoch, batches_to_skip(point, run.global_batch_size), list(point.history),
                       dict(point.metrics), point, position if isinstance(data, ResumableInput) else None)


def count_steps(data: Any, point: CheckpointInfo | None) -> None:
    """Batches per epoch of data read as it is whose steps take a pass to count: the count `point`
    recorded (a resume then reads no pass), else a pass now (recorded by this run's checkpoints)."""
    if isinstance(data, DatasetInput):
        data.count_steps(point.steps_per_epoch if point is not None else None)


@dataclass(frozen=True)
class Segment:
    """One call of a trainer's loop: epochs `first`..`last`-1, less `skip` batches at the start of
    `first` (trained before the checkpoint the run resumed from)."""

    first: int
    last: int
    skip: int = 0


def segments_from(start: ResumePoint, epochs: int, *, steps: int | None = None,
                  one_call: bool = False) -> list[Segment]:
    """The loop calls that train from `start` to `epochs` in total: none when no epoch is left;
    a partly trained epoch's rest alone (Keras `fit` counts one `steps_per_epoch` for all its
    epochs), then the remaining epochs; or all in one call when the trainer's loop can start
    `skip` batches into its first epoch (`one_call`). With `steps` known, a skip of a whole
    epoch or more (a checkpoint of a longer epoch) trains that epoch again from its start."""
    if start.epoch >= epochs:
        return []
    skip = start.skip if steps is None or start.skip < steps else 0
    if one_call or skip == 0:
        return [Segment(start.epoch, epochs, skip)]
    rest = [Segment(start.epoch + 1, epochs)] if start.epoch + 1 < epochs else []
    return [Segment(start.epoch, start.epoch + 1, skip), *rest]


@dataclass(frozen=True)
class Trainer:
    """What `train_from` runs: `run(segment)` for each segment, on `data` (what the run records of
    it: `run_record_of`; None: nothing; its steps counted first if that takes a pass:
    `count_steps`), `begin(start)` once the resume point is known, and `steps()` the batches per
    epoch when known then (a skip of a whole epoch trains it again)."""

    run: SegmentRunner
    data: Any = None
    begin: Callable[[ResumePoint], None] | None = None
    steps: Callable[[], int | None] = lambda: None


def train_from(trainer: Trainer, epochs: int, checkpoint: CheckpointCallback, model: Any,
               context: Any) -> keras.callbacks.History:
    """The checkpoint `model` continues from asked once (`CheckpointManager.run_start`), the run's start
    worked out from it (`start_at`), then `trainer` run from there."""
    point, position = checkpoint.manager.run_start(model, context)
    count_steps(trainer.data, point)
    start = start_at(point, checkpoint, trainer.data, position=position)
    if trainer.begin is not None:
        trainer.begin(start)
    return train_segments(start, epochs, checkpoint, model, trainer.run, steps=trainer.steps())


def train_segments(start: ResumePoint, epochs: int, checkpoint: CheckpointCallback, model: Any,
                   run: SegmentRunner, *, steps: int | None = None, one_call: bool = False) -> keras.callbacks.History:
    """Train from `start` to `epochs` in total: `run(segment)` for each of `segments_from`'s
    segments, and one `History` of all epochs, earlier runs' included.

    A segment that starts mid-epoch runs with the checkpoint callback told so
    (`resuming_mid_epoch`: its checkpoints count steps within the epoch, and when another
    segment follows, the other callbacks' state goes on into it). A callback that stopped
    training in a segment (at any batch, or EarlyStopping at its end) ends the run there: the
    next segment would clear the request and go on.
    """
    plan = segments_from(start, epochs, steps=steps, one_call=one_call)
    histories = []
    try:
        for index, segment in enumerate(plan):
            if index and model.stop_training:
                break
            with checkpoint.resuming_mid_epoch(segment.skip, then_continues=index + 1 < len(plan)):
                history = run(segment)
            if history is not None:
                histories.append(history)
    finally:
        checkpoint.stop_watching()  # also when a fit raised (Keras then calls no end hook)
        checkpoint.end_run()
    return merged_history(model, start.history, histories)


def run_record_of(data: Any, settings: dict[str, Any] | None = None) -> RunRecord:
    """What checkpoints record about a run on `data`: its samples per step and its epochs' order
    function when the data knows them (`make_dataset` data, an `EpochRange` that was told them),
    and the training `settings`. Builds no dataset."""
    settings = dict(settings or {})
    if isinstance(data, EpochRange):
        return RunRecord(settings, data.global_batch_size, data.epoch_order)
    if isinstance(data, ResumableInput):  # its steps recorded where knowing them takes a pass
        counted = data.steps_per_epoch if isinstance(data, DatasetInput) and data.counted else None
        return RunRecord(settings, data.global_batch_size, None, counted)
    try:
        info = dataset_info(data)
    except (ValueError, TypeError):
        return RunRecord(settings)
    return RunRecord(settings, info.batch_size, info.epoch_order)


def batches_to_skip(point: CheckpointInfo, global_batch_size: int | None) -> int:
    """Batches of `point.epoch` to skip when resuming from `point` with batches of
    `global_batch_size` samples.

    The sample order of an epoch is a function of (seed, epoch) only (`make_dataset`), so under
    the global batch the checkpoint was written with, skipping its `step_in_epoch` batches
    continues at the next unseen sample, whatever the number of replicas or workers. Under
    another global batch the checkpoint's `step_in_epoch * old` samples are skipped, rounded
    down to whole new batches so that no sample goes untrained; a warning says so, and how many
    samples are trained a second time. Unknown sizes (data not from `make_dataset`) are taken
    as unchanged.
    """
    old, new = point.global_batch_size, global_batch_size
    if point.step_in_epoch == 0 or old is None or new is None or old == new:
        return point.step_in_epoch
    seen = point.step_in_epoch * old
    skip, again = divmod(seen, new)
    warnings.warn(
        f"The checkpoint {point.path} was written with a global batch of {old} samples, this run "
        f"uses {new}: the sample stream is not the same, so it cannot continue exactly. It resumes "
        f"epoch {point.epoch} at sample {skip * new} (batch {skip} of {new}); the {seen} samples "
        f"already trained in that epoch are skipped"
        + (f" except the last {again}, which are trained again." if again else "."),
        CheckpointWarning, stacklevel=3,
    )
    return skip


def check_epoch_order(point: CheckpointInfo, epoch_order: str | None) -> None:
    """Warn when `point` stopped inside an epoch ordered otherwise than this run orders it (another
    kerasdist's order function, or a share per worker over another number of workers: see
    `DatasetInfo.epoch_order`): the batches left of that epoch are then cut from this run's
    order, so some of its samples are trained twice and others not at all. Epoch boundaries,
    and orders unknown on either side, pass."""
    old = point.epoch_order
    if point.step_in_epoch == 0 or old is None or epoch_order is None or old == epoch_order:
        return
    warnings.warn(
        f"The checkpoint {point.path} stopped {point.step_in_epoch} batches into epoch {point.epoch}, "
        f"whose order came from {old!r}; this run orders epochs with {epoch_order!r}. The rest "
        f"of that epoch is cut from the new order, so some of its samples are trained twice and "
        f"others not at all; later epochs are whole.",
        CheckpointWarning, stacklevel=3,
    )


def epoch_steps(dataset: tf.data.Dataset, name: str) -> int:
    """The batches of one epoch of `dataset` (`name` is the argument it came in), known to
    tf.data or to `make_dataset`; an error asking for steps_per_epoch otherwise."""
    cardinality = dataset.cardinality  # a property of a distributed dataset (per_worker=True)
    count = int(cardinality() if callable(cardinality) else cardinality)
    if count < 0:  # make_dataset's pipelines know their steps even when tf.data does not
        try:
            count = int(dataset_info(dataset).steps_per_epoch or -1)
        except ValueError:
            pass
    if count < 0:
        raise ValueError(
            f"{name} has an unknown or infinite number of batches: pass steps_per_epoch."
        )
    return count


def merged_history(model: Any, prior: list[dict[str, float]], histories: list[Any]) -> keras.callbacks.History:
    """One History of all epochs: `prior` (the epochs of earlier runs, from the checkpoint) then
    each of this run's `histories`."""
    merged = keras.callbacks.History()
    merged.set_model(model)
    merged.epoch = list(range(len(prior)))
    merged.history = {}
    for logs in prior:
        for key, value in logs.items():
            merged.history.setdefault(key, []).append(value)
    for history in histories:
        merged.epoch.extend(history.epoch)
        for key, values in history.history.items():
            merged.history.setdefault(key, []).extend(float(v) for v in values)
    return merged
