"""`distributed_fit`: strategy, model, input pipeline, checkpoints and resume in one call.

It strings together the pieces the other modules provide, in the order a fault-tolerant run
needs them: check every argument, pick (or take) the strategy, build the first epoch's dataset
(which checks the data), then make or restore the model inside the strategy's scope, refuse R
functions that TensorFlow would run on its replica threads, and fit to the total number of epochs
from the newest checkpoint (`resume_fit`, mid-epoch resume included).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from kerasdist.checkpoint import (
    CheckpointCallback,
    CheckpointManager,
    CheckpointOptions,
    RunRecord,
    check_trainer_callbacks,
    make_or_restore_model,
)
from kerasdist.context import context_of
from kerasdist.data import DatasetOptions, PlannedDataset, replace_epochs
from kerasdist.data.resumable import ResumableInput, resumable_input
from kerasdist.data.structure import dataset_structure
from kerasdist.step_guard import check_step_functions
from kerasdist.strategy import KINDS, select_strategy
from kerasdist.training.resume import FitArgs, fit_resumed
from kerasdist.training.resume_point import EpochRange, check_total_epochs
from kerasdist.training.speed import (
    TrainingSettings,
    check_jit,
    check_resumed_settings_of,
    check_steps_per_execution,
    choose_steps_per_execution,
    precision_policy,
    set_steps_per_execution,
    with_build_settings,
)
from kerasdist.validation import record_from, record_of, with_field_docs

# Arguments distributed_fit sets itself; dataset_args may not override them.
_OWN_DATASET_ARGS = ("x", "y", "sample_weight", "batch_size", "per_replica_batch_size", "strategy",
                     "seed", "shuffle", "initial_epoch", "skip_batches", "epochs",
                     "validation_split", "per_worker")


@with_field_docs(CheckpointOptions)
@with_field_docs(TrainingSettings)
def distributed_fit(
    build_fn: Callable[[], Any],
    x: Any,
    y: Any = None,
    *,
    epochs: int,
    checkpoint_dir: str | os.PathLike[str],
    strategy: Any = "auto",
    batch_size: int | None = DatasetOptions.batch_size,
    per_replica_batch_size: int | None = DatasetOptions.per_replica_batch_size,
    seed: int = DatasetOptions.seed,
    shuffle: bool = DatasetOptions.shuffle,
    sample_weight: Any = DatasetOptions.sample_weight,
    validation_split: float | None = DatasetOptions.validation_split,
    validation_data: Any = None,
    callbacks: Sequence[Any] | None = None,
    dataset_args: Mapping[str, Any] | None = None,
    steps_per_epoch: int | None = None,
    verbose: Any = "auto",
    mixed_precision: bool = TrainingSettings.mixed_precision,
    jit_compile: bool = TrainingSettings.jit_compile,
    gradient_accumulation_steps: int | None = TrainingSettings.gradient_accumulation_steps,
    steps_per_execution: int | str = TrainingSettings.steps_per_execution,
    every_epoch: bool = CheckpointOptions.every_epoch,
    every_steps: int | None = CheckpointOptions.every_steps,
    every_seconds: float | None = CheckpointOptions.every_seconds,
    keep: int = CheckpointOptions.keep,
    keep_best: bool = CheckpointOptions.keep_best,
    monitor: str = CheckpointOptions.monitor,
    mode: str = CheckpointOptions.mode,
    async_save: bool = CheckpointOptions.async_save,
    storage_options: Mapping[str, Any] | None = CheckpointOptions.storage_options,
    handle_sigterm: bool = CheckpointOptions.handle_sigterm,
    hang_timeout: float | str | None = CheckpointOptions.hang_timeout,
) -> keras.callbacks.History:
    """Train `build_fn()`'s model on (x, y) under a distribution strategy, surviving restarts.

    One call does what a fault-tolerant distributed run needs: selects the strategy ("auto" by
    default), builds the model inside its scope or restores it from the newest valid checkpoint
    in `checkpoint_dir`, feeds `make_dataset(x, y, ...)` rebuilt for each epoch (its order a pure
    function of `seed` and the epoch), saves crash-safe checkpoints at every epoch end (and every
    `every_steps` steps), and fits until `epochs` epochs are done in total. Run the same call
    again after a crash, a kill or a preemption and it continues at the next unseen batch.

    ```python
    kerasdist.simulate_devices(2)          # optional: 2 CPU replicas on one machine
    history = kerasdist.distributed_fit(build_model, x, y, epochs=5, checkpoint_dir="ckpt",
                                        batch_size=64, every_steps=20, validation_split=0.1)
    model = history.model
    ```

    Args:
        build_fn: function with no arguments returning a compiled, built Keras model; called
            inside the strategy's scope.
        x: the data: anything `make_dataset` takes (arrays, data frames, a dataset of
            unbatched elements, file patterns), batched by it; or data of batches as Keras's
            `fit` takes it, trained on as it is: a batched `tf.data.Dataset` (each batch one
            global batch, split over the replicas), a `keras.utils.PyDataset`, a Python
            generator. A restart continues either at the next unseen batch (`resume_rule` says
            how, for data of batches).
        y: the targets, as `make_dataset` takes them (None when `x` holds them).
        epochs: total number of epochs, counting those done by earlier (interrupted) runs.
        checkpoint_dir: directory of checkpoints, created if missing; or an object-store URL
            (`s3://bucket/run`, `gs://bucket/run`): see `CheckpointManager`.
        strategy: a `tf.distribute.Strategy` (from `select_strategy` or not), or a kind for
            `select_strategy`: "auto" (default), "default", "mirrored", ...
        batch_size: global batch size; or give `per_replica_batch_size`; neither means 32.
        per_replica_batch_size: batch size of one replica (multiplied by the replicas).
        seed: seed of the per-epoch shuffle.
        shuffle: shuffle each epoch (as a function of `seed` and the epoch).
        sample_weight: optional per-sample weights (arrays).
        validation_split: fraction in (0, 1) of the samples (the last ones, as in Keras) held
            out for validation; in-memory data only.
        validation_data: `(x_val, y_val)` (batched like the training data, unshuffled) or a
            batched `tf.data.Dataset`.
        callbacks: more Keras callbacks (TensorBoard, EarlyStopping, CSVLogger, your own);
            checkpoints are added by distributed_fit itself.
        dataset_args: more arguments for `make_dataset`, e.g. {"drop_remainder": True}: a
            dict of `DatasetOptions` fields (a key that is not one is refused, naming it).
        steps_per_epoch: batches per epoch of data of batches that cannot tell (a Python
            generator; a dataset with a filter is counted once, by a pass over it).
        verbose: passed to `fit`.

    The speed options (`mixed_precision`, `jit_compile`, `gradient_accumulation_steps`,
    `steps_per_execution`) are the fields of `TrainingSettings`, and the checkpoint options
    (`every_steps`, `keep`, `async_save`, ...) those of `CheckpointOptions`, each documented there.

    Returns:
        The Keras `History` of all epochs, earlier runs included; `history.model` is the trained
        model.

    Raises:
        ValueError: a bad argument (named in the message), before any checkpoint is read or
            written; or, under more than one replica, a loss, metric or layer that is an R
            function (see `check_step_functions`).
    """
    arguments = dict(locals())  # as given: the option records are made from them
    if not callable(build_fn) or isinstance(build_fn, keras.Model):
        raise ValueError(
            "build_fn must be a function with no arguments that returns a compiled Keras model, "
            f"got {type(build_fn).__name__}."
        )
    check_total_epochs(epochs)
    _check_strategy_arg(strategy)
    options = _dataset_options(dataset_args).replaced(
        sample_weight=sample_weight, batch_size=batch_size, per_replica_batch_size=per_replica_batch_size,
        seed=seed, shuffle=shuffle, validation_split=validation_split,
    )
    if validation_split is not None and validation_data is not None:
        raise ValueError("validation_split and validation_data: give one of them, not both.")
    callbacks = _check_callbacks(callbacks)
    checkpointing = record_from(CheckpointOptions, arguments)
    settings = record_from(TrainingSettings, arguments)
    # checked now (a URL: its plugin, then the store answers when the settings are read), created when
    # used; this call's one manager, handed to the restore, the callback and the trainer
    checkpoints = CheckpointManager(checkpoint_dir, storage_options=checkpointing.storage_options, create=False)

    source = _data_read_as_it_is(x, y, sample_weight, validation_split, dataset_args, steps_per_epoch)
    context = context_of(select_strategy(strategy) if isinstance(strategy, str) else strategy)
    if source is not None:
        _check_batch_args(source, batch_size, per_replica_batch_size, context)
        _check_data_as_it_is(validation_data, settings)
        run = _Run(checkpointing, settings, context, RunRecord(settings.record()))
        return _train(build_fn, checkpoints, run, source, epochs, FitArgs(callbacks, validation_data, verbose=verbose))
    if steps_per_epoch is not None:
        raise ValueError("steps_per_epoch is for data of batches (x batched, a PyDataset, a generator); "
                         "make_dataset knows the steps of the data it batches.")
    options = options.replaced(strategy=context)

    # Plan once (checks the data, reads the source, sizes the epochs), then build only the
    # pipelines training runs: the epochs left, as one stream.
    planned = PlannedDataset.of(x, y, options)
    steps = planned.info.steps_per_epoch
    check_steps_per_execution(settings.steps_per_execution, steps, checkpointing.every_steps, context.num_replicas)

    def epochs_data(first_epoch: int, last_epoch: int, skip: int = 0) -> tf.data.Dataset:
        return replace_epochs(planned, initial_epoch=first_epoch, epochs=last_epoch, skip_batches=skip).build()

    if validation_split is not None:
        validation_data = planned.validation()
    elif isinstance(validation_data, (tuple, list)):
        validation_data = _validation_dataset(validation_data, options)

    # every argument (the data's included) is checked above, before the newest checkpoint is read
    record = RunRecord(settings.record(), planned.info.batch_size, planned.info.epoch_order)
    run = _Run(checkpointing, settings, context, record, steps)
    epoch_range = EpochRange(epochs_data, record.global_batch_size, record.epoch_order)
    return _train(build_fn, checkpoints, run, epoch_range, epochs, FitArgs(callbacks, validation_data, verbose=verbose))


@dataclass(frozen=True)
class _Run:
    """What distributed_fit works out once and hands down with the store's manager: the checkpoint
    options, the speed settings, the run's context, what checkpoints record of the run, and the
    batches per epoch (None: the data read as it is tells, at the resume point)."""

    checkpointing: CheckpointOptions
    settings: TrainingSettings
    context: Any
    record: RunRecord
    steps: int | None = None


def _train(build_fn: Callable[[], Any], checkpoints: CheckpointManager, run: _Run, data: Any, epochs: int,
           fit_args: FitArgs) -> keras.callbacks.History:
    """The model made or restored through `checkpoints` (in the strategy's scope, under the run's
    precision), its checkpoint callback last among the callbacks, then trained from the resume point."""
    with precision_policy(run.settings):
        model = _made_or_restored(build_fn, checkpoints, run, fit_args.callbacks)
        checkpoint = CheckpointCallback(checkpoints, run.checkpointing, run=run.record)
        # Outside the strategy's scope: Keras's fit enters it for each step itself, and a save made
        # inside it runs a collective that only the chief (the writer) would join, which fails
        # under multi-worker ("Collective instance ... expected type 1 ... but got type 0").
        fit_args = dataclasses.replace(fit_args, callbacks=[*fit_args.callbacks, checkpoint])
        return fit_resumed(model, data, epochs, checkpoint, run.context, fit_args, steps_per_epoch=run.steps)


def _made_or_restored(build_fn: Callable[[], Any], checkpoints: CheckpointManager, run: _Run,
                      callbacks: list[Any]) -> Any:
    """The model of `build_fn` made in the strategy's scope, or restored from the newest
    checkpoint (whose settings must be the run's), checked for R functions in its step, with
    its steps per execution chosen (the user's `callbacks` may need their batch hooks)."""
    settings, context = run.settings, run.context
    check_jit(settings, context)
    check_resumed_settings_of(checkpoints, settings)
    model = make_or_restore_model(checkpoints, with_build_settings(build_fn, settings), strategy=context)
    model.jit_compile = settings.jit_compile
    if run.steps is None:  # data read as it is: one batch per step
        set_steps_per_execution(model, 1)
    else:
        chosen, _ = choose_steps_per_execution(settings.steps_per_execution, model, context, run.steps,
                                               run.record.global_batch_size, run.checkpointing.every_steps,
                                               callbacks)
        set_steps_per_execution(model, chosen)
    check_step_functions(model, context.strategy)
    return model


def _data_read_as_it_is(x: Any, y: Any, sample_weight: Any, validation_split: Any, dataset_args: Any,
                        steps_per_epoch: Any) -> ResumableInput | None:
    """`x` when it is data Keras takes as it is (a batched tf.data.Dataset, a PyDataset, a Python
    generator): read as it is, not through make_dataset; checked against the arguments that
    only make_dataset's data takes. None for anything else (make_dataset's input)."""
    if isinstance(x, tf.data.Dataset) and not dataset_structure(x).batched:
        return None  # single samples: make_dataset batches them
    source = resumable_input(x, steps_per_epoch)
    if source is None:
        return None
    for name, value in (("y", y), ("sample_weight", sample_weight), ("validation_split", validation_split),
                        ("dataset_args", dataset_args)):
        if value is not None:
            raise ValueError(
                f"{name} cannot be given with x {_kind_of_data(x)}: "
                + ("put the targets and weights in its elements." if name in ("y", "sample_weight") else
                   "give validation_data instead." if name == "validation_split" else
                   "dataset_args are make_dataset's options, and x is trained on as it is.")
            )
    return source


def _kind_of_data(x: Any) -> str:
    if isinstance(x, tf.data.Dataset):
        return "that is a batched tf.data.Dataset"
    return f"that is a {type(x).__name__}"


def _check_batch_args(source: ResumableInput, batch_size: Any, per_replica_batch_size: Any, context: Any) -> None:
    """batch_size and per_replica_batch_size against the batches `source` already holds: left out,
    or the same global batch."""
    given = {"batch_size": batch_size, "per_replica_batch_size": per_replica_batch_size}
    for name, value in given.items():
        if value is None:
            continue
        globally = value * context.num_replicas if name == "per_replica_batch_size" else value
        held = source.global_batch_size
        if held is not None and globally == held:
            continue
        holds = f"batches of {held} samples" if held is not None else "batches already (of no fixed size)"
        raise ValueError(
            f"{name}={value} does not fit x, which holds {holds}"
            + (f" ({globally} over {context.num_replicas} replicas)" if name == "per_replica_batch_size" else "")
            + ": leave batch_size and per_replica_batch_size out to train on x's batches as they are "
            "(each one global batch, split over the replicas), or give x unbatched (without its "
            "batch()) for distributed_fit to batch."
        )


def _check_data_as_it_is(validation_data: Any, settings: TrainingSettings) -> None:
    """distributed_fit's arguments on data read as it is (one batch per step, its reader put
    where the checkpoint left it)."""
    if isinstance(validation_data, (tuple, list)):
        raise ValueError("validation_data must be a batched tf.data.Dataset (as x is) when x is trained on as it is.")
    if settings.steps_per_execution not in ("auto", 1):
        raise ValueError(
            f"steps_per_execution={settings.steps_per_execution}: x is read one batch per step, so "
            "only 1 (or 'auto') is possible with it."
        )


def _check_strategy_arg(strategy: Any) -> None:
    if isinstance(strategy, tf.distribute.Strategy):
        return
    if isinstance(strategy, str) and strategy in KINDS:
        return
    raise ValueError(
        f"strategy must be a tf.distribute.Strategy or one of {', '.join(KINDS)}, got {strategy!r}."
    )


def _check_callbacks(callbacks: Any) -> list[Any]:
    return check_trainer_callbacks(callbacks, "distributed_fit")


def _dataset_options(dataset_args: Any) -> DatasetOptions:
    """`dataset_args` (a dict of make_dataset arguments) as the record distributed_fit completes
    with its own arguments."""
    if dataset_args is None:
        return DatasetOptions()
    if isinstance(dataset_args, Mapping):
        taken = sorted(set(dataset_args) & set(_OWN_DATASET_ARGS))
        if taken:
            raise ValueError(
                f"dataset_args may not set {', '.join(taken)}: distributed_fit sets "
                f"{'it' if len(taken) == 1 else 'them'} (use its own arguments)."
            )
    return record_of(DatasetOptions, dataset_args, "dataset_args")


def _validation_dataset(validation_data: Sequence[Any], options: DatasetOptions) -> tf.data.Dataset:
    if len(validation_data) not in (2, 3):
        raise ValueError(
            f"validation_data must be (x_val, y_val) or (x_val, y_val, weights), got {len(validation_data)} items."
        )
    weights = validation_data[2] if len(validation_data) == 3 else None
    options = options.replaced(shuffle=False, sample_weight=weights, epochs=1, validation_split=None)
    return PlannedDataset.of(validation_data[0], validation_data[1], options).build()
