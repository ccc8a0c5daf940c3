# Parameter-server training: thin wrapper over python/kerasdist/training/ps.py.

# r-docs: python/kerasdist/training/ps.py:ps_fit (make r-docs)
#' Train a Keras 3 model under `ParameterServerStrategy`, like `fit` (which cannot)
#'
#' Run it on the coordinator (the chief). Every epoch schedules `steps_per_epoch` train steps
#' (`model.train_step` on one batch) on the workers, which run them asynchronously as they become
#' free, then waits for them all; the epoch's logs are the compiled loss and metrics read from the
#' parameter servers. Callbacks run on the coordinator: epoch hooks see the epoch's logs, while
#' batch hooks run as steps are *scheduled* (with empty logs), not as they finish. A callback that
#' asks to stop (`model.stop_training = TRUE`) ends training once the steps already scheduled are
#' done.
#'
#' Every worker reads its own copy of the data, repeated without end, so an epoch is a number of
#' steps, not a pass over the data.
#'
#' From R: the worker and ps tasks run no training code: start them with [run_server()] (one script
#' can call it first and then train; [launch()] with `num_ps = 1` runs it as a local cluster). The
#' chief's model is built inside the scope of [select_strategy()]'s `"parameter_server"` strategy
#' (what `"auto"` picks when `TF_CONFIG` has `"ps"` tasks). [resume_fit()] uses `ps_fit()` under a
#' parameter-server strategy, adding checkpoints and resume.
#'
#' @param model A compiled Keras 3 model built under a `tf.distribute.ParameterServerStrategy` scope
#'   (its `distribute_strategy`).
#' @param data A `tf.data.Dataset` of batches (each worker iterates over all of it, repeated), or a
#'   function of a `tf.distribute.InputContext` returning the dataset of one worker (shard or seed
#'   it with `input_context$input_pipeline_id`; it runs on the workers).
#' @param epochs The index of the last epoch to train (as in `fit`: with `initial_epoch`, the total
#'   including epochs trained before).
#' @param steps_per_epoch Train steps per epoch; required (the per-worker data never ends).
#' @param callbacks A Keras callback or a list of them.
#' @param validation_data As `data`; evaluated at each epoch end for `validation_steps` batches,
#'   logged with the prefix "val_".
#' @param validation_steps Batches per validation; required with `validation_data`.
#' @param initial_epoch The (0-based) epoch to start at.
#' @param verbose 0 for silence, 1 or "auto" for a progress bar, 2 for one line per epoch.
#' @returns The history of the epochs trained, invisibly, as keras3's `fit()` returns it: a
#'   `keras_training_history` (`plot(history)`, `as.data.frame(history)`; `history$metrics$loss`).
#' @family training
#' @seealso Python: `kerasdist.ps_fit()`; [run_server()], [launch()],
#'   [resume_fit()], [select_strategy()].
#' @examples
#' \dontrun{
#' # train.R, run by launch("train.R", num_workers = 2, num_ps = 1)
#' library(kerasdist)
#' run_server()                      # worker and ps tasks serve here until stopped
#' strategy <- select_strategy()     # the chief: "parameter_server" from TF_CONFIG
#' with(strategy$scope(), model <- build_model())
#' history <- ps_fit(model, dataset, epochs = 5L, steps_per_epoch = 100L)
#' }
#' @export
ps_fit <- function(model, data, epochs, steps_per_epoch = NULL, callbacks = NULL,
                   validation_data = NULL, validation_steps = NULL, initial_epoch = 0L,
                   verbose = "auto") {
  history <- call_python(
    kerasdist_module()$ps_fit, model, data, epochs = epochs,
    steps_per_epoch = steps_per_epoch, callbacks = callbacks,
    validation_data = validation_data, validation_steps = validation_steps,
    initial_epoch = initial_epoch, verbose = verbose
  )
  invisible(as_training_history(history))
}

# r-docs: python/kerasdist/training/ps.py:run_server (make r-docs)
#' Serve a worker or ps task of a parameter-server cluster
#'
#' Call it first thing in a script run on every task of a parameter-server cluster (e.g. by
#' `launch(..., num_ps=1)`): on a "worker" or "ps" task it starts TensorFlow's gRPC server for that
#' task and blocks for good (the launcher stops it once the chief is done); on the chief (the
#' coordinator), or outside a parameter-server cluster, it returns at once so the script goes on to
#' train.
#'
#' @param tf_config The TF_CONFIG to use (JSON text or a list); `NULL`: the TF_CONFIG variable.
#' @returns `NULL`, invisibly, on the chief; on a worker or ps task it does not return.
#' @family training
#' @seealso Python: `kerasdist.run_server()`; [ps_fit()], [launch()].
#' @examples
#' \dontrun{
#' run_server()  # first line of a script launched with launch(..., num_ps = 1)
#' }
#' @export
run_server <- function(tf_config = NULL) {
  invisible(call_python(kerasdist_module()$run_server, tf_config = tf_config))
}
