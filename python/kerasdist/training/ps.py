"""Parameter-server training for Keras 3 models, which Keras 3 `fit` does not support.

Keras 3 `fit` refuses `tf.distribute.ParameterServerStrategy` (keras-team/keras#18624). A Keras 3
model built under that strategy's scope still trains when its steps are scheduled through a
`tf.distribute.coordinator.ClusterCoordinator`: `ps_fit` is that loop, shaped like `fit` (Keras
callbacks, validation, a `History`). Each scheduled step runs `model.train_step` on whichever
worker is free; the variables live on the parameter servers and the metrics are read on the
coordinator after each epoch's `join()`.

A cluster is the coordinator (task type "chief", the process that calls `ps_fit`), workers and ps
servers. Workers and ps servers run no training code of their own: they call `run_server()`,
which serves until the process is stopped. One script can play every role:

```python
import kerasdist

kerasdist.run_server()              # worker and ps tasks serve here and never return
strategy = kerasdist.select_strategy()  # on the chief: "parameter_server" from TF_CONFIG
with strategy.scope():
    model = build_model()
history = kerasdist.ps_fit(model, dataset, epochs=5, steps_per_epoch=100)
```

and `kerasdist.launch(["train.py"], num_workers=2, num_ps=1)` runs it as a local cluster.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

from kerasdist import compat
from kerasdist.context import context_of
from kerasdist.step_guard import check_step_functions
from kerasdist.validation import integer, verbosity

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]
SERVER_TASK_TYPES = ("worker", "ps")


def run_server(tf_config: str | dict[str, Any] | None = None) -> None:
    """Serve this process's worker or ps task until the process is stopped; the chief returns.

    Call it first thing in a script run on every task of a parameter-server cluster (e.g. by
    `launch(..., num_ps=1)`): on a "worker" or "ps" task it starts TensorFlow's gRPC server for
    that task and blocks for good (the launcher stops it once the chief is done); on the chief
    (the coordinator), or outside a parameter-server cluster, it returns at once so the script
    goes on to train.

    Args:
        tf_config: the TF_CONFIG to use (JSON text or a dict); None: the TF_CONFIG variable.
    """
    from kerasdist.cluster import cluster_from_environment, parse_tf_config

    cluster = cluster_from_environment() if tf_config is None else parse_tf_config(tf_config)
    if cluster.num_ps == 0 or cluster.task_type not in SERVER_TASK_TYPES:
        return
    # As TensorFlow's parameter-server guide advises: a worker whose ps is gone fails its call
    # at once instead of retrying, so the coordinator sees the failure.
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster.cluster), job_name=cluster.task_type,
        task_index=cluster.task_index, protocol="grpc", start=True,
    )
    server.join()


def ps_fit(
    model: Any,
    data: tf.data.Dataset | DatasetFn,
    epochs: int,
    *,
    steps_per_epoch: int | None = None,
    callbacks: Sequence[Any] | None = None,
    validation_data: tf.data.Dataset | DatasetFn | None = None,
    validation_steps: int | None = None,
    initial_epoch: int = 0,
    verbose: Any = "auto",
) -> keras.callbacks.History:
    """Train a Keras 3 model under `ParameterServerStrategy`, like `fit` (which cannot).

    Run it on the coordinator (the chief). Every epoch schedules `steps_per_epoch` train steps
    (`model.train_step` on one batch) on the workers, which run them asynchronously as they
    become free, then waits for them all; the epoch's logs are the compiled loss and metrics
    read from the parameter servers. Callbacks run on the coordinator: epoch hooks see the
    epoch's logs, while batch hooks run as steps are *scheduled* (with empty logs), not as they
    finish. A callback that asks to stop (`model.stop_training = True`) ends training once the
    steps already scheduled are done.

    Every worker reads its own copy of the data, repeated without end, so an epoch is a number
    of steps, not a pass over the data.

    Args:
        model: a compiled Keras 3 model built under a `tf.distribute.ParameterServerStrategy`
            scope (its `distribute_strategy`).
        data: a `tf.data.Dataset` of batches (each worker iterates over all of it, repeated), or
            a function of a `tf.distribute.InputContext` returning the dataset of one worker
            (shard or seed it with `input_context.input_pipeline_id`; it runs on the workers).
        epochs: the index of the last epoch to train (as in `fit`: with `initial_epoch`, the
            total including epochs trained before).
        steps_per_epoch: train steps per epoch; required (the per-worker data never ends).
        callbacks: Keras callbacks.
        validation_data: as `data`; evaluated at each epoch end for `validation_steps` batches,
            logged with the prefix "val_".
        validation_steps: batches per validation; required with `validation_data`.
        initial_epoch: the epoch to start at (epochs before it were trained earlier).
        verbose: 0 for silence, 1 or "auto" for a progress bar, 2 for one line per epoch.

    Returns:
        A `keras.callbacks.History` with the logs of the epochs trained.

    Raises:
        ValueError: naming the argument: a model not under a parameter-server strategy or not
            compiled, a missing `steps_per_epoch` (or `validation_steps` with
            `validation_data`), counts that are not positive integers.
    """
    strategy = _ps_strategy_of(model)
    _check_compiled(model)
    check_step_functions(model, strategy)
    epochs = integer("epochs", epochs, 1)
    steps_per_epoch = required_steps("steps_per_epoch", steps_per_epoch, "data")
    initial_epoch = integer("initial_epoch", initial_epoch, 0)
    if validation_data is not None:
        validation_steps = required_steps("validation_steps", validation_steps, "validation_data")
    train_fn = _dataset_fn("data", data)
    val_fn = _dataset_fn("validation_data", validation_data) if validation_data is not None else None
    verbose = verbosity("verbose", verbose)

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # one per strategy
    _build_model(model, strategy, train_fn)
    train_iterator = _per_worker_iterator(coordinator, strategy, train_fn)
    val_iterator = _per_worker_iterator(coordinator, strategy, val_fn) if val_fn else None
    train_step = _scheduled(strategy, model.train_step)
    test_step = _scheduled(strategy, model.test_step)

    callback_list = keras.callbacks.CallbackList(
        callbacks, add_history=True, add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=epochs, steps=steps_per_epoch,
    )
    _settle_before_preemption_saves(callback_list, coordinator)
    model.stop_training = False
    with compat.atomic_variable_increments():
        return _loop(model, coordinator, callback_list, train_step, train_iterator, test_step,
                     val_iterator, initial_epoch, epochs, steps_per_epoch, validation_steps)


def _loop(model, coordinator, callback_list, train_step, train_iterator, test_step, val_iterator,
          initial_epoch, epochs, steps_per_epoch, validation_steps) -> keras.callbacks.History:
    callback_list.on_train_begin()
    logs: dict[str, float] = {}
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callback_list.on_epoch_begin(epoch)
        for step in range(steps_per_epoch):
            callback_list.on_train_batch_begin(step)
            coordinator.schedule(train_step, args=(train_iterator,))
            if _wants_settled_state(callback_list):
                coordinator.join()  # e.g. a checkpoint about to be saved on preemption
            callback_list.on_train_batch_end(step, {})
            if model.stop_training:
                break
        coordinator.join()
        logs = _metric_logs(model)
        if val_iterator is not None:
            callback_list.on_test_begin()  # as Keras's fit: the checkpoint callback's watchdog pauses
            logs.update(_validate(model, coordinator, test_step, val_iterator, validation_steps))
            callback_list.on_test_end(logs)
        callback_list.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    callback_list.on_train_end(logs)
    return _history_of(callback_list, model)


# --------------------------------------------------------------------------------------------
# Argument checks


def _ps_strategy_of(model: Any) -> Any:
    if not isinstance(model, keras.Model):
        raise ValueError(f"model must be a Keras model, got {type(model).__name__}.")
    context = context_of(getattr(model, "distribute_strategy", None))
    if not context.is_parameter_server:
        raise ValueError(
            "model is not under a parameter-server strategy (its distribute_strategy is "
            f"{type(context.strategy).__name__}): build it inside `with strategy.scope():` of "
            'select_strategy("parameter_server") (or "auto" with ps tasks in TF_CONFIG), on the '
            "chief. For other strategies use model.fit or resume_fit."
        )
    return context.strategy


def _check_compiled(model: Any) -> None:
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
        raise ValueError("model is not compiled: call model.compile(optimizer=..., loss=...) first.")


def required_steps(name: str, value: Any, data_name: str) -> int:
    if value is None:
        raise ValueError(
            f"{name} is required for parameter-server training: every worker reads its own "
            f"copy of {data_name}, repeated without end, so an epoch is a number of steps. "
            f"Pass e.g. {name}=100."
        )
    return integer(name, value, 1)


def _dataset_fn(name: str, data: Any) -> DatasetFn:
    """A function of the InputContext giving one worker's dataset, repeated without end."""
    if isinstance(data, tf.data.Dataset):
        return lambda input_context: data.repeat()
    if callable(data):
        return lambda input_context: _as_dataset(name, data(input_context)).repeat()
    raise ValueError(
        f"{name} must be a tf.data.Dataset or a function of a tf.distribute.InputContext "
        f"returning one, got {type(data).__name__}."
    )


def _as_dataset(name: str, value: Any) -> tf.data.Dataset:
    if not isinstance(value, tf.data.Dataset):
        raise ValueError(f"{name}(input_context) must return a tf.data.Dataset, got {type(value).__name__}.")
    return value


# --------------------------------------------------------------------------------------------
# The loop's pieces


def _build_model(model: Any, strategy: Any, dataset_fn: DatasetFn) -> None:
    """Create every variable (layers, compiled metrics and loss, optimizer) on the ps before
    any step is traced: variables cannot be created inside a scheduled function."""
    sample = next(iter(dataset_fn(tf.distribute.InputContext()).take(1)))
    with strategy.scope():
        compat.symbolic_build(model, sample)


def _per_worker_iterator(coordinator: Any, strategy: Any, dataset_fn: DatasetFn) -> Any:
    per_worker = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn)
    )
    return iter(per_worker)


def _scheduled(strategy: Any, step: Callable[[Any], Any]) -> Any:
    """A tf.function that runs `step` on the next batch of a per-worker iterator."""

    def replica_step(batch: Any) -> None:
        step(batch)  # updates the variables and metrics on the ps; nothing to send back

    @tf.function
    def scheduled_step(iterator: Any) -> None:
        strategy.run(replica_step, args=(next(iterator),))

    return scheduled_step


def _validate(model: Any, coordinator: Any, test_step: Any, iterator: Any, steps: int) -> dict[str, float]:
    model.reset_metrics()  # the same metric objects serve training and evaluation
    for _ in range(steps):
        coordinator.schedule(test_step, args=(iterator,))
    coordinator.join()
    return {f"val_{name}": value for name, value in _metric_logs(model).items()}


def _metric_logs(model: Any) -> dict[str, float]:
    return {name: float(value) for name, value in model.get_metrics_result().items()}


def _settle_before_preemption_saves(callback_list: Any, coordinator: Any) -> None:
    """A SIGTERM that comes after the loop looked (in a callback's batch-end hook) still finds the
    steps in flight finished before the checkpoint callback saves."""
    from kerasdist.checkpoint import CheckpointCallback

    for callback in callback_list.callbacks:
        if isinstance(callback, CheckpointCallback):
            callback.settle = coordinator.join


def _wants_settled_state(callback_list: Any) -> bool:
    """A kerasdist CheckpointCallback that caught SIGTERM saves at this batch end: let the
    steps in flight finish first, so the checkpoint holds their updates."""
    from kerasdist.checkpoint import CheckpointCallback

    return any(isinstance(callback, CheckpointCallback) and callback.wants_settled_state()
               for callback in callback_list.callbacks)


def _history_of(callback_list: Any, model: Any) -> keras.callbacks.History:
    for callback in callback_list.callbacks:
        if isinstance(callback, keras.callbacks.History):
            return callback
    return model.history

