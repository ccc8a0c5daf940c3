# Evaluation and prediction under a strategy: thin wrappers over python/kerasdist/evaluation.py
# (scaled_loss() is in loss_scaling.R). The R names are
# distributed_evaluate() and distributed_predict(), like distributed_fit(): plain evaluate() and
# predict() would mask keras3's generics.

# r-docs: python/kerasdist/evaluation.py:distributed_evaluate (make r-docs)
#' Evaluate a model under its strategy, with the single-device results
#'
#' The data is batched by [make_dataset()] in its own order (no shuffle, one pass) and evaluated by
#' Keras under the strategy the model was built in (`model.distribute_strategy`), each global batch
#' split over the replicas. The result is that of a single-device
#' `model.evaluate(x, y, return_dict=TRUE)`: losses and metrics over all samples, a last partial
#' batch included, none counted twice.
#'
#' keras3's own `evaluate()` on the same model, with Keras 3.15 as released, fails when the first
#' batch splits unevenly over the replicas (a batch size not divisible by them, or fewer samples
#' than the batch size): an upstream Keras bug that `library(kerasdist)` fixes for keras3's `fit()`,
#' `evaluate()` and `predict()` too.
#'
#' @param model A compiled Keras model, built (or restored) in a strategy's scope, or in none.
#' @param x Features: a numeric matrix or array (first index = sample), a numeric vector, a data
#'   frame, a list of them (several inputs), or a finite, unbatched `tf.data.Dataset` of `(x, y)` or
#'   `(x, y, w)` elements. File patterns are refused (read them into a dataset first).
#' @param y Targets, for in-memory `x`; `NULL` when `x` carries them.
#' @param sample_weight Optional per-sample weights (in-memory `x` only).
#' @param batch_size Global batch size (all replicas together); `NULL`: 32, as Keras.
#' @param per_replica_batch_size Instead, the batch size of one replica.
#' @param callbacks A keras3 callback or a list of them.
#' @param verbose Keras's verbosity: 0 (silent, the default), 1 or 2.
#' @returns A named list of metric values (numbers), as keras3's `evaluate()` returns.
#' @family evaluation
#' @seealso Python: `kerasdist.distributed_evaluate()` (also
#'   `kerasdist.evaluate()`); [distributed_predict()].
#' @examples
#' \dontrun{
#' simulate_devices(2)  # before keras3 touches Python
#' library(keras3)
#' strategy <- select_strategy()
#' with(strategy$scope(), model <- make_or_restore_model("ckpt"))
#' scores <- distributed_evaluate(model, x_test, y_test, batch_size = 256)
#' scores$accuracy
#' }
#' @export
distributed_evaluate <- function(model, x, y = NULL, sample_weight = NULL, batch_size = NULL,
                                 per_replica_batch_size = NULL, callbacks = NULL, verbose = 0) {
  result <- call_python(
    kerasdist_module()$distributed_evaluate, model, x = x, y = y,
    sample_weight = sample_weight, batch_size = batch_size,
    per_replica_batch_size = per_replica_batch_size,
    callbacks = callbacks, verbose = verbose
  )
  lapply(result, as.numeric)
}

# r-docs: python/kerasdist/evaluation.py:distributed_predict (make r-docs)
#' Predict under a model's strategy, one row per sample in the order of x
#'
#' @inheritParams distributed_evaluate
#' @param model A Keras model, built (or restored) in a strategy's scope, or in none.
#' @param x Features: a numeric matrix or array (first index = sample), a numeric vector, a data
#'   frame, a list of them (several inputs), or a finite, unbatched `tf.data.Dataset` whose elements
#'   are `x` or `(x, y[, w])` (the targets are dropped).
#' @returns An R matrix or array with one row per sample (a list of them for a model with several
#'   outputs).
#' @family evaluation
#' @seealso Python: `kerasdist.distributed_predict()` (also
#'   `kerasdist.predict()`); [distributed_evaluate()].
#' @examples
#' \dontrun{
#' with(select_strategy()$scope(), model <- make_or_restore_model("ckpt"))
#' probabilities <- distributed_predict(model, x_new, batch_size = 256)
#' max.col(probabilities)  # predicted class (1-based) of each row of x_new
#' }
#' @export
distributed_predict <- function(model, x, batch_size = NULL, per_replica_batch_size = NULL,
                                callbacks = NULL, verbose = 0) {
  call_python(
    kerasdist_module()$distributed_predict, model, x = x,
    batch_size = batch_size, per_replica_batch_size = per_replica_batch_size,
    callbacks = callbacks, verbose = verbose
  )
}
