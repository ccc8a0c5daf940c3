# Resuming fit: thin wrapper over python/kerasdist/fit.py.

#' Fit to a total number of epochs, continuing from the newest checkpoint
#'
#' A run restarted after a crash continues at the next unseen batch of the
#' interrupted epoch, so with seeded data and TensorFlow op determinism it ends
#' with the same weights, bit for bit, as an uninterrupted run.
#'
#' @param model A compiled Keras model, usually from [make_or_restore_model()].
#' @param data A `tf.data.Dataset` of batches that is the same every epoch, or a
#'   function of the (0-based) epoch returning that epoch's batches.
#' @param epochs Total number of epochs, counting those done by earlier runs.
#' @param checkpoint A [checkpoint_callback()], or a directory for one.
#' @param steps_per_epoch Batches per epoch when the dataset cannot tell.
#' @param callbacks A list of more Keras callbacks.
#' @param validation_data Passed to `fit`.
#' @param validation_steps Passed to `fit`; required with `validation_data`
#'   under a parameter-server strategy.
#' @param verbose Passed to `fit`.
#' @returns A Keras `History` covering all epochs, earlier runs included.
#' @family checkpoint
#' @seealso Python: `kerasdist.resume_fit()`.
#' @examples
#' \dontrun{
#' history <- resume_fit(model, dataset, epochs = 10L, checkpoint = checkpoint_callback("ckpt"))
#' }
#' @export
resume_fit <- function(model, data, epochs, checkpoint, steps_per_epoch = NULL, callbacks = NULL,
                       validation_data = NULL, validation_steps = NULL, verbose = "auto") {
  epoch_data <- data
  if (is.function(data)) {
    r_data <- data
    epoch_data <- function(epoch) r_data(as.integer(epoch))
  }
  call_python(
    kerasdist_module()$resume_fit, model, epoch_data, as_py_int(epochs), checkpoint,
    steps_per_epoch = as_py_int(steps_per_epoch), callbacks = as_py_callbacks(callbacks),
    validation_data = validation_data, validation_steps = as_py_int(validation_steps),
    verbose = as_py_int(verbose)
  )
}
