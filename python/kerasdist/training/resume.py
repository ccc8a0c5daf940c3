"""`resume_fit`: Keras `fit` that continues from the newest checkpoint, mid-epoch included."""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from kerasdist import compat
from kerasdist.checkpoint import (
    CheckpointCallback,
    CheckpointManager,
    CheckpointWarning,
    as_manager,
    manager_of,
)
from kerasdist.checkpoint.callback import refuse_backup_and_restore
from kerasdist.checkpoint.chief_state import restore_into
from kerasdist.context import context_of
from kerasdist.data import one_epoch_rebuild
from kerasdist.data.resumable import (
    ResumableInput,
    made_by_make_dataset,
    resumable_input,
    say_how_it_resumes,
)
from kerasdist.monitoring import monitored
from kerasdist.preemption import exit_on_lost_peer
from kerasdist.step_guard import check_step_functions
from kerasdist.training.ps import ps_fit, required_steps
from kerasdist.training.resume_point import (
    EpochData,
    EpochRange,
    ResumePoint,
    Segment,
    Trainer,
    check_total_epochs,
    epoch_steps,
    train_from,
)
from kerasdist.training.speed import (
    check_steps_per_execution,
    model_steps_per_execution,
    set_steps_per_execution,
)


@dataclass(frozen=True)
class FitArgs:
    """What each `fit` (or `ps_fit`) call of a resumed run takes besides its data and epochs."""

    callbacks: list[Any]  # the checkpoint callback last
    validation_data: Any = None
    validation_steps: int | None = None
    verbose: Any = "auto"

    def for_keras(self) -> dict[str, Any]:
        # shuffle=False: the order is the data's own (a function of the epoch), never Keras's
        return dict(callbacks=self.callbacks, validation_data=self.validation_data, verbose=self.verbose,
                    shuffle=False)

    def for_ps_fit(self) -> dict[str, Any]:
        return dict(callbacks=self.callbacks, validation_data=self.validation_data,
                    validation_steps=self.validation_steps, verbose=self.verbose)


def resume_fit(
    model: Any,
    data: tf.data.Dataset | EpochData,
    epochs: int,
    checkpoint: CheckpointCallback | str | os.PathLike[str] | None = None,
    *,
    steps_per_epoch: int | None = None,
    callbacks: Sequence[Any] | None = None,
    validation_data: Any = None,
    validation_steps: int | None = None,
    verbose: Any = "auto",
) -> keras.callbacks.History:
    """Fit to `epochs` in total, continuing where the newest checkpoint left off.

    A run restarted after a crash continues at the next unseen batch of the interrupted epoch
    (not at the epoch start), so with seeded data and TensorFlow op determinism it ends with the
    same weights, bit for bit, as a run that was never interrupted.

    Under a `tf.distribute.ParameterServerStrategy` (the model built in its scope, on the chief)
    training runs through `ps_fit`, since Keras 3 `fit` cannot: `steps_per_epoch` is then
    required, `data` (and `validation_data`) is a dataset or a function of a
    `tf.distribute.InputContext` as `ps_fit` takes, checkpoints are written at epoch ends by the
    coordinator (`every_steps` and `every_seconds` are refused: steps run asynchronously on the
    workers), and a run stopped mid-epoch by SIGTERM resumes with the steps that epoch had left.

    Args:
        model: a compiled Keras model, usually from `make_or_restore_model`. A model made
            elsewhere takes the newest valid checkpoint of `checkpoint`'s store first (as
            `make_or_restore_model` would load it), so training goes on from that state.
        data: batches as Keras's `fit` takes them: a batched `tf.data.Dataset` (its passes the
            epochs, reshuffled as it says), a `keras.utils.PyDataset` or a Python generator (with
            `steps_per_epoch`), read by kerasdist one batch per step with its position kept in
            each checkpoint (`resume_rule` says how a resume continues it); a `make_dataset`
            dataset; or a function `data(epoch)` returning the batches of that epoch (e.g.
            shuffled as a pure function of a seed and the epoch).
        epochs: total number of epochs, counting those done by earlier runs.
        checkpoint: a `checkpoint_callback(...)`, or a directory for one with the defaults;
            None for the directory the model was made or restored from by
            `make_or_restore_model`.
        steps_per_epoch: batches per epoch, when the data cannot tell (a generator; a dataset
            of unknown cardinality is otherwise counted once, by a pass over it).
        callbacks: more Keras callbacks.
        validation_data: passed to `fit`.
        validation_steps: passed to `fit`; required with `validation_data` under a
            parameter-server strategy.
        verbose: passed to `fit`.

    Returns:
        A `History` whose `history` and `epoch` cover all epochs, earlier runs included.
    """
    check_total_epochs(epochs)
    callbacks = list(callbacks or [])
    checkpoint = _checkpoint_of(model, checkpoint)
    # The checkpoint callback comes last, so an epoch-end checkpoint holds the others' state after that epoch.
    return _resume(model, data, epochs, checkpoint, [*callbacks, checkpoint], steps_per_epoch, validation_data,
                   validation_steps, verbose)


def _resume(model: Any, data: Any, epochs: int, checkpoint: CheckpointCallback, callbacks: list[Any],
            steps_per_epoch: int | None, validation_data: Any, validation_steps: int | None,
            verbose: Any) -> keras.callbacks.History:
    """resume_fit with its checkpoint callback among `callbacks`, in their order."""
    for index, callback in enumerate(callbacks):
        refuse_backup_and_restore(callback, index)
    context = context_of(model.distribute_strategy)
    check_step_functions(model, context.strategy)
    if not checkpoint.manager.holds(model):  # built elsewhere: it takes the store's newest checkpoint first
        restore_into(checkpoint.manager, model, context)
    return fit_resumed(model, data, epochs, checkpoint, context,
                       FitArgs(callbacks, validation_data, validation_steps, verbose), steps_per_epoch)


def fit_resumed(model: Any, data: Any, epochs: int, checkpoint: CheckpointCallback, context: Any,
                fit_args: FitArgs, steps_per_epoch: int | None = None) -> keras.callbacks.History:
    """Where every trainer ends, given what its caller worked out once: the model (made or
    restored, its step functions checked), its checkpoint callback (last of `fit_args.callbacks`)
    and the run's context. The trainer for `data` is chosen, the resume point worked out once
    (`train_from`), and the run trained from it."""
    trainer = _trainer_for(model, data, checkpoint, context, fit_args, steps_per_epoch)
    with exit_on_lost_peer(context.num_workers, context.task, checkpoint.stopped_by_lost_peer):
        return train_from(trainer, epochs, checkpoint, model, context)


def _trainer_for(model: Any, data: Any, checkpoint: CheckpointCallback, context: Any, fit_args: FitArgs,
                 steps_per_epoch: int | None) -> Trainer:
    """The trainer of `data` under `context`: ps_fit's, Keras fit on data kerasdist reads itself, or
    Keras fit on epochs of datasets."""
    fit_args = dataclasses.replace(fit_args, callbacks=monitored(fit_args.callbacks, context, checkpoint))
    if context.is_parameter_server:
        return _ps_trainer(model, data, checkpoint, steps_per_epoch, fit_args)
    data = _epochs_of_planned(data)
    source = data if isinstance(data, ResumableInput) else None if (
        isinstance(data, EpochRange) or made_by_make_dataset(data)) else resumable_input(data, steps_per_epoch)
    if source is not None:
        return _reading_trainer(model, source, checkpoint, context, fit_args)
    if not callable(data) and not isinstance(data, tf.data.Dataset):
        raise ValueError(
            "data must be a tf.data.Dataset of batches, a keras.utils.PyDataset, a Python generator of "
            f"batches or a function of the epoch, got {type(data).__name__}."
        )
    fit = _KerasFit(model, _epoch_datasets(data), lambda: steps_per_epoch, checkpoint.every_steps,
                    context.num_replicas, fit_args)
    return Trainer(fit, data(0) if _epoch_function(data) else data)


def _reading_trainer(model: Any, source: ResumableInput, checkpoint: CheckpointCallback, context: Any,
                     fit_args: FitArgs) -> Trainer:
    """Keras fit on data kerasdist reads itself (`data/resumable.py`): its reader put where the
    checkpoint left it, then one batch per step, its position in every checkpoint."""
    say_how_it_resumes(source)
    checkpoint.use_input(source)
    fit = _KerasFit(model, lambda first, last, skip: source.keras_input(), lambda: source.steps_per_epoch,
                    checkpoint.every_steps, context.num_replicas, fit_args)

    def begin(start: ResumePoint) -> None:
        source.start(context, start.input, start.epoch, start.skip)

    return Trainer(fit, source, begin=begin, steps=lambda: source.steps_per_epoch)


class _KerasFit:
    """Keras `fit` over one segment of a resumed run (`train_from`), on `data(first, last, skip)`:
    the batches of epochs first..last-1, less `skip` at the start; `known_steps()` the batches per
    epoch when known by the first segment (given, or counted at the resume point), else None."""

    def __init__(self, model: Any, data: Callable[[int, int, int], Any], known_steps: Callable[[], int | None],
                 every_steps: int | None, num_replicas: int, fit_args: FitArgs):
        self.model, self.data, self.fit_args = model, data, fit_args
        self.known_steps, self._every_steps, self._num_replicas = known_steps, every_steps, num_replicas
        self._steps: int | None = None

    def steps(self, epoch: int) -> int:
        """Batches per epoch, known at the first segment (before anything trains) and checked
        against steps_per_execution."""
        if self._steps is None:
            # Always give fit the step count: on a dataset of unknown cardinality Keras 3.15 counts one
            # optimizer iteration more than the batches it trained on, which would shift every later step.
            self._steps = self.known_steps() or epoch_steps(self.data(epoch, epoch + 1, 0), "data")
            check_steps_per_execution(model_steps_per_execution(self.model), self._steps, self._every_steps,
                                      self._num_replicas)
        return self._steps

    def __call__(self, segment: Segment) -> keras.callbacks.History:
        with compat.fit_unrouted():
            return self._fit(segment)

    def _fit(self, segment: Segment) -> keras.callbacks.History:
        steps = self.steps(segment.first)
        if not segment.skip:
            # One stream over the segment's epochs: with steps_per_epoch Keras keeps one iterator
            # across epochs, so epoch e gets exactly data(e).
            return self.model.fit(self.data(segment.first, segment.last, 0), initial_epoch=segment.first,
                                  epochs=segment.last, steps_per_epoch=steps, **self.fit_args.for_keras())
        # The rest of the epoch in executions that divide it (a checkpoint of a run with another
        # steps_per_execution, or of a preemption, may stop anywhere).
        per_execution = model_steps_per_execution(self.model)
        set_steps_per_execution(self.model, math.gcd(per_execution, segment.skip))
        try:
            return self.model.fit(self.data(segment.first, segment.last, segment.skip),
                                  initial_epoch=segment.first, epochs=segment.last,
                                  steps_per_epoch=steps - segment.skip, **self.fit_args.for_keras())
        finally:
            set_steps_per_execution(self.model, per_execution)


# fit's arguments resume_fit has no counterpart for, at their defaults (a fit that gives one is Keras's own).
_KERAS_ONLY = {"y": None, "batch_size": None, "validation_split": 0.0, "class_weight": None,
               "sample_weight": None, "initial_epoch": 0, "validation_batch_size": None, "validation_freq": 1}


def fit_with_checkpoints(model: Any, arguments: dict[str, Any]) -> keras.callbacks.History | None:
    """`model.fit(...)` given a kerasdist checkpoint callback: resumed as `resume_fit` resumes
    (restored at the newest checkpoint, the data at its next unseen batch), the callbacks in the
    order given; None (Keras's own fit, its step first checked for R functions: `keras_fit`)
    for any other fit, and for data resume_fit does not take (arrays) or arguments it has no
    counterpart for, which a warning names."""
    callbacks = arguments.get("callbacks")
    ours = [c for c in callbacks or () if isinstance(c, CheckpointCallback)]
    data = arguments.get("x")
    if len(ours) != 1 or not isinstance(callbacks, (list, tuple)) or not _resumable_kind(data):
        return keras_fit(model)
    given = [name for name, default in _KERAS_ONLY.items() if arguments.get(name) != default]
    if given:
        warnings.warn(
            f"model.fit with a kerasdist checkpoint callback and {', '.join(given)}: Keras's own fit "
            "runs, which saves checkpoints but restarts at the first batch of the first epoch; "
            "without those arguments (or with kerasdist.resume_fit) it continues at the next unseen batch.",
            CheckpointWarning, stacklevel=4,
        )
        return keras_fit(model)
    check_total_epochs(arguments["epochs"])
    return _resume(model, data, arguments["epochs"], ours[0], list(callbacks), arguments["steps_per_epoch"],
                   arguments["validation_data"], arguments["validation_steps"], arguments["verbose"])


def keras_fit(model: Any) -> keras.callbacks.History | None:
    """None: Keras's own fit runs, once `check_step_functions` found no R function its step
    would call on replica threads (a fit of keras3's, on any model, refuses R code under several
    replicas before R could abort)."""
    check_step_functions(model, model.distribute_strategy)
    return None


def _resumable_kind(data: Any) -> bool:
    """Data resume_fit continues at its next unseen batch: a dataset (make_dataset's or one of
    batches), a PyDataset, a Python generator."""
    return isinstance(data, (tf.data.Dataset, keras.utils.PyDataset, ResumableInput)) or (
        isinstance(data, collections.abc.Iterator) and not isinstance(data, tf.data.Iterator))


compat.route_fit(fit_with_checkpoints)


def _epoch_function(data: Any) -> bool:
    """A user's function of the epoch: its run record is what its datasets carry (make_dataset's)."""
    return callable(data) and not isinstance(data, EpochRange)


def _epochs_of_planned(data: Any) -> Any:
    """A one-epoch `make_dataset` dataset as the epochs it stands for: resume_fit rebuilds the
    stream of the epochs it runs (at the resume point) instead of counting passes."""
    from kerasdist.data import dataset_info

    rebuild = one_epoch_rebuild(data)
    if rebuild is None:
        return data

    def make(first: int, last: int, skip: int = 0) -> tf.data.Dataset:
        return rebuild(initial_epoch=first, epochs=last, skip_batches=skip)

    info = dataset_info(data)
    return EpochRange(make, info.batch_size, info.epoch_order)


def _ps_trainer(model: Any, data: Any, checkpoint: CheckpointCallback, steps_per_epoch: int | None,
               fit_args: FitArgs) -> Trainer:
    """resume_fit under a parameter-server strategy: ps_fit, resumed at the checkpoint's epoch."""
    for name in ("every_steps", "every_seconds"):
        if getattr(checkpoint, name) is not None:
            raise ValueError(
                f"checkpoint: {name} is not supported with parameter-server training (steps run "
                "asynchronously on the workers, so there is no consistent state between epoch ends); "
                f"use checkpoint_callback(..., {name}=None) and a smaller steps_per_epoch to save "
                "more often."
            )
    steps = required_steps("steps_per_epoch", steps_per_epoch, "data")

    def fit(segment: Segment) -> keras.callbacks.History:
        return ps_fit(model, data, segment.last, initial_epoch=segment.first,
                      steps_per_epoch=steps - segment.skip, **fit_args.for_ps_fit())

    return Trainer(fit, None, steps=lambda: steps)  # data under parameter servers records nothing


def _checkpoint_of(model: Any, checkpoint: Any) -> CheckpointCallback:
    """resume_fit's `checkpoint` as a callback; a directory (or None) goes through the manager
    the model was restored by when it is the same directory, so the resume point comes from
    the read that restored the model."""
    if isinstance(checkpoint, CheckpointCallback):
        return checkpoint
    if checkpoint is None:
        checkpoint = manager_of(model)
        if checkpoint is None:
            raise ValueError(
                "checkpoint is required: give a checkpoint_callback() or a directory, or make the "
                "model with make_or_restore_model(checkpoint_dir, build_fn), which remembers it."
            )
    if not isinstance(checkpoint, CheckpointManager):
        checkpoint = as_manager(checkpoint, model)
    return CheckpointCallback(checkpoint)


def _epoch_datasets(data: EpochRange | EpochData) -> Callable[[int, int, int], tf.data.Dataset]:
    """`data(first, last, skip)` for `_KerasFit`: epochs first..last-1 as one dataset, less `skip`
    at the start (one pipeline over the range for an `EpochRange`, else each epoch's
    concatenated)."""
    if isinstance(data, EpochRange):
        return data.make
    if isinstance(data, tf.data.Dataset):  # make_dataset's stream: the same dataset every epoch
        dataset = data
        data = lambda epoch: dataset  # noqa: E731

    def epochs(first: int, last: int, skip: int = 0) -> tf.data.Dataset:
        stream = data(first).skip(skip) if skip else data(first)
        for epoch in range(first + 1, last):
            stream = stream.concatenate(data(epoch))
        return stream

    return epochs
