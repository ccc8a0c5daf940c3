"""Keras's training under tf.distribute strategies, patched where Keras 3 fails (each patch gated
on the Keras versions that need it, applied at `import kerasdist`, lifted for a block by
`keras_as_released()`):
- `fit` under MultiWorkerMirroredStrategy (keras#20585, tensorflow#72388): the symbolic build
  and the reduction of scalar losses and metrics;
- a global batch split unevenly over a mirrored strategy's replicas: the symbolic build and the
  weighting of each replica's loss by its rows;
- keras#23085: optimizer variables made inside a user's traced `strategy.run` step.
Why each is needed and its canary test: docs/upstream.md, "How each workaround works".

Also what kerasdist reads of a model's training that Keras keeps private, each with a canary in
tests/python/test_compat.py: its layers at every depth (`layers_within`), the functions
`compile()` was given (`compiled_metrics`, `wrapped_function`), the optimizer's batch counter
(`optimizer_batch_counter`) and the build of every variable from one batch (`symbolic_build`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import optimizer as tf_optimizer
from keras.src.backend.tensorflow import trainer as tf_trainer
from keras.src.losses import loss as loss_module

from kerasdist.compat.versions import version_within

# Keras releases whose multi-worker fit needs the patches (3.15.1 checked; 3.16 unknown yet).
MULTI_WORKER_FIX_VERSIONS = ((3, 0), (3, 16))

# Keras's TensorFlow trainer class: TensorFlowTrainer up to 3.15, Trainer in 3.16.0.dev (a rename
# that would otherwise break `import kerasdist` on the next Keras; make upstream-check found it).
TRAINER = getattr(tf_trainer, "TensorFlowTrainer", None) or tf_trainer.Trainer
_applied = False
_original_reduce_per_replica = tf_trainer.reduce_per_replica
_original_symbolic_build = TRAINER._maybe_symbolic_build


def keras_needs_multi_worker_fixes(version: str = keras.__version__) -> bool:
    """Whether this Keras version's multi-worker fit is known to need the patches."""
    return version_within(version, MULTI_WORKER_FIX_VERSIONS)


def apply_multi_worker_fixes(force: bool = False) -> bool:
    """Patch Keras's multi-worker fit if this Keras needs it (or `force`); idempotent. Returns
    whether the patches are in place."""
    global _applied
    if not _applied and (force or keras_needs_multi_worker_fixes()):
        _set_attributes({(tf_trainer, "reduce_per_replica"): _reduce_per_replica,
                         (TRAINER, "_maybe_symbolic_build"): _maybe_symbolic_build})
        _applied = True
    return _applied


def remove_multi_worker_fixes() -> None:
    """Undo `apply_multi_worker_fixes` (for tests that check upstream behaviour)."""
    global _applied
    _set_attributes({(tf_trainer, "reduce_per_replica"): _original_reduce_per_replica})
    _applied = False
    _restore_symbolic_build_if_unused()


def _restore_symbolic_build_if_unused() -> None:
    if not _applied and not _uneven_applied:
        TRAINER._maybe_symbolic_build = _original_symbolic_build


def _set_attributes(values: dict[tuple[Any, str], Any]) -> None:
    """Set each (owner, attribute name) of `values` to its value: a patch put in place or undone."""
    for (owner, name), value in values.items():
        setattr(owner, name, value)


def is_multi_worker(strategy: Any) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and bool(
        getattr(strategy.extended, "_in_multi_worker_mode", lambda: False)()
    )


def _reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
    if not is_multi_worker(strategy) or reduction not in ("auto", "mean"):
        return _original_reduce_per_replica(values, strategy, reduction)

    def reduce_one(value: Any) -> Any:
        if isinstance(value, tf.distribute.DistributedValues) or tf.is_tensor(value):
            rank = value.values[0].shape.rank if hasattr(value, "values") else value.shape.rank
            return strategy.reduce("MEAN", value, axis=None if rank == 0 else 0)
        return value

    return tf.nest.map_structure(reduce_one, values)


def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
    """Build from this process's replicas' slices of the first batch, concatenated (the build
    needs only shapes and dtypes), instead of Keras's cross-replica MEAN of it."""
    strategy = self._distribute_strategy
    local = _uneven_applied or (_applied and is_multi_worker(strategy))
    if strategy is None or iterator is None or not local:
        return _original_symbolic_build(self, iterator=iterator, data_batch=data_batch)
    for _, _, batches in iterator:
        data_batch = local_batch(strategy, next(batches))
        break
    with strategy.scope():
        self._symbolic_build(data_batch=data_batch)


def local_batch(strategy: Any, batch: Any) -> Any:
    """A distributed batch as one batch of this process: its replicas' slices, concatenated."""
    def concat(value: Any) -> Any:
        if isinstance(value, tf.distribute.DistributedValues):
            return tf.concat(strategy.experimental_local_results(value), axis=0)
        return value

    return tf.nest.map_structure(concat, batch)


# Keras releases whose fit, evaluate and predict under a mirrored strategy fail on a global batch
# split unevenly over the replicas, and weight such a split wrongly (3.15.1 checked).
UNEVEN_BATCH_FIX_VERSIONS = ((3, 0), (3, 16))
_uneven_applied = False
_original_compute_loss = TRAINER.compute_loss
_original_scale_loss = loss_module.scale_loss_for_distribution
_original_unscale_loss = loss_module.unscale_loss_for_distribution
_replica_share = threading.local()


def keras_needs_uneven_batch_fixes(version: str = keras.__version__) -> bool:
    """Whether this Keras version is known to mishandle a batch split unevenly over replicas."""
    return version_within(version, UNEVEN_BATCH_FIX_VERSIONS)


def apply_uneven_batch_fixes(force: bool = False) -> bool:
    """Make Keras's fit/evaluate/predict take a global batch that does not split evenly over a
    mirrored strategy's replicas (64 over 3, or a last partial batch), with the single-device
    result; idempotent. `force`: whatever the version. Returns whether the patches are in place."""
    global _uneven_applied
    if not _uneven_applied and (force or keras_needs_uneven_batch_fixes()):
        _set_attributes({(TRAINER, "_maybe_symbolic_build"): _maybe_symbolic_build,
                         (TRAINER, "compute_loss"): _compute_loss,
                         (loss_module, "scale_loss_for_distribution"): _scale_loss,
                         (loss_module, "unscale_loss_for_distribution"): _unscale_loss})
        _uneven_applied = True
    return _uneven_applied


def remove_uneven_batch_fixes() -> None:
    """Undo `apply_uneven_batch_fixes` (for tests that check upstream behaviour)."""
    global _uneven_applied
    _set_attributes({(TRAINER, "compute_loss"): _original_compute_loss,
                     (loss_module, "scale_loss_for_distribution"): _original_scale_loss,
                     (loss_module, "unscale_loss_for_distribution"): _original_unscale_loss})
    _uneven_applied = False
    _restore_symbolic_build_if_unused()


def _compute_loss(self: Any, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                  training: bool = True) -> Any:
    """Keras's `compute_loss` (where every loss it scales for distribution is made), with this
    replica's share of the global batch's rows known to that scaling while the step is traced.
    A model whose own `compute_loss` never calls this one keeps Keras's 1/replicas."""
    _replica_share.value = _rows_share(x)
    return _original_compute_loss(self, x, y, y_pred, sample_weight, training=training)


def _rows_share(x: Any) -> Any:
    """rows of this replica / rows of all replicas, inside a mirrored strategy's replica
    function; None elsewhere (one replica, the symbolic build, another strategy)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync < 2:
        return None
    if not isinstance(context.strategy, (tf.distribute.MirroredStrategy,
                                         tf.distribute.MultiWorkerMirroredStrategy)):
        return None
    first = next((value for value in tf.nest.flatten(x) if value is not None), None)
    if first is None or not tf.is_tensor(first):
        return None
    rows = tf.cast(tf.shape(first)[0], tf.float32)
    return tf.math.divide_no_nan(rows, context.all_reduce("SUM", rows))


def _current_share() -> Any:
    """The share `_compute_loss` recorded for the step being traced (or run eagerly) by this
    replica's thread, if any."""
    share = getattr(_replica_share, "value", None)
    in_graph = share is not None and hasattr(share, "graph")  # an eager tensor has no graph
    if share is None or tf.executing_eagerly() == in_graph:
        return None
    return None if in_graph and share.graph is not tf.compat.v1.get_default_graph() else share


def _scale_loss(value: Any) -> Any:
    """A replica's mean loss times its share of the rows, where Keras multiplies by
    1/replicas: summed over the replicas, the mean over the global batch, also when the replicas
    have different numbers of rows."""
    share = _current_share()
    if share is None:
        return _original_scale_loss(value)
    return value * tf.cast(share, value.dtype)


def _unscale_loss(value: Any) -> Any:
    share = _current_share()
    if share is None:
        return _original_unscale_loss(value)
    return tf.math.divide_no_nan(value, tf.cast(share, value.dtype))  # a replica with 0 rows: 0


# Keras releases whose TensorFlow optimizers create their variables (Adam's moments, SGD's
# momentum) where the first `apply_gradients` runs: inside the user's traced step under
# `strategy.run` that fails on TensorFlow 2.21 (keras-team/keras#23085; fixed by keras#23087,
# after 3.15.1).
OPTIMIZER_VARIABLES_FIX_VERSIONS = ((3, 0), (3, 16))
_optimizer_applied = False
_original_add_variable = tf_optimizer.TFOptimizer.add_variable


def keras_needs_optimizer_variables_fix(version: str = keras.__version__) -> bool:
    return version_within(version, OPTIMIZER_VARIABLES_FIX_VERSIONS)


def apply_optimizer_variables_fix(force: bool = False) -> bool:
    """Create TensorFlow optimizer variables outside the function being traced, as keras#23087
    does; idempotent. `force`: whatever the version. Returns whether the patch is in place."""
    global _optimizer_applied
    if not _optimizer_applied and (force or keras_needs_optimizer_variables_fix()):
        tf_optimizer.TFOptimizer.add_variable = _add_variable
        _optimizer_applied = True
    return _optimizer_applied


def remove_optimizer_variables_fix() -> None:
    """Undo `apply_optimizer_variables_fix` (for tests that check upstream behaviour)."""
    global _optimizer_applied
    tf_optimizer.TFOptimizer.add_variable = _original_add_variable
    _optimizer_applied = False


@functools.wraps(_original_add_variable)
def _add_variable(self: Any, *args: Any, **kwargs: Any) -> Any:
    with tf.init_scope():
        return _original_add_variable(self, *args, **kwargs)


def apply_keras_fixes(force: bool = False) -> None:
    """Every Keras patch above that this Keras needs (what `import kerasdist` does); `force`: all
    of them, whatever the version (make upstream-check tries them on the next Keras so)."""
    apply_multi_worker_fixes(force)
    apply_uneven_batch_fixes(force)
    apply_optimizer_variables_fix(force)


def remove_keras_fixes() -> None:
    """Keras as released, for tests that check upstream behaviour."""
    remove_multi_worker_fixes()
    remove_uneven_batch_fixes()
    remove_optimizer_variables_fix()


@contextlib.contextmanager
def keras_as_released() -> Iterator[None]:
    """Within the block, Keras without kerasdist's patches (the canaries run the reporters'
    code so); the patches that were in place come back after it."""
    applied = (_applied, _uneven_applied, _optimizer_applied)
    remove_keras_fixes()
    try:
        yield
    finally:
        remove_keras_fixes()  # also what the block put in place
        for was_applied, apply in zip(applied, (apply_multi_worker_fixes, apply_uneven_batch_fixes,
                                                apply_optimizer_variables_fix), strict=True):
            if was_applied:
                apply(force=True)  # as it was, whatever the version



# -- what kerasdist reads of a model's training that Keras keeps private ----------------------------

def layers_within(model: Any, include_self: bool = True) -> list[Any]:
    """Every layer of `model` at every depth (nested models' layers too), in Keras's order; [] for
    an object that is not a Keras layer."""
    flatten = getattr(model, "_flatten_layers", None)
    return list(flatten(include_self=include_self, recursive=True)) if flatten else []


def compiled_metrics(model: Any) -> tuple[Any, Any]:
    """The `metrics` and `weighted_metrics` `model.compile()` was given, as given (None when none
    were, or the model is not compiled)."""
    compiled = getattr(model, "_compile_metrics", None)
    return getattr(compiled, "_user_metrics", None), getattr(compiled, "_user_weighted_metrics", None)


def wrapped_function(loss_or_metric: Any) -> Any:
    """The function a Keras loss or metric made from a function calls (LossFunctionWrapper's `fn`,
    MeanMetricWrapper's `_fn`), or None."""
    return getattr(loss_or_metric, "fn", None) or getattr(loss_or_metric, "_fn", None)


def optimizer_batch_counter(optimizer: Any) -> Any:
    """The optimizer's count of the batches it was given (a variable): under gradient accumulation
    `optimizer.iterations` counts applied updates, this one every batch; without it the two are equal."""
    counter = getattr(optimizer, "_iterations", None)
    return counter if counter is not None else optimizer.iterations


def symbolic_build(model: Any, batch: Any) -> None:
    """Create every variable of a compiled model (its layers', its compiled metrics' and loss's,
    its optimizer's) from one batch's shapes, without a training step: what Keras's `fit` does first."""
    model._symbolic_build(data_batch=batch)
