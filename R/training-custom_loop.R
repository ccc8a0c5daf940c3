# Custom training loops: thin wrapper over python/kerasdist/training/custom_loop.py.

# r-docs: python/kerasdist/training/custom_loop.py:custom_fit (make r-docs)
#' Train with your own step function, distributed, checkpointed and resumable
#'
#' Every epoch, `data`'s batches are distributed and `step_fn(model, optimizer, batch)` runs on
#' every replica through `strategy.run`, all in one `tf.function`. The dict it returns holds
#' per-replica scalars already scaled with [scaled_loss()] (each replica's share of the global
#' mean): they are summed across replicas, averaged over the epoch's steps and logged as Keras logs
#' them (`verbose`, callbacks, History). Checkpoints are written through kerasdist's checkpoint
#' callback at every epoch end (and every `every_steps` steps, and on SIGTERM, which then exits with
#' status 75); the same call after a crash continues at the next unseen batch, bit for bit on the
#' default strategy with seeded data and op determinism.
#'
#' From R, `step_fn` must be a **Python** function: TensorFlow calls it on one thread per replica,
#' where R code cannot run. Write it with `reticulate::py_run_string()` and pass `py$step`; it
#' computes the gradients of a loss scaled with `kerasdist.scaled_loss` (Python) and applies them,
#' and returns a dict of scalars such as `{"loss": loss}`.
#'
#' @inheritParams make_or_restore_model
#' @param model A built keras3 model (from [make_or_restore_model()]), or a function with no
#'   arguments that builds and compiles one (then built in the strategy's scope and restored from
#'   `checkpoint_dir`).
#' @param data A `tf.data.Dataset` of global batches (from [make_dataset()], or batched by you: read
#'   one batch per step, its position kept), a Python `keras.utils.PyDataset` or generator, or a
#'   Python function of a `tf.distribute.InputContext` (with `steps_per_epoch`).
#' @param step_fn A Python function `step_fn(model, optimizer, batch) -> dict of scalars`; it runs
#'   on the replicas' threads, so it cannot be an R function. `NULL`: [fit_step()], Keras's own step
#'   for a compiled model.
#' @param epochs Total number of epochs, counting those done by earlier runs.
#' @param checkpoint_dir Directory of checkpoints (or an object-store URL, `s3://bucket/run`);
#'   `NULL` for the one the model was made or restored from by [make_or_restore_model()].
#' @param optimizer `NULL`: the compiled model's optimizer; an optimizer given for a model compiled
#'   without one is attached (`model.compile(optimizer=...)`), so checkpoints hold its state.
#' @param strategy Where a build function builds the model; `NULL`: the active strategy. A model
#'   given built trains under its own strategy.
#' @param steps_per_epoch Batches per epoch, when `data` cannot tell.
#' @param callbacks A Keras callback or a list of them.
#' @param verbose 0 (silent), 1 (progress bar) or 2 (a line per epoch); "auto" is 1.
#' @param mixed_precision Train under `mixed_float16` (GPU) or `mixed_bfloat16` (CPU, TPU); the
#'   model must be built under it (pass a build function). Recorded in every checkpoint, as the next
#'   two: a resumed run with other values is refused, naming the setting.
#' @param jit_compile Compile the per-replica step with XLA.
#' @param gradient_accumulation_steps Apply the optimizer once every this many batches, their
#'   gradients averaged (Keras 3 optimizers accumulate them); `NULL` or 1: every batch.
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
#' @returns The training history of all epochs, earlier runs included, invisibly: a
#'   `keras_training_history`, as keras3's `fit()` returns.
#' @inheritSection resume_fit Preemption
#' @inheritSection resume_fit A lost peer
#' @family training
#' @seealso Python: `kerasdist.custom_fit()`, `kerasdist.scaled_loss()`.
#' @examples
#' \dontrun{
#' reticulate::py_run_string("
#' import keras, tensorflow as tf, kerasdist
#' def step(model, optimizer, batch):
#'     x, y = batch
#'     with tf.GradientTape() as tape:
#'         per_example = keras.losses.mean_squared_error(y, model(x, training=True))
#'         loss = kerasdist.scaled_loss(per_example, model=model)
#'     grads = tape.gradient(optimizer.scale_loss(loss), model.trainable_variables)
#'     optimizer.apply(grads, model.trainable_variables)
#'     return {'loss': loss}
#' ")
#' x <- matrix(rnorm(400), ncol = 4)
#' history <- custom_fit(function() {
#'   keras3::keras_model_sequential(input_shape = 4) |> keras3::layer_dense(1) |>
#'     keras3::compile(optimizer = "adam")
#' }, make_dataset(x, rowSums(x), batch_size = 20, epochs = 1), reticulate::py$step,
#' epochs = 3, checkpoint_dir = "ckpt")
#' }
#' @export
custom_fit <- function(model, data, step_fn = NULL, epochs = NULL, checkpoint_dir = NULL, optimizer = NULL,
                       strategy = NULL, steps_per_epoch = NULL, callbacks = NULL, verbose = "auto",
                       mixed_precision = FALSE, jit_compile = FALSE, gradient_accumulation_steps = NULL,
                       every_epoch = TRUE, every_steps = NULL, every_seconds = NULL, keep = 3L, keep_best = FALSE,
                       monitor = "loss", mode = "min", async_save = TRUE, storage_options = NULL,
                       handle_sigterm = TRUE, hang_timeout = "auto") {
  history <- call_python_forwarding(kerasdist_module()$custom_fit)  # an R step_fn is refused there
  invisible(as_training_history(history))
}

# r-docs: python/kerasdist/training/custom_loop.py:fit_step (make r-docs)
#' One of `fit`'s training steps, the default step of custom_fit()
#'
#' Runs Keras's training step for a compiled model on one batch: the compiled loss (plus
#' regularization losses), its gradients, and the optimizer update. [custom_fit()] uses this step
#' when `step_fn` is `NULL` (there it runs in Python on every replica); called from R it runs once,
#' on the calling thread.
#'
#' @param model A compiled Keras model (a keras3 model).
#' @param optimizer The optimizer to apply the gradients with; usually `model$optimizer`.
#' @param batch One batch: `list(x, y)` or `list(x, y, sample_weight)` of tensors or arrays.
#' @returns A named list with the step's `loss` (a tensor).
#' @family training
#' @seealso Python: `kerasdist.fit_step()`; [custom_fit()].
#' @examples
#' \dontrun{
#' batch <- reticulate::iter_next(reticulate::as_iterator(make_dataset(x, y, batch_size = 32)))
#' fit_step(model, model$optimizer, batch)$loss
#' }
#' @export
fit_step <- function(model, optimizer, batch) {
  call_python(kerasdist_module()$fit_step, model, optimizer, batch)
}
