"""Evaluation and prediction under the model's strategy, with exactly the single-device results.

`distributed_evaluate(model, x, y)` and `distributed_predict(model, x)` (also exported as
`kerasdist.evaluate` and `kerasdist.predict`) batch in-memory data with `make_dataset` (one
pass, in order; a `tf.data.Dataset` is batched here, since make_dataset's stream of one runs on
across epoch ends) and run Keras's own `evaluate`/`predict` under the strategy the model was built in.

What Keras 3.15 gets right, and is used as is: on a finite dataset under a MirroredStrategy it
splits each global batch into contiguous per-replica slices, also a last partial one (7 rows over
2 replicas: 4 and 3; 1 row: 1 and 0), sums the metric states across replicas (accuracy and the
sample-weighted mean loss equal the single-device values) and concatenates the replicas'
predictions in order, with no padding rows.

What it gets wrong: before the first step, `TensorFlowTrainer._maybe_symbolic_build` turns the
first distributed batch into one tensor with `strategy.reduce("MEAN", batch, axis=None)`, which
fails when that batch is split unevenly (`InvalidArgumentError: Inputs to operation AddN ... must
have the same size and shape`). `import kerasdist` fixes that for every fit, evaluate and predict
(compat.apply_uneven_batch_fixes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

__all__ = ["distributed_evaluate", "distributed_predict"]


def distributed_evaluate(
    model: Any,
    x: Any,
    y: Any = None,
    *,
    sample_weight: Any = None,
    batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    callbacks: Sequence[Any] | None = None,
    verbose: Any = 0,
) -> dict[str, float]:
    """Evaluate a compiled model under its strategy: the same metrics as on one device.

    The data is batched by `make_dataset` in its own order (no shuffle, one pass) and evaluated by
    Keras under the strategy the model was built in (`model.distribute_strategy`), each global
    batch split over the replicas. The result is that of a single-device `model.evaluate(x, y,
    return_dict=True)`: losses and metrics over all samples, a last partial batch included, none
    counted twice.

    Example:

    ```python
    with kerasdist.select_strategy().scope():
        model = kerasdist.make_or_restore_model("ckpt")  # the newest checkpoint, whole
    scores = kerasdist.distributed_evaluate(model, x_test, y_test, batch_size=256)
    scores["loss"], scores["accuracy"]
    ```

    Args:
        model: a compiled Keras model, built (or restored) in a strategy's scope, or in none.
        x: features: an array, a data frame, a list or dict of arrays (as `make_dataset` takes
            them), or a finite, unbatched `tf.data.Dataset` of `(x, y)` or `(x, y, w)` elements,
            read once in its order. Files are refused: read them into a dataset.
        y: targets, for in-memory `x`; None when `x` carries them.
        sample_weight: optional per-sample weights (in-memory `x` only).
        batch_size: global batch size (all replicas together); None: 32, as Keras.
        per_replica_batch_size: instead, the batch size of one replica.
        callbacks: Keras callbacks for `evaluate`.
        verbose: Keras's verbosity: 0 (silent, the default), 1 or 2.

    Returns:
        A dict of metric name to value (floats), as `model.evaluate(..., return_dict=True)`.
    """
    _check_model(model, "distributed_evaluate", needs_compile=True)
    dataset = _one_pass(model, x, y, sample_weight, batch_size, per_replica_batch_size)
    logs = model.evaluate(dataset, callbacks=callbacks, verbose=verbose, return_dict=True)
    return {name: float(value) for name, value in logs.items()}


def distributed_predict(
    model: Any,
    x: Any,
    *,
    batch_size: int | None = None,
    per_replica_batch_size: int | None = None,
    callbacks: Sequence[Any] | None = None,
    verbose: Any = 0,
) -> Any:
    """Predict under the model's strategy: one row per sample of `x`, in the order of `x`.

    Example:

    ```python
    with kerasdist.select_strategy().scope():
        model = kerasdist.make_or_restore_model("ckpt")
    probabilities = kerasdist.distributed_predict(model, x_new, batch_size=256)
    ```

    Args:
        model: a Keras model, built (or restored) in a strategy's scope, or in none.
        x: features: an array, a data frame, a list or dict of arrays, or a finite, unbatched
            `tf.data.Dataset` whose elements are `x` or `(x, y[, w])` (the targets are
            dropped).
        batch_size: global batch size (all replicas together); None: 32, as Keras.
        per_replica_batch_size: instead, the batch size of one replica.
        callbacks: Keras callbacks for `predict`.
        verbose: Keras's verbosity: 0 (silent, the default), 1 or 2.

    Returns:
        What `model.predict(x)` returns on one device: a NumPy array with one row per sample (a
        list or dict of them for a multi-output model), no padding rows.
    """
    _check_model(model, "distributed_predict", needs_compile=False)
    dataset = _one_pass(model, x, None, None, batch_size, per_replica_batch_size)
    dataset = dataset.map(_features_only)
    return model.predict(dataset, callbacks=callbacks, verbose=verbose)


def _check_model(model: Any, caller: str, needs_compile: bool) -> None:
    import tensorflow as tf

    if not isinstance(model, keras.Model):
        raise ValueError(f"{caller}: model must be a Keras model, got {type(model).__name__}.")
    if needs_compile and not getattr(model, "compiled", False):
        raise ValueError(
            f"{caller}: the model is not compiled; compile it with a loss and metrics first "
            "(a model restored from a checkpoint keeps its compile arguments)."
        )
    if isinstance(model.distribute_strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise ValueError(
            f"{caller}: Keras 3 cannot evaluate or predict under a ParameterServerStrategy "
            "(keras-team/keras#18624); restore the model without a strategy, or under a mirrored one."
        )


def _one_pass(model, x, y, sample_weight, batch_size, per_replica_batch_size):
    """One pass over the data in its order, in global batches, the last one partial."""
    import os

    import tensorflow as tf

    from kerasdist.data import batch_size_info, make_dataset

    strategy = model.distribute_strategy
    if isinstance(x, (str, os.PathLike)) or (
        isinstance(x, (list, tuple)) and x and all(isinstance(p, (str, os.PathLike)) for p in x)
    ):
        raise ValueError(
            "x is a file pattern: make_dataset's file pipelines interleave the files and run on "
            "across epoch ends (they are made for training), so rows would be out of order or "
            "counted twice. Read the files into an unbatched tf.data.Dataset, in the order you "
            "want, and pass that."
        )
    if isinstance(x, tf.data.Dataset):
        # make_dataset's stream of a dataset runs on across epochs too: one pass is batched here.
        if y is not None or sample_weight is not None:
            raise ValueError("y and sample_weight cannot be given with a tf.data.Dataset x: put them in its elements.")
        if x.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise ValueError("x is an infinite tf.data.Dataset: give one pass over the data (no repeat()).")
        size = batch_size_info(batch_size, per_replica_batch_size, strategy=strategy).batch_size
        options = tf.data.Options()
        options.deterministic = True
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        return x.batch(size).prefetch(tf.data.AUTOTUNE).with_options(options)
    return make_dataset(
        x, y, sample_weight=sample_weight, batch_size=batch_size,
        per_replica_batch_size=per_replica_batch_size, strategy=strategy, shuffle=False, epochs=1,
    )


def _features_only(*element):
    """A batch of x, (x,) or (x, y[, w]) -> x (a dataset given to predict may carry labels)."""
    return element[0]
