# Resuming fit: thin wrapper over python/kerasdist/training/resume.py.

# r-docs: python/kerasdist/training/resume.py:resume_fit (make r-docs)
#' Fit to a total number of epochs, continuing from the newest checkpoint
#'
#' A run restarted after a crash continues at the next unseen batch of the interrupted epoch (not at
#' the epoch start), so with seeded data and TensorFlow op determinism it ends with the same
#' weights, bit for bit, as a run that was never interrupted.
#'
#' Under a `tf.distribute.ParameterServerStrategy` (the model built in its scope, on the chief)
#' training runs through [ps_fit()], since Keras 3 `fit` cannot: `steps_per_epoch` is then required,
#' `data` (and `validation_data`) is a dataset or a function of a `tf.distribute.InputContext` as
#' [ps_fit()] takes, checkpoints are written at epoch ends by the coordinator (`every_steps` and
#' `every_seconds` are refused: steps run asynchronously on the workers), and a run stopped
#' mid-epoch by SIGTERM resumes with the steps that epoch had left.
#'
#' The model comes first, so it pipes like keras3's `fit()`:
#' `model |> resume_fit(data, epochs = 10)`; a model from [make_or_restore_model()] remembers its
#' checkpoint directory, so `checkpoint` can be left out.
#'
#' @param model A compiled Keras model, usually from [make_or_restore_model()]. A model made
#'   elsewhere takes the newest valid checkpoint of `checkpoint`'s store first (as
#'   [make_or_restore_model()] would load it), so training goes on from that state.
#' @param data Batches as keras3's `fit()` takes them: a batched `tf.data.Dataset` (tfdatasets'
#'   `dataset_batch()`, keras3's `image_dataset_from_directory()`; its passes are the epochs,
#'   reshuffled as its `dataset_shuffle()` says), a Python `keras.utils.PyDataset`, or a Python
#'   generator (with `steps_per_epoch`), read one batch per step with its position kept in each
#'   checkpoint ([resume_rule()] says how a resume continues it); a [make_dataset()] dataset; or a
#'   function of the (0-based) epoch returning that epoch's batches.
#' @param epochs Total number of epochs, counting those done by earlier runs.
#' @param checkpoint A [checkpoint_callback()], or a directory for one with the defaults; `NULL` for
#'   the directory the model was made or restored from by [make_or_restore_model()].
#' @param steps_per_epoch Batches per epoch, when the data cannot tell (a generator; a dataset of
#'   unknown cardinality is otherwise counted once, by a pass over it).
#' @param callbacks A Keras callback or a list of them (keras3's `callback_*()` included).
#' @param validation_data Passed to `fit`.
#' @param validation_steps Passed to `fit`; required with `validation_data` under a parameter-server
#'   strategy.
#' @param verbose Passed to `fit`.
#' @returns The training history of all epochs, earlier runs included, invisibly, as keras3's
#'   `fit()` returns it: a `keras_training_history` (`plot(history)`, `as.data.frame(history)`,
#'   `history$metrics$loss`).
#' @section Preemption: On SIGTERM the checkpoint callback saves at the next
#'   step and stops training. Under Rscript the process then exits with
#'   status 75, as Python does, so a launcher or cluster manager restarts it;
#'   in an interactive session (or with `options(kerasdist.exit_on_preemption
#'   = FALSE)`) `resume_fit()` stops with a condition of class
#'   `kerasdist_preempted` whose `checkpoint` is the path (or URL) just saved and
#'   `global_step` its step.
#' @section A lost peer: When another worker of a multi-worker cluster
#'   disappears mid-fit (its process killed, its host down), TensorFlow's
#'   all-reduce fails; `resume_fit()` then stops without saving (the newest
#'   checkpoint is intact) and, under Rscript, the process exits with status
#'   76; interactively (or with the option above) it stops with a condition
#'   of class `kerasdist_peer_lost` whose `peer` names the lost task (e.g.
#'   `"worker:1"`).
#' @family checkpoint
#' @seealso Python: `kerasdist.resume_fit()`.
#' @examples
#' \dontrun{
#' library(keras3)
#' model <- make_or_restore_model("ckpt", function() {
#'   keras_model_sequential(input_shape = 4) |>
#'     layer_dense(1) |>
#'     compile(optimizer = "adam", loss = "mse")
#' })
#' x <- matrix(rnorm(400), ncol = 4)
#' history <- model |> resume_fit(make_dataset(x, rowSums(x), batch_size = 20, epochs = 1),
#'                                epochs = 5)
#' plot(history)
#' }
#' @export
resume_fit <- function(model, data, epochs, checkpoint = NULL, steps_per_epoch = NULL, callbacks = NULL,
                       validation_data = NULL, validation_steps = NULL, verbose = "auto") {
  epoch_data <- data
  if (is_r_function(data)) {
    r_data <- data
    epoch_data <- function(epoch) r_data(as.integer(epoch))
  }
  history <- call_python(
    kerasdist_module()$resume_fit, model, epoch_data, epochs = epochs, checkpoint = checkpoint,
    steps_per_epoch = steps_per_epoch, callbacks = callbacks,
    validation_data = validation_data, validation_steps = validation_steps, verbose = verbose
  )
  invisible(as_training_history(history))
}
