# One-call distributed training: thin wrapper over python/kerasdist/training/distributed.py.

# r-docs: python/kerasdist/training/distributed.py:distributed_fit (make r-docs)
#' Train a model under a distribution strategy, surviving restarts, in one call
#'
#' One call does what a fault-tolerant distributed run needs: selects the strategy ("auto" by
#' default), builds the model inside its scope or restores it from the newest valid checkpoint in
#' `checkpoint_dir`, feeds `make_dataset(x, y, ...)` rebuilt for each epoch (its order a pure
#' function of `seed` and the epoch), saves crash-safe checkpoints at every epoch end (and every
#' `every_steps` steps), and fits until `epochs` epochs are done in total. Run the same call again
#' after a crash, a kill or a preemption and it continues at the next unseen batch.
#'
#' Under a strategy with more than one replica, TensorFlow runs the loss, the metrics and the layers
#' on one thread per replica, where R cannot run: an R function there would make R abort ("C stack
#' usage is too close to the limit"). `distributed_fit()` checks the compiled model first and stops
#' with an error of class `kerasdist_error` naming what to change: use a built-in loss or metric by
#' name (`loss = "mse"`, `metrics = list("accuracy")`), or a Python function defined with
#' [reticulate::py_run_string()] or [reticulate::source_python()]. R callbacks are fine: they run on
#' R's thread.
#'
#' @inheritParams make_or_restore_model
#' @param build_fn An R (or Python) function with no arguments returning a compiled, built Keras
#'   model (a keras3 model or one made through reticulate); called inside the strategy's scope.
#' @param x The data: anything [make_dataset()] takes (R matrices and arrays, data frames, a
#'   `tf.data.Dataset` of unbatched elements, file patterns), batched by it; or batches as keras3's
#'   `fit()` takes them, trained on as they are: a batched `tf.data.Dataset` (tfdatasets'
#'   `dataset_batch()`, keras3's `image_dataset_from_directory()`; each batch one global batch,
#'   split over the replicas), a Python `keras.utils.PyDataset` or generator. A restart continues
#'   either at the next unseen batch ([resume_rule()] says how, for batches).
#' @param y The targets, as [make_dataset()] takes them (`NULL` when `x` holds them).
#' @param epochs Total number of epochs, counting those done by earlier (interrupted) runs.
#' @param checkpoint_dir Directory of checkpoints, created if missing; or an object-store URL
#'   (`s3://bucket/run`, `gs://bucket/run`): see [make_or_restore_model()].
#' @param strategy A `tf.distribute.Strategy` (from [select_strategy()] or not), or a kind for
#'   [select_strategy()]: "auto" (default), "default", "mirrored", ...
#' @param batch_size Global batch size; or give `per_replica_batch_size`; neither means 32.
#' @param per_replica_batch_size Batch size of one replica (multiplied by the replicas).
#' @param seed Seed of the per-epoch shuffle.
#' @param shuffle Shuffle each epoch (as a function of `seed` and the epoch).
#' @param sample_weight Optional per-sample weights (a numeric vector).
#' @param validation_split Fraction in (0, 1) of the samples (the last ones, as in Keras) held out
#'   for validation; in-memory data only.
#' @param validation_data `list(x_val, y_val)` (batched like the training data, unshuffled) or a
#'   batched `tf.data.Dataset`.
#' @param callbacks More Keras callbacks (TensorBoard, EarlyStopping, CSVLogger, your own, R ones
#'   included); checkpoints are added by distributed_fit itself.
#' @param dataset_args A named list of more [make_dataset()] arguments, e.g.
#'   `list(drop_remainder = TRUE)`.
#' @param steps_per_epoch Batches per epoch of data of batches that cannot tell (a Python generator;
#'   a dataset with a filter is counted once, by a pass over it).
#' @param verbose Passed to `fit`.
#' @param mixed_precision Train under `mixed_float16` (GPU) or `mixed_bfloat16` (CPU, TPU); the
#'   model must be built under it (pass a build function). Recorded in every checkpoint, as the next
#'   two: a resumed run with other values is refused, naming the setting.
#' @param jit_compile Compile the per-replica step with XLA.
#' @param gradient_accumulation_steps Apply the optimizer once every this many batches, their
#'   gradients averaged (Keras 3 optimizers accumulate them); `NULL` or 1: every batch.
#' @param steps_per_execution Training steps per call into the graph (Keras's `compile` option;
#'   callbacks' batch hooks then run once per call). An integer must divide the steps of an epoch,
#'   and `every_steps` must be a multiple of it; above 1 it needs a strategy of one replica (Keras
#'   3.15's multi-step loop fails under several: keras-team/keras#19246). "auto" (default): the
#'   model's own compiled value if above 1; else 1 when a callback has batch hooks, under several
#'   replicas and parameter servers; else a divisor of the epoch's steps (and of `every_steps`) that
#'   makes one call last about 50 ms of estimated compute (from the model's size and the batch),
#'   which hides the per-call hand-off of small models. Not recorded: a resumed run may use another
#'   value and still continues exactly.
#' @param every_epoch Save at each epoch end.
#' @param every_steps Also save every this many steps (batches, also under gradient accumulation);
#'   `NULL`: only at epoch ends.
#' @param every_seconds Also save at the first step end this many seconds after the last save (or
#'   the start of fit): time-based saves ("every 10 minutes": `every_seconds=600`), resumed like
#'   step saves. The chief alone decides and writes, so workers never wait on it. [goodput()]
#'   suggests a value from a run's failures and save cost.
#' @param keep How many of the newest checkpoints to keep (>= 1; the newest valid one is never
#'   deleted).
#' @param keep_best Also keep the checkpoint with the best `monitor` value.
#' @param monitor The epoch metric `keep_best` compares, e.g. "loss" or "val_loss".
#' @param mode "min" or "max": whether a smaller or larger `monitor` is better.
#' @param async_save Write checkpoints in a background thread (default `TRUE`), so training waits
#'   only while the model's state is copied; `FALSE` writes each one on the training thread before
#'   training goes on.
#' @param handle_sigterm On SIGTERM (preemption), save at the next step end and exit with status 75;
#'   default `TRUE`.
#' @param hang_timeout The step watchdog: after this many seconds without a training step (a
#'   callback, a data loader or a peer stuck), every thread's stack goes to stderr, the run log
#'   records the hang and the process exits with status 77 (`HUNG_EXIT_CODE`), for the launcher or
#'   scheduler to restart it. "auto" (default): ten times the slowest step of the fit so far, at
#'   least 120 s; `NULL`: no watchdog. The time before a fit's first step, saves and validation
#'   passes are not counted.
#' @returns The training history of all epochs, earlier runs included, as keras3's `fit()` returns
#'   it (invisibly): a `keras_training_history`, so `plot(history)`, `as.data.frame(history)` and
#'   `print(history)` work; `history$metrics$loss` is the loss per epoch and `history$model` the
#'   trained model.
#' @inheritSection resume_fit Preemption
#' @inheritSection resume_fit A lost peer
#' @family training
#' @seealso Python: `kerasdist.distributed_fit()`; the pieces it combines:
#'   [select_strategy()], [make_or_restore_model()], [make_dataset()],
#'   [checkpoint_callback()], [resume_fit()].
#' @examples
#' \dontrun{
#' library(keras3)
#' simulate_devices(2)                # before any keras3 function runs
#' digits <- load_digits(flatten = TRUE)
#' build_model <- function() {
#'   keras_model_sequential(input_shape = 64) |>
#'     layer_dense(32, activation = "relu") |>
#'     layer_dense(10, activation = "softmax") |>
#'     compile(optimizer = "adam", loss = "sparse_categorical_crossentropy",
#'             metrics = "accuracy")
#' }
#' history <- distributed_fit(build_model, digits$x, digits$y, epochs = 5,
#'                            checkpoint_dir = "ckpt", batch_size = 64,
#'                            every_steps = 10, validation_split = 0.2)
#' history$metrics$val_accuracy
#' plot(history)
#' }
#' @export
distributed_fit <- function(build_fn, x, y = NULL, epochs, checkpoint_dir, strategy = "auto",
                            batch_size = NULL, per_replica_batch_size = NULL, seed = 0L, shuffle = TRUE,
                            sample_weight = NULL, validation_split = NULL, validation_data = NULL,
                            callbacks = NULL, dataset_args = NULL, steps_per_epoch = NULL, verbose = "auto",
                            mixed_precision = FALSE, jit_compile = FALSE, gradient_accumulation_steps = NULL,
                            steps_per_execution = "auto", every_epoch = TRUE, every_steps = NULL,
                            every_seconds = NULL, keep = 3L, keep_best = FALSE, monitor = "loss", mode = "min",
                            async_save = TRUE, storage_options = NULL, handle_sigterm = TRUE,
                            hang_timeout = "auto") {
  history <- call_python_forwarding(kerasdist_module()$distributed_fit)
  invisible(as_training_history(history))
}

# r-docs: python/kerasdist/step_guard.py:check_step_functions (make r-docs)
#' Find R functions that TensorFlow would run inside the training step
#'
#' Under a multi-replica strategy TensorFlow traces the training step once per replica, each on its
#' own thread. An R function used there (a loss, a metric, a Lambda layer's function, a layer's or
#' the model's `call`) is then called off R's main thread and R aborts the whole process ("C stack
#' usage ... is too close to the limit"). reticulate hands R functions to Python as functions made
#' by `rpytools.call.make_python_function`; this looks for those, also inside wrappers (closures,
#' `functools.wraps`, Keras loss and metric wrappers).
#'
#' From R: with more than one replica it stops with an error of class `kerasdist_error` that says
#' what to use instead; [distributed_fit()] runs this check before training.
#'
#' @param model A compiled Keras model.
#' @param strategy The strategy training will run under; `NULL`: the active one.
#' @returns A character vector of the places holding R functions (e.g. `"loss"`, `"metrics[1]"`),
#'   invisibly; empty if none. With one replica they are allowed (they run on the calling thread)
#'   and only reported.
#' @family training
#' @seealso Python: `kerasdist.check_step_functions()`.
#' @examples
#' \dontrun{
#' check_step_functions(model, select_strategy())
#' }
#' @export
check_step_functions <- function(model, strategy = NULL) {
  found <- call_python(kerasdist_module()$check_step_functions, model, strategy)
  invisible(as.character(unlist(found)))
}
