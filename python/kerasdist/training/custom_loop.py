"""`custom_fit`: a custom training step, distributed, logged like Keras, checkpointed and resumable.

The step is a Python function `step_fn(model, optimizer, batch)` that computes its gradients,
applies them and returns a dict of per-replica scalars scaled with `scaled_loss` (each replica's
share of the global mean). `custom_fit` runs it through `strategy.run` inside one `tf.function`,
sums the scalars across replicas, averages them over the epoch's steps, drives Keras callbacks
(progress bar, History, the user's own) and kerasdist's `CheckpointCallback` exactly as `fit`
does, and resumes at the next unseen batch from the newest checkpoint.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from kerasdist.checkpoint import (
    CheckpointCallback,
    CheckpointInfo,
    CheckpointOptions,
    as_manager,
    check_trainer_callbacks,
    manager_of,
)
from kerasdist.checkpoint.chief_state import restore_into
from kerasdist.checkpoint.manager import make_or_restore_model
from kerasdist.context import context_of
from kerasdist.data import dataset_info, one_epoch_rebuild
from kerasdist.data.resumable import (
    DatasetInput,
    ResumableInput,
    resumable_input,
    say_how_it_resumes,
)
from kerasdist.monitoring import monitored
from kerasdist.preemption import exit_on_lost_peer
from kerasdist.step_guard import is_r_function
from kerasdist.training.resume_point import (
    Segment,
    check_total_epochs,
    count_steps,
    epoch_steps,
    start_at,
    train_segments,
)
from kerasdist.training.speed import (
    TrainingSettings,
    apply_to_optimizer,
    check_jit,
    check_model_precision,
    check_resumed_settings,
    check_resumed_settings_of,
    precision_policy,
    with_build_settings,
)
from kerasdist.validation import optional_integer, record_from, verbosity, with_field_docs

StepFn = Callable[[Any, Any, Any], Mapping[str, Any]]


def fit_step(model: Any, optimizer: Any, batch: Any) -> dict[str, Any]:
    """`fit`'s training step for a compiled model, as a `custom_fit` step function.

    The loss is the compiled loss (plus the model's regularization losses) computed as Keras's
    `train_step` does, already divided by the replicas for distribution; the gradients of
    `optimizer.scale_loss(loss)` (loss scaling under `mixed_float16`) are applied. Returns
    `{"loss": loss}`.
    """
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        scaled = optimizer.scale_loss(loss)
    gradients = tape.gradient(scaled, model.trainable_variables)
    optimizer.apply(gradients, model.trainable_variables)
    return {"loss": loss}


@with_field_docs(CheckpointOptions)
@with_field_docs(TrainingSettings, leave_out=("steps_per_execution",))
def custom_fit(
    model: Any,
    data: Any,
    step_fn: StepFn | None = None,
    epochs: int | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    *,
    optimizer: Any = None,
    strategy: Any = None,
    steps_per_epoch: int | None = None,
    callbacks: Sequence[Any] | None = None,
    verbose: Any = "auto",
    mixed_precision: bool = TrainingSettings.mixed_precision,
    jit_compile: bool = TrainingSettings.jit_compile,
    gradient_accumulation_steps: int | None = TrainingSettings.gradient_accumulation_steps,
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
    """Train with your own step function under the model's strategy, surviving restarts.

    ```python
    def step(model, optimizer, batch):
        x, y = batch
        with tf.GradientTape() as tape:
            per_example = keras.losses.sparse_categorical_crossentropy(y, model(x, training=True))
            loss = kerasdist.scaled_loss(per_example, model=model)
        grads = tape.gradient(optimizer.scale_loss(loss), model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return {"loss": loss}

    history = kerasdist.custom_fit(build_model, data, step, epochs=5, checkpoint_dir="ckpt")
    ```

    Every epoch, `data`'s batches are distributed and `step_fn(model, optimizer, batch)` runs on
    every replica through `strategy.run`, all in one `tf.function`. The dict it returns holds
    per-replica scalars already scaled with `scaled_loss` (each replica's share of the global
    mean): they are summed across replicas, averaged over the epoch's steps and logged as Keras
    logs them (`verbose`, callbacks, History). Checkpoints are written through kerasdist's
    checkpoint callback at every epoch end (and every `every_steps` steps, and on SIGTERM, which
    then exits with status 75); the same call after a crash continues at the next unseen batch,
    bit for bit on the default strategy with seeded data and op determinism.

    Args:
        model: a built Keras model (made in the strategy's scope, e.g. by
            `make_or_restore_model`), or a function with no arguments returning one: it is then
            built in the strategy's scope (under the mixed precision policy if asked) and restored
            from `checkpoint_dir`. A model given built is restored from `checkpoint_dir` unless
            `make_or_restore_model` already did.
        data: a `tf.data.Dataset` of global batches: a `make_dataset` stream over several epochs
            (or for ever), or a batched dataset of your own (its passes the epochs; read one
            batch per step, its position kept in each checkpoint, as `resume_fit` reads it); a
            `keras.utils.PyDataset` or a Python generator; or a function of a
            `tf.distribute.InputContext` (or of the context and the 0-based epoch) returning
            that input pipeline's per-replica batches (`distribute_datasets_from_function`);
            `steps_per_epoch` is then required.
        step_fn: a Python function `step_fn(model, optimizer, batch) -> dict of scalars`; it runs
            on the replicas' threads, so it cannot be an R function. None: `fit_step`, Keras's
            own step for a compiled model.
        epochs: total number of epochs, counting those done by earlier runs.
        checkpoint_dir: directory of checkpoints (or an object-store URL, `s3://bucket/run`);
            None for the one the model was made or restored from by `make_or_restore_model`.
        optimizer: None: the compiled model's optimizer; an optimizer given for a model
            compiled without one is attached (`model.compile(optimizer=...)`), so checkpoints
            hold its state.
        strategy: where a build function builds the model; None: the active strategy. A
            model given built trains under its own strategy.
        steps_per_epoch: batches per epoch, when `data` cannot tell.
        callbacks: more Keras callbacks (EarlyStopping, CSVLogger, your own).
        verbose: 0 (silent), 1 (progress bar) or 2 (a line per epoch); "auto" is 1.

    The speed options (`mixed_precision`, `jit_compile`, `gradient_accumulation_steps`) are
    fields of `TrainingSettings`, and the checkpoint options (`every_steps`, `keep`,
    `async_save`, ...) those of `CheckpointOptions`, each documented there.

    Returns:
        A Keras `History` of all epochs, earlier runs included; `history.model` is the model.

    Raises:
        ValueError: a bad argument, an R `step_fn`, or a checkpoint written with other
            speed settings (named), before anything is trained or written.
    """
    arguments = dict(locals())  # as given: the option records are made from them
    check_total_epochs(epochs)
    step_fn = _check_step_fn(step_fn)
    options = record_from(CheckpointOptions, arguments)
    callbacks = _check_callbacks(callbacks)
    settings = TrainingSettings(mixed_precision, jit_compile, gradient_accumulation_steps)
    verbose = verbosity("verbose", verbose)
    _check_model(model, checkpoint_dir, optimizer)
    pipeline = _Pipeline(data, steps_per_epoch)  # checks data and steps_per_epoch

    if checkpoint_dir is not None:  # refuse other settings before a checkpoint is loaded
        checkpoint_dir = as_manager(checkpoint_dir, model if isinstance(model, keras.Model) else None,
                                    storage_options=options.storage_options)
        check_resumed_settings_of(checkpoint_dir, settings)
    with precision_policy(settings):
        model = _model_of(model, checkpoint_dir, strategy, settings)
        context = context_of(model.distribute_strategy)
        check_jit(settings, context)
        check_model_precision(model, settings)
        _check_optimizer(model, optimizer)
        manager = as_manager(checkpoint_dir if checkpoint_dir is not None else manager_of(model), model)
        if not manager.holds(model):  # built elsewhere: it takes the store's newest checkpoint first
            restore_into(manager, model, context)
        resumed, position = manager.run_start(model, context)  # once; settings checked before start_at warns
        if resumed is not None:
            check_resumed_settings(resumed.settings, settings, resumed.path)
        optimizer = _optimizer_of(model, optimizer, context)
        checkpoint = CheckpointCallback(manager, options)
        pipeline.count_steps(resumed)
        start = start_at(resumed, checkpoint, pipeline.source or data, settings.record(), position)
        callbacks = monitored(callbacks, context, checkpoint)
        pipeline.start(context, start, checkpoint)
        with context.strategy.scope():
            apply_to_optimizer(optimizer, settings)
            optimizer.build(model.trainable_variables)
            train_function = _train_function(context.strategy, model, optimizer, step_fn, settings.jit_compile,
                                             reads_itself=pipeline.source is not None)
            # A mid-epoch checkpoint's metrics are the running means of the batches before it:
            # the resumed epoch's averages then cover the whole epoch, as if never interrupted.
            partial = dict(start.metrics) if start.skip else {}

            def run_epochs(segment: Segment) -> keras.callbacks.History:
                return _run(model, pipeline, train_function, segment, checkpoint, callbacks, verbose, partial)

            with exit_on_lost_peer(context.num_workers, context.task, checkpoint.stopped_by_lost_peer):
                return train_segments(start, epochs, checkpoint, model, run_epochs, one_call=True)


# --------------------------------------------------------------------------------------------
# The loop


def _run(model, pipeline, train_function, segment, checkpoint, callbacks, verbose, partial):
    """One callback list over the segment's epochs, the first started `segment.skip` batches in."""
    steps = pipeline.steps
    history = keras.callbacks.History()
    callback_list = keras.callbacks.CallbackList(
        [*callbacks, checkpoint, history], add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=segment.last, steps=steps,
    )
    model.stop_training = False
    logs: dict[str, Any] = {}
    callback_list.on_train_begin()
    for epoch in range(segment.first, segment.last):
        start = segment.skip if epoch == segment.first else 0
        iterator = pipeline.iterator(epoch, start)
        callback_list.on_epoch_begin(epoch)
        sums: dict[str, Any] | None = None
        if start and partial:
            sums = {name: tf.constant(value * start, tf.float32) for name, value in partial.items()}
        for count, batch in enumerate(range(start, steps), start=start + 1 if sums else 1):
            callback_list.on_train_batch_begin(batch)
            outputs = train_function(iterator)
            sums = outputs if sums is None else {
                name: sums[name] + tf.cast(value, sums[name].dtype) if name in sums else value * count
                for name, value in outputs.items()
            }
            logs = {name: total / count for name, total in sums.items()}
            callback_list.on_train_batch_end(batch, logs)
            if model.stop_training:
                break
        logs = {name: float(value) for name, value in logs.items()}
        callback_list.on_epoch_end(epoch, dict(logs))
        if model.stop_training:
            break
    callback_list.on_train_end(logs)
    return history


def _train_function(strategy, model, optimizer, step_fn, jit_compile, reads_itself=False):
    """One `tf.function`: the next batch of the distributed iterator, `step_fn` on every
    replica, the returned scalars summed across replicas. `reads_itself`: the iterator is
    kerasdist's reader of the data (`data/resumable.py`), whose next batch is taken outside the
    function, just before the step."""

    def replica_step(batch):
        return step_fn(model, optimizer, batch)

    if jit_compile:
        replica_step = tf.function(replica_step, jit_compile=True, reduce_retracing=True)

    def step(batch):
        outputs = strategy.run(replica_step, args=(batch,))
        if not isinstance(outputs, Mapping) or not outputs:
            raise ValueError(
                "step_fn must return a dict of scalars, e.g. {'loss': loss} (scaled with "
                f"kerasdist.scaled_loss), got {type(outputs).__name__}."
            )
        return {str(name): tf.cast(strategy.reduce("SUM", value, axis=None), tf.float32)
                for name, value in outputs.items()}

    if reads_itself:
        step_on_batch = tf.function(step, reduce_retracing=True)
        return lambda source: step_on_batch(source.next_batch())
    return tf.function(lambda iterator: step(next(iterator)))


class _Pipeline:
    """`data` as distributed iterators (by `strategy`): one per epoch (an epoch dataset, an input
    function), or one for the whole run (a stream over epochs), each started at the next unseen
    batch. Made (and `data` checked) before the model."""

    def __init__(self, data: Any, steps_per_epoch: Any):
        steps_per_epoch = optional_integer("steps_per_epoch", steps_per_epoch, 1)
        self.strategy: Any = None  # the model's, set once it is known
        self.data = data
        self._stream = None
        self._rebuild = one_epoch_rebuild(data)
        self.source = _read_as_it_is(data, steps_per_epoch)  # data kerasdist reads itself, if so
        if self.source is not None:
            self.steps, self.is_stream, self.first_epoch = self.source.steps_per_epoch, True, 0
        elif isinstance(data, tf.data.Dataset):
            self.steps = steps_per_epoch or _made_steps(data) or epoch_steps(data, "data")
            self.first_epoch, self.is_stream = _stream_of(data, self.steps)
            self.is_stream = self.is_stream and self._rebuild is None
        elif callable(data) and not isinstance(data, tf.distribute.DistributedDataset):
            if steps_per_epoch is None:
                raise ValueError("data is a function of an input context: pass steps_per_epoch.")
            self.steps, self.is_stream, self.first_epoch = steps_per_epoch, False, 0
            self._with_epoch = _positional_count(data) >= 2
        else:
            raise ValueError(
                "data must be a tf.data.Dataset of global batches (e.g. from make_dataset) or a "
                f"function of a tf.distribute.InputContext, got {type(data).__name__}."
            )

    def count_steps(self, point: CheckpointInfo | None) -> None:
        """Batches per epoch of data that cannot tell without a pass: `point`'s record, if it
        has them, else a pass (`count_steps`)."""
        if isinstance(self.source, DatasetInput):
            count_steps(self.source, point)
            self.steps = self.source.steps_per_epoch

    def start(self, context: Any, start: Any, checkpoint: CheckpointCallback) -> None:
        """Training is about to start at `start` under `context`."""
        self.strategy = context.strategy
        if self.source is not None:
            say_how_it_resumes(self.source)
            checkpoint.use_input(self.source)
            self.source.start(context, start.input, start.epoch, start.skip)

    def iterator(self, epoch: int, skip: int) -> Any:
        if self.source is not None:  # its position is where the resume point put it
            return self.source
        if self.is_stream:
            if self._stream is None:
                offset = (epoch - self.first_epoch) * self.steps + skip
                self._stream = iter(self.strategy.experimental_distribute_dataset(self.data.skip(offset)))
            return self._stream
        if self._rebuild is not None:  # make_dataset's one-epoch form: that epoch, exactly
            built = self._rebuild(initial_epoch=epoch, epochs=epoch + 1, skip_batches=skip)
            return iter(self.strategy.experimental_distribute_dataset(built))
        if isinstance(self.data, tf.data.Dataset):
            dataset = self.data.skip(skip) if skip else self.data
            return iter(self.strategy.experimental_distribute_dataset(dataset))
        make = self.data

        def per_replica(input_context):
            dataset = make(input_context, epoch) if self._with_epoch else make(input_context)
            return dataset.skip(skip) if skip else dataset

        return iter(self.strategy.distribute_datasets_from_function(per_replica))


def _read_as_it_is(data: Any, steps_per_epoch: int | None) -> ResumableInput | None:
    """The data kerasdist reads itself (a batched dataset not from make_dataset, a PyDataset, a
    Python generator), or None."""
    if isinstance(data, tf.data.Dataset) and _made_steps(data) is not None:
        return None  # make_dataset's: rebuilt at the point resumed
    return resumable_input(data, steps_per_epoch)


def _made_steps(dataset: tf.data.Dataset) -> int | None:
    """Batches per epoch of a make_dataset pipeline (its cardinality may span epochs)."""
    try:
        return dataset_info(dataset).steps_per_epoch
    except ValueError:
        return None


def _stream_of(dataset: tf.data.Dataset, steps: int) -> tuple[int, bool]:
    """(first epoch, whether the dataset runs on across epochs) of a dataset of batches."""
    from kerasdist.data import dataset_info

    try:
        info = dataset_info(dataset)
    except ValueError:
        info = None
    if info is not None:
        return info.initial_epoch, info.epochs is None or info.epochs - info.initial_epoch > 1
    count = int(dataset.cardinality())
    return 0, count == tf.data.INFINITE_CARDINALITY or count > steps


def _positional_count(fn: Any) -> int:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in kinds)


# --------------------------------------------------------------------------------------------
# Arguments


def _check_step_fn(step_fn: Any) -> StepFn:
    if step_fn is None:
        return fit_step
    if is_r_function(step_fn):
        raise ValueError(
            "step_fn is an R function: TensorFlow runs the step on one thread per replica, and R "
            "code cannot run off R's main thread (R aborts with 'C stack usage ... is too close to "
            "the limit'). Write the step in Python, e.g. reticulate::py_run_string(\"def step(model, "
            "optimizer, batch): ...\") and pass py$step."
        )
    if not callable(step_fn):
        raise ValueError(f"step_fn must be a function step_fn(model, optimizer, batch), got {type(step_fn).__name__}.")
    return step_fn


def _check_callbacks(callbacks: Any) -> list[Any]:
    return check_trainer_callbacks(callbacks, "custom_fit")


def _check_model(model: Any, checkpoint_dir: Any, optimizer: Any) -> None:
    """Refuse a model that is neither a built Keras model nor a build function (which needs
    `checkpoint_dir`), and an optimizer a built model cannot take, before anything is touched."""
    if isinstance(model, keras.Model):
        if not model.built:
            raise ValueError("model is not built: give it an Input, or pass a function that builds it.")
        _check_optimizer(model, optimizer)
    elif not callable(model):
        raise ValueError(f"model must be a Keras model or a function that builds one, got {type(model).__name__}.")
    elif checkpoint_dir is None:
        raise ValueError("model is a build function: pass checkpoint_dir.")


def _model_of(model: Any, checkpoint_dir: Any, strategy: Any, settings: Any) -> Any:
    if isinstance(model, keras.Model):
        return model
    return make_or_restore_model(checkpoint_dir, with_build_settings(model, settings), strategy=strategy)


def _check_optimizer(model: Any, optimizer: Any) -> None:
    compiled = getattr(model, "optimizer", None)
    if optimizer is None and compiled is None:
        raise ValueError("model has no optimizer: compile it, or pass optimizer.")
    if optimizer is not None and compiled is not None and compiled is not optimizer:
        raise ValueError(
            "optimizer differs from the model's compiled optimizer: checkpoints save the model's, "
            "so compile the model with it (or leave optimizer out)."
        )


def _optimizer_of(model: Any, optimizer: Any, context: Any) -> Any:
    """The optimizer training uses (checked by `_check_optimizer`): the compiled one, or
    `optimizer` attached to a model compiled without one."""
    compiled = getattr(model, "optimizer", None)
    if compiled is not None:
        return compiled
    with context.strategy.scope():
        model.compile(optimizer=optimizer)
    return optimizer
