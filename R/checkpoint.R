# Crash-safe checkpoints: thin wrappers over python/kerasdist/checkpoint/.

# r-docs: python/kerasdist/checkpoint/manager.py:make_or_restore_model (make r-docs)
#' Build a model, or restore it from the newest valid checkpoint
#'
#' The model is built by `build_fn()` inside the strategy's scope (the given `strategy`, else the
#' active one). When `checkpoint_dir` holds checkpoints, the newest valid one (by the epoch and step
#' recorded in it) is loaded: weights, optimizer state and random-generator states; damaged ones are
#' skipped with a warning. Under a multi-worker strategy only the chief reads `checkpoint_dir`, and
#' every other worker gets the state it restored (hosts need not share a disk; see `chief_state`).
#' `latest_checkpoint(checkpoint_dir)` then tells the epoch and step to resume from; pass its
#' `epoch` as `initial_epoch` to `fit` (or use [resume_fit()], which continues from the checkpoint
#' restored here) so `epochs=N` means N in total.
#'
#' @param checkpoint_dir Directory of checkpoints, created if missing; or an object-store URL:
#'   `"s3://bucket/run"` (needs the Python package s3fs: `kerasdist_py_require(storage = "s3")`),
#'   `"gs://bucket/run"` (gcsfs: `storage = "gcs"`), `"memory://run"` (in-process, for tests) or
#'   `"file:///path"`. On object stores a checkpoint counts once its completion record is uploaded,
#'   last; unfinished uploads are never restored.
#' @param build_fn An R (or Python) function with no arguments returning a compiled Keras model (a
#'   keras3 model or one made through reticulate). If `NULL`, the model is loaded whole from the
#'   newest checkpoint (its config, with `custom_objects` and `safe_mode`).
#' @param strategy A `tf.distribute.Strategy`; `NULL`: the active one.
#' @param custom_objects A named list of custom classes or functions needed to load a saved model.
#' @param safe_mode Refuse to load lambdas from checkpoints (Keras safe mode); default `TRUE`.
#' @param storage_options For an object-store `checkpoint_dir`: a named list of options for its
#'   fsspec filesystem (credentials, endpoint), e.g.
#'   `list(key = "...", secret = "...", client_kwargs = list(endpoint_url = "http://..."))` for
#'   `s3://`. `NULL` (default): the standard environment variables (`AWS_ACCESS_KEY_ID`,
#'   `AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL_S3`, `GOOGLE_APPLICATION_CREDENTIALS`, ...) and
#'   credentials files.
#' @returns The Keras model (a Python object).
#' @family checkpoint
#' @seealso Python: `kerasdist.make_or_restore_model()`.
#' @examples
#' \dontrun{
#' strategy <- select_strategy()
#' with(strategy$scope(), {
#'   model <- make_or_restore_model("checkpoints", build_model)
#' })
#' }
#' @export
make_or_restore_model <- function(checkpoint_dir, build_fn = NULL, strategy = NULL,
                                  custom_objects = NULL, safe_mode = TRUE, storage_options = NULL) {
  call_python(
    kerasdist_module()$make_or_restore_model, checkpoint_dir, build_fn,
    strategy = strategy, custom_objects = custom_objects, safe_mode = safe_mode,
    storage_options = storage_options
  )
}

# r-docs: python/kerasdist/checkpoint/callback.py:checkpoint_callback (make r-docs)
#' A Keras callback that writes crash-safe checkpoints
#'
#' Saves at the end of every epoch (`every_epoch`) and/or every `every_steps` steps (batches) and/or
#' at the first step end `every_seconds` after the last save, atomically; keeps the `keep` newest
#' (plus the best by `monitor` when `keep_best`), never deleting the newest valid one. Under
#' multi-worker strategies only the chief writes. On SIGTERM it saves at the next step boundary,
#' stops training and raises `PreemptedExit` (exit status `PREEMPTED_EXIT_CODE`, 75), which names
#' the checkpoint saved. Under a multi-worker strategy a SIGTERM to any worker stops every worker
#' after one agreed step (`preemption/agreement.py`): the chief saves that step and every worker
#' exits with 75.
#'
#' With `async_save` (the default) training waits for a save only while the model's state is copied
#' (`checkpoint/snapshot.py`); the files are written and committed in a background thread
#' (`checkpoint/background.py`), one save at a time, with the same atomic commit. The next save, a
#' preemption save and the end of `fit` wait for it; an error in it is raised there
#' (`BackgroundSaveError`); a crash during it leaves the checkpoints saved before. `blocked_seconds`
#' lists, per save, how long the training thread waited.
#'
#' Every checkpoint also keeps the state of the other callbacks of the `fit` (EarlyStopping's
#' patience and best, ReduceLROnPlateau's, ModelCheckpoint's best, TensorBoard's step counters,
#' CSVLogger's rows, and any callback with `get_state()` / `set_state(state)`: see
#' `checkpoint/callback_state.py`); a resumed run gives it back before its first batch. Put this
#' callback last in `callbacks`, so an epoch-end checkpoint holds their state after that epoch
#' (kerasdist's trainers do).
#'
#' From R: a preempted fit ends an Rscript with status 75 and gives an interactive session a
#' `kerasdist_preempted` condition. The other callbacks whose state every checkpoint keeps include
#' [keras3::callback_early_stopping()], [keras3::callback_reduce_lr_on_plateau()],
#' [keras3::callback_model_checkpoint()], [keras3::callback_tensorboard()],
#' [keras3::callback_csv_logger()] and any callback of your own made with [keras3::Callback()] that
#' defines `get_state = function() list(...)` (numbers, strings, logicals, arrays) and
#' `set_state = function(state)`; a callback without them starts fresh on resume.
#' [distributed_fit()] and [resume_fit()] place theirs last.
#'
#' @inheritParams make_or_restore_model
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
#' @returns The callback (a Python Keras callback), for `callbacks = list(...)`.
#' @family checkpoint
#' @seealso Python: `kerasdist.checkpoint_callback()`.
#' @examples
#' \dontrun{
#' model |> fit(x, y, epochs = 10, callbacks = list(checkpoint_callback("checkpoints")))
#' }
#' @export
checkpoint_callback <- function(checkpoint_dir, every_epoch = TRUE, every_steps = NULL, every_seconds = NULL,
                                keep = 3L, keep_best = FALSE, monitor = "loss", mode = "min",
                                async_save = TRUE, storage_options = NULL, handle_sigterm = TRUE,
                                hang_timeout = "auto") {
  call_python_forwarding(kerasdist_module()$checkpoint_callback)
}

# r-docs: python/kerasdist/checkpoint/manager.py:latest_checkpoint (make r-docs)
#' The newest valid checkpoint and where training resumes
#'
#' @inheritParams make_or_restore_model
#' @param checkpoint_dir Directory of checkpoints (never created: a missing one has no checkpoint,
#'   `NULL`), or an object-store URL (`"s3://..."`, `"gs://..."`, `"memory://..."`, `"file://..."`),
#'   as in [make_or_restore_model()].
#' @returns `NULL` when there is none, else a list: `path`, `epoch` (the epoch to run next, 0-based,
#'   i.e. the number of completed epochs when `step_in_epoch` is 0), `step_in_epoch`, `global_step`
#'   (batches trained in all; under gradient accumulation more than the optimizer's applied
#'   updates), `history`, `metrics` and `writer` (the task that wrote it, e.g. `"worker:0"`, or
#'   `NULL` outside a cluster) and `settings` (the run's `mixed_precision`, `jit_compile` and
#'   `gradient_accumulation_steps`, which a resumed run must repeat), and, for `make_dataset` data
#'   (the dataset itself, or a function of the epoch returning one), `global_batch_size` and
#'   `epoch_order` (how the epochs were ordered: the order function's name or `"in order"`, and over
#'   how many workers where each read a share of its own; a run resumed inside an epoch that orders
#'   it otherwise warns), `saved_at` (seconds since 1970, UTC) and `size` (bytes of its files).
#'   Damaged checkpoints are skipped with a warning.
#' @family checkpoint
#' @seealso Python: `kerasdist.latest_checkpoint()`.
#' @examplesIf !is.null(kerasdist_python())
#' dir <- file.path(tempdir(), "example-ckpt")
#' x <- matrix(seq_len(64) / 64, ncol = 4)
#' distributed_fit(function() {
#'   keras3::keras_model_sequential(input_shape = 4) |> keras3::layer_dense(1) |>
#'     keras3::compile(optimizer = "adam", loss = "mse")
#' }, x, rowSums(x), epochs = 2, checkpoint_dir = dir, batch_size = 8, strategy = "default", verbose = 0)
#' latest_checkpoint(dir)$epoch   # 2: both epochs done
#' @export
latest_checkpoint <- function(checkpoint_dir, storage_options = NULL) {
  info <- call_python(kerasdist_module()$latest_checkpoint, checkpoint_dir, storage_options = storage_options)
  if (is.null(info)) NULL else py_record_to_r(info)
}

# r-docs: python/kerasdist/checkpoint/manager.py:list_checkpoints (make r-docs)
#' All valid checkpoints, oldest first
#'
#' Damaged or partial checkpoints are skipped with a `CheckpointWarning` naming the file.
#' `storage_options`: for an object-store URL, as in `CheckpointManager`.
#'
#' @inheritParams make_or_restore_model
#' @param checkpoint_dir Directory of checkpoints (never created: a missing one gives no rows), or
#'   an object-store URL (`"s3://..."`, `"gs://..."`, `"memory://..."`, `"file://..."`), as in
#'   [make_or_restore_model()].
#' @returns A data frame, one row per valid checkpoint, ordered by the epoch and step recorded in
#'   each: `path`, `epoch`, `step_in_epoch`, `global_step`, `saved_at` (a `POSIXct`, UTC), `size`
#'   (bytes of its files), `writer` and `restart` (`TRUE` for the one a restart resumes from, the
#'   last). No rows when there is none. [latest_checkpoint()] gives one checkpoint with its history
#'   and metrics; [checkpoint_table()] lists damaged ones too.
#' @family checkpoint
#' @seealso Python: `kerasdist.list_checkpoints()`.
#' @examplesIf !is.null(kerasdist_python())
#' dir <- file.path(tempdir(), "example-ckpt")
#' x <- matrix(seq_len(64) / 64, ncol = 4)
#' distributed_fit(function() {
#'   keras3::keras_model_sequential(input_shape = 4) |> keras3::layer_dense(1) |>
#'     keras3::compile(optimizer = "adam", loss = "mse")
#' }, x, rowSums(x), epochs = 2, checkpoint_dir = dir, batch_size = 8, strategy = "default", verbose = 0)
#' list_checkpoints(dir)[, c("global_step", "epoch", "restart")]
#' @export
list_checkpoints <- function(checkpoint_dir, storage_options = NULL) {
  checkpoint_frame(checkpoint_dir, storage_options, every = FALSE, call = sys.call())
}

# r-docs: python/kerasdist/checkpoint/table.py:checkpoint_table (make r-docs)
#' Every checkpoint of a directory, valid or not
#'
#' What `kerasdist checkpoints DIR` prints, as a data frame: for looking into a run's directory or
#' bucket, e.g. after a crash, before restarting it. Reads only; warns about nothing.
#'
#' @inheritParams make_or_restore_model
#' @param checkpoint_dir Directory of checkpoints (never created: a missing local one is an error
#'   naming it), or an object-store URL (`"s3://..."`, `"gs://..."`, `"memory://..."`,
#'   `"file://..."`), as in [make_or_restore_model()].
#' @returns A data frame, one row per checkpoint, oldest first: `path`, `global_step`, `epoch`,
#'   `step_in_epoch`, `saved_at` (a `POSIXct`, UTC), `size` (bytes), `writer`, `valid`, `problem`
#'   (why a damaged or partial checkpoint cannot be used, else `NA`) and `restart` (`TRUE` for the
#'   one a restart would resume from). A damaged checkpoint's step comes from its name, its other
#'   fields are `NA`. An error if a local `checkpoint_dir` does not exist.
#' @family checkpoint
#' @seealso Python: `kerasdist.checkpoint_table()`; the shell: `kerasdist checkpoints DIR`.
#' @examplesIf !is.null(kerasdist_python())
#' dir <- file.path(tempdir(), "example-ckpt")
#' x <- matrix(seq_len(64) / 64, ncol = 4)
#' distributed_fit(function() {
#'   keras3::keras_model_sequential(input_shape = 4) |> keras3::layer_dense(1) |>
#'     keras3::compile(optimizer = "adam", loss = "mse")
#' }, x, rowSums(x), epochs = 2, checkpoint_dir = dir, batch_size = 8, strategy = "default", verbose = 0)
#' table <- checkpoint_table(dir)
#' table[!table$valid, c("path", "problem")]   # none damaged
#' @export
checkpoint_table <- function(checkpoint_dir, storage_options = NULL) {
  checkpoint_frame(checkpoint_dir, storage_options, every = TRUE, call = sys.call())
}

# The checkpoint tables as Python lays them out (python/kerasdist/_bridge.py: the columns, their
# types, `restart`, `saved_at` in seconds) made a data frame.
checkpoint_frame <- function(checkpoint_dir, storage_options, every, call) {
  kerasdist_module()
  columns <- call_python(.kerasdist$bridge$checkpoint_columns, checkpoint_dir, storage_options = storage_options,
                         every = every, call = call)
  columns_to_data_frame(columns)
}

# r-docs: python/kerasdist/checkpoint/manager.py:CheckpointManager (make r-docs)
#' The checkpoint manager of a directory
#'
#' The directory is checked when the manager is made (a path, not a file) and, once, created and
#' probed for writing before the first restore or save. Listing reads each checkpoint's completion
#' record; its files are checksummed the first time a manager of this store sees it and again only
#' if their size or modification time changes, so a run verifies every checkpoint once however many
#' times it asks. Damaged checkpoints are skipped with one `CheckpointWarning`.
#'
#' @inheritParams make_or_restore_model
#' @param create Create and probe the directory now (default); `FALSE` defers that to the first
#'   restore or save, so arguments can be checked before anything is touched.
#' @returns The Python `kerasdist.CheckpointManager`; call its methods with `$`: `$checkpoints()`,
#'   `$latest()`, `$restore(model)`, `$save(model, epoch = 1L, step_in_epoch = 0L)`, `$prune(keep)`.
#' @family checkpoint
#' @seealso Python: `kerasdist.CheckpointManager`.
#' @examplesIf !is.null(kerasdist_python())
#' dir <- file.path(tempdir(), "example-ckpt")
#' x <- matrix(seq_len(64) / 64, ncol = 4)
#' distributed_fit(function() {
#'   keras3::keras_model_sequential(input_shape = 4) |> keras3::layer_dense(1) |>
#'     keras3::compile(optimizer = "adam", loss = "mse")
#' }, x, rowSums(x), epochs = 2, checkpoint_dir = dir, batch_size = 8, strategy = "default", verbose = 0)
#' manager <- checkpoint_manager(dir)
#' manager$latest()$epoch
#' @export
checkpoint_manager <- function(checkpoint_dir, create = TRUE, storage_options = NULL) {
  call_python(kerasdist_module()$CheckpointManager, checkpoint_dir, create = create,
              storage_options = storage_options)
}
