"""The loss a custom training step should differentiate under a `tf.distribute` strategy.

Under `strategy.run` every replica computes a loss on its share of the global batch, and the
strategy *sums* the replicas' gradients. So each replica's loss must be its share of the global
mean: the sum of its per-example losses divided by the *global* batch size, plus its share of the
regularization losses. `scaled_loss` does exactly that.

What TensorFlow's own helpers get wrong here (TensorFlow 2.21):

- `tf.nn.compute_average_loss` without `global_batch_size` takes the global batch as
  `per_replica_batch * replicas`. A last, partial batch is split unevenly (7 rows over 2 replicas
  are 4 and 3; 1 row is 1 and 0), so each replica divides by its own size times 2 and the
  gradient is off. `scaled_loss` counts the rows of all replicas with a cross-replica sum.
- It sums every element of a multi-dimensional per-example loss (a per-timestep or per-pixel
  loss) where Keras losses average the non-batch axes; `scaled_loss` averages them.
- It accepts an already reduced (scalar) loss only to fail deep inside with a shape error, and a
  mean loss divided once more by the batch trains with a learning rate scaled down by the batch
  size. `scaled_loss` refuses it and says why.
- `tf.nn.scale_regularization_loss` divides the model's losses by the replicas. That is right for
  weight regularization, but Keras 3 divides an activity regularizer's loss by the rows of the
  replica's own batch, so on an uneven split the replicas' shares no longer add up to the
  single-device term. `scaled_loss` weights the model's losses by the replica's share of the
  rows (rows / global rows): 1/replicas on an even split, exact on an uneven one for both kinds.
"""

from __future__ import annotations

from typing import Any

from kerasdist.validation import integer

__all__ = ["scaled_loss"]


def scaled_loss(
    per_example_loss: Any,
    global_batch_size: Any = None,
    sample_weight: Any = None,
    model: Any = None,
) -> Any:
    """This replica's share of the mean loss over the global batch, ready for `tape.gradient`.

    Call it inside the step function that `strategy.run` runs (or a Keras `train_step`). The
    gradients of the returned loss, summed over the replicas (what the strategy and the optimizer
    do), equal the gradients of the mean loss over the whole global batch on one device: also
    when the last batch is smaller and the replicas get different numbers of rows, and with
    regularization.

    Example:

    ```python
    strategy = kerasdist.select_strategy()

    def step(x, y):
        with tf.GradientTape() as tape:
            per_example = keras.losses.mean_squared_error(y, model(x, training=True))
            loss = kerasdist.scaled_loss(per_example, model=model)
        grads = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply(grads, model.trainable_variables)
        return loss

    for x, y in strategy.experimental_distribute_dataset(dataset):
        strategy.run(step, args=(x, y))
    ```

    Args:
        per_example_loss: the loss of each example of this replica's batch, a tensor whose first
            axis is the batch (shape `[batch]`, or `[batch, ...]`: the other axes are averaged
            per example, as Keras losses do). A scalar (an already averaged loss) is refused.
        global_batch_size: the number of examples in the global batch (all replicas together),
            an integer or a scalar tensor. Default: the rows of every replica's
            `per_example_loss`, summed across the replicas (so a partial last batch counts right).
        sample_weight: optional weights, broadcastable to `per_example_loss` from the batch axis
            on (shape `[batch]` weights each example). The weighted sum is divided by the number
            of examples, not by the sum of the weights, as Keras's default loss reduction does.
        model: a Keras model whose `losses` (regularization and `add_loss` terms of its last
            call) are added, weighted by this replica's share of the global batch's rows (so
            1/replicas when the batch splits evenly). Call `scaled_loss` right after the forward
            pass, before anything else synchronizes the replicas: they share the model's lists
            of losses, and the next replica's forward pass replaces them.

    Returns:
        A scalar tensor of the dtype of `per_example_loss`.
    """
    import tensorflow as tf

    # model.losses first: the replicas' threads share the layers' loss lists, and the cross-replica
    # sum below lets the other replicas run their forward pass (which replaces those lists).
    model_losses = list(model.losses) if model is not None else []
    loss = tf.convert_to_tensor(per_example_loss)
    if loss.shape.rank == 0:
        raise ValueError(
            "per_example_loss is a scalar: it is already reduced, and dividing a mean by the "
            "global batch again would shrink the gradient by the batch size. Pass one loss per "
            "example, e.g. keras.losses.mean_squared_error(y, y_pred) or a loss object built "
            "with reduction=None."
        )
    if loss.shape.rank is None:
        raise ValueError("per_example_loss has an unknown rank; it needs a batch axis first.")
    if global_batch_size is not None:
        _check_batch_size(global_batch_size)
    if not loss.dtype.is_floating:
        loss = tf.cast(loss, tf.float32)
    context = _replica_context()
    if sample_weight is not None:
        loss = loss * _broadcast_weight(tf.cast(sample_weight, loss.dtype), loss.shape.rank)
    if loss.shape.rank > 1:
        loss = tf.reduce_mean(loss, axis=list(range(1, loss.shape.rank)))
    rows = tf.cast(tf.shape(loss)[0], loss.dtype)
    all_rows = context.all_reduce("SUM", rows) if context.num_replicas_in_sync > 1 else rows
    divisor = all_rows if global_batch_size is None else tf.cast(global_batch_size, loss.dtype)
    total = tf.math.divide_no_nan(tf.reduce_sum(loss), divisor)
    if model_losses:
        # This replica's share rows/all_rows: 1/replicas on an even split, and exact on an uneven
        # one also for Keras's activity regularizers, which are means over the replica's rows.
        share = tf.math.divide_no_nan(rows, all_rows)
        total += share * tf.add_n([tf.cast(term, loss.dtype) for term in model_losses])
    return total


def _replica_context() -> Any:
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None:
        raise ValueError(
            "scaled_loss is called in a cross-replica context (inside strategy.scope() but not "
            "in strategy.run): call it in the step function that strategy.run runs, where "
            "per_example_loss is one replica's share of the batch."
        )
    return context


def _broadcast_weight(weight: Any, rank: int) -> Any:
    import tensorflow as tf

    if weight.shape.rank is None or weight.shape.rank > rank:
        raise ValueError(
            f"sample_weight has rank {weight.shape.rank}, more than per_example_loss ({rank})."
        )
    for _ in range(rank - weight.shape.rank):
        weight = tf.expand_dims(weight, -1)
    return weight


def _check_batch_size(value: Any) -> None:
    import tensorflow as tf

    if tf.is_tensor(value):
        return
    integer("global_batch_size", value, 1)
