# Crash-safe checkpoints: thin wrappers over python/kerasdist/checkpoint/.

#' Build a model, or restore it from the newest valid checkpoint
#'
#' Builds the model with `build_fn()` inside the strategy's scope. When
#' `checkpoint_dir` holds checkpoints, the newest valid one (by the epoch and
#' step recorded in it, never by file name or time) is loaded into it: weights,
#' optimizer state and random-generator states. Damaged or partial checkpoints
#' are skipped with a warning naming the file. [latest_checkpoint()] tells the
#' epoch and step to resume from; [resume_fit()] uses it so that `epochs = N`
#' means N in total.
#'
#' @param checkpoint_dir Directory of checkpoints, created if missing; or an
#'   object-store URL: `"s3://bucket/run"` (needs the Python package s3fs:
#'   `kerasdist_py_require(storage = "s3")`), `"gs://bucket/run"` (gcsfs:
#'   `storage = "gcs"`), `"memory://run"` (in-process, for tests) or
#'   `"file:///path"`. On object stores a checkpoint counts once its completion
#'   record is uploaded, last; unfinished uploads are never restored.
#' @param build_fn An R (or Python) function with no arguments returning a
#'   compiled Keras model (a keras3 model or one made through reticulate). If
#'   `NULL`, the model is loaded whole from the newest checkpoint.
#' @param strategy A strategy from [select_strategy()]; `NULL` for the active one.
#' @param custom_objects Named list of custom classes or functions for loading.
#' @param safe_mode Refuse to load lambdas from checkpoints (Keras safe mode).
#' @param storage_options For an object-store `checkpoint_dir`: a named list of
#'   options for its fsspec filesystem (credentials, endpoint), e.g.
#'   `list(key = "...", secret = "...", client_kwargs = list(endpoint_url = "http://..."))`
#'   for `s3://`. `NULL` (default): the standard environment variables
#'   (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL_S3`,
#'   `GOOGLE_APPLICATION_CREDENTIALS`, ...) and credentials files.
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

#' A Keras callback that writes crash-safe checkpoints
#'
#' Saves at the end of every epoch and/or every `every_steps` steps and/or
#' `every_seconds` seconds after the last save, writing to
#' a temporary name, fsyncing, writing the completion record last and renaming,
#' so a crash never leaves a torn checkpoint that gets picked. Keeps the `keep`
#' newest (and the best by `monitor` with `keep_best`), never deleting the
#' newest valid one. Under multi-worker strategies only the chief writes. On
#' SIGTERM it saves at the next step and exits with status 75. Under a
#' multi-worker strategy a SIGTERM to any worker stops every worker after one
#' agreed step: the chief saves that step and every worker exits with 75.
#'
#' By default (`async_save = TRUE`) the files are written in a background
#' thread while training goes on, one save at a time; the callback's
#' `blocked_seconds` lists how long training waited at each save.
#'
#' Every checkpoint also keeps the state of the other callbacks of the fit, so
#' a resumed run goes on as if never interrupted: [keras3::callback_early_stopping()]'s
#' patience and best (and best weights), [keras3::callback_reduce_lr_on_plateau()]'s,
#' [keras3::callback_model_checkpoint()]'s best, [keras3::callback_tensorboard()]'s step
#' counters, [keras3::callback_csv_logger()]'s rows, and any callback of your own made
#' with [keras3::Callback()] that defines `get_state = function() list(...)`
#' (numbers, strings, logicals, arrays) and `set_state = function(state)`. A
#' callback without them starts fresh on resume. Resuming with other callbacks
#' restores what still matches and warns once naming the rest. Put
#' `checkpoint_callback()` last in `callbacks`, so an epoch-end checkpoint
#' holds the others' state after that epoch ([distributed_fit()] and
#' [resume_fit()] place theirs last).
#'
#' @inheritParams make_or_restore_model
#' @param every_epoch Save at each epoch end.
#' @param every_steps Also save every this many steps; `NULL` for epoch ends only.
#' @param every_seconds Also checkpoint at the first step end this many seconds
#'   after the last save (time-based, e.g. `600` for every 10 minutes); `NULL`:
#'   no time-based saves. The chief alone decides and writes. [goodput()]
#'   suggests a value from a run's failures and save cost.
#' @param keep How many of the newest checkpoints to keep (at least 1).
#' @param keep_best Also keep the checkpoint with the best `monitor` value.
#' @param monitor Epoch metric for `keep_best`, e.g. `"loss"` or `"val_loss"`.
#' @param mode `"min"` or `"max"`: whether smaller or larger `monitor` is better.
#' @param handle_sigterm Save and exit on SIGTERM (preemption).
#' @param async_save Write checkpoints in a background thread (default
#'   `TRUE`): training waits only while the model's state is copied, and the
#'   next save, a preemption save and the end of training wait for the write,
#'   raising its error if it failed; a crash during the write leaves the
#'   checkpoints saved before. `FALSE` writes each checkpoint before training
#'   goes on.
#' @returns The callback (a Python Keras callback), for `callbacks = list(...)`.
#' @family checkpoint
#' @seealso Python: `kerasdist.checkpoint_callback()`.
#' @examples
#' \dontrun{
#' model |> fit(x, y, epochs = 10, callbacks = list(checkpoint_callback("checkpoints")))
#' }
#' @export
checkpoint_callback <- function(checkpoint_dir, every_epoch = TRUE, every_steps = NULL, keep = 3L,
                                keep_best = FALSE, monitor = "loss", mode = "min",
                                handle_sigterm = TRUE, async_save = TRUE, storage_options = NULL,
                                every_seconds = NULL) {
  call_python(
    kerasdist_module()$checkpoint_callback, checkpoint_dir,
    every_epoch = every_epoch, every_steps = every_steps, keep = keep,
    keep_best = keep_best, monitor = monitor, mode = mode, handle_sigterm = handle_sigterm,
    async_save = async_save, storage_options = storage_options, every_seconds = every_seconds
  )
}

#' The newest valid checkpoint and where training resumes
#'
#' @inheritParams make_or_restore_model
#' @param checkpoint_dir Directory of checkpoints (never created: a missing one
#'   has no checkpoint, `NULL`),
#'   or an object-store URL (`"s3://..."`, `"gs://..."`, `"memory://..."`,
#'   `"file://..."`), as in [make_or_restore_model()].
#' @returns `NULL` when there is none, else a list: `path`, `epoch` (the epoch
#'   to run next, 0-based, i.e. the number of completed epochs when
#'   `step_in_epoch` is 0), `step_in_epoch`, `global_step` (batches trained in
#'   all; under gradient accumulation more than the optimizer's applied
#'   updates), `history`, `metrics` and `writer` (the task that wrote it, e.g. `"worker:0"`, or
#'   `NULL` outside a cluster) and `settings` (the run's `mixed_precision`,
#'   `jit_compile` and `gradient_accumulation_steps`, which a resumed run must
#'   repeat), and, for `make_dataset` data (the dataset itself, or a function
#'   of the epoch returning one), `global_batch_size` and
#'   `epoch_order` (the name of the function that ordered the epochs; a run
#'   resumed inside an epoch by a kerasdist that orders epochs otherwise warns),
#'   `saved_at` (seconds since 1970, UTC) and `size` (bytes of its files).
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

#' All valid checkpoints, oldest first
#'
#' @inheritParams make_or_restore_model
#' @param checkpoint_dir Directory of checkpoints (never created: a missing one
#'   gives no rows),
#'   or an object-store URL (`"s3://..."`, `"gs://..."`, `"memory://..."`,
#'   `"file://..."`), as in [make_or_restore_model()].
#' @returns A data frame, one row per valid checkpoint, ordered by the epoch
#'   and step recorded in each: `path`, `epoch`, `step_in_epoch`,
#'   `global_step`, `saved_at` (a `POSIXct`, UTC), `size` (bytes of its
#'   files), `writer` and `restart` (`TRUE` for the one a restart resumes
#'   from, the last). No rows when there is none. [latest_checkpoint()] gives
#'   one checkpoint with its history and metrics; [checkpoint_table()] lists
#'   damaged ones too.
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
  infos <- lapply(call_python(kerasdist_module()$list_checkpoints, checkpoint_dir, storage_options = storage_options,
                              call = sys.call()),
                  py_record_to_r)
  rows <- lapply(seq_along(infos), function(i) {
    c(infos[[i]][c("path", "epoch", "step_in_epoch", "global_step", "saved_at", "size", "writer")],
      list(restart = i == length(infos)))
  })
  rows_to_data_frame(rows, CHECKPOINT_COLUMNS[c("path", "epoch", "step_in_epoch", "global_step", "saved_at",
                                                "size", "writer", "restart")])
}

#' Every checkpoint of a directory, valid or not
#'
#' What `kerasdist checkpoints DIR` prints, as a data frame: for looking into
#' a run's directory or bucket, e.g. after a crash, before restarting it.
#' Reads only.
#'
#' @inheritParams make_or_restore_model
#' @param checkpoint_dir Directory of checkpoints (never created: a missing
#'   local one is an error naming it),
#'   or an object-store URL (`"s3://..."`, `"gs://..."`, `"memory://..."`,
#'   `"file://..."`), as in [make_or_restore_model()].
#' @returns A data frame, one row per checkpoint, oldest first: `path`,
#'   `global_step`, `epoch`, `step_in_epoch`, `saved_at` (a `POSIXct`, UTC),
#'   `size` (bytes), `writer`, `valid`, `problem` (why a damaged or partial
#'   checkpoint cannot be used, else `NA`) and `restart` (`TRUE` for the one a
#'   restart would resume from). A damaged checkpoint's step comes from its
#'   name, its other fields are `NA`. An error if a local `checkpoint_dir`
#'   does not exist.
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
  rows <- call_python(kerasdist_module()$checkpoint_table, checkpoint_dir, storage_options = storage_options)
  rows_to_data_frame(rows, CHECKPOINT_COLUMNS)
}

# The columns of the checkpoint tables, each as its missing value (which gives its type).
CHECKPOINT_COLUMNS <- list(path = NA_character_, global_step = NA_integer_, epoch = NA_integer_,
                           step_in_epoch = NA_integer_, saved_at = as.POSIXct(NA, tz = "UTC"),
                           size = NA_real_, writer = NA_character_, valid = NA, problem = NA_character_,
                           restart = NA)

# A data frame of `rows` (named lists, NULL where missing) with the given columns and types.
rows_to_data_frame <- function(rows, columns) {
  as_column <- function(name) {
    missing <- columns[[name]]
    values <- lapply(rows, function(row) if (is.null(row[[name]])) NA else row[[name]])
    if (inherits(missing, "POSIXct")) {
      return(as.POSIXct(vapply(values, function(v) {
        # seconds since 1970 (list_checkpoints) or ISO 8601 in UTC (checkpoint_table)
        if (is.character(v)) as.numeric(as.POSIXct(sub("[+]00:00$", "", v), format = "%Y-%m-%dT%H:%M:%S", tz = "UTC"))
        else as.numeric(v)
      }, numeric(1)), origin = "1970-01-01", tz = "UTC"))
    }
    vapply(values, function(v) as.vector(v, typeof(missing)), missing, USE.NAMES = FALSE)
  }
  frame <- lapply(names(columns), as_column)
  names(frame) <- names(columns)
  frame <- as.data.frame(frame, stringsAsFactors = FALSE)
  rownames(frame) <- NULL
  frame
}

#' The checkpoint manager of a directory
#'
#' The object every kerasdist trainer saves and restores through: it checks
#' the directory once, lists and verifies the checkpoints once (checksums are
#' not recomputed for files that did not change), restores a model and gives
#' the resume point from the same read, saves atomically and prunes. For
#' scripts that manage checkpoints themselves; [make_or_restore_model()],
#' [latest_checkpoint()] and the trainers use one internally.
#'
#' @inheritParams make_or_restore_model
#' @param create Create the directory and check it is writable now; `FALSE`
#'   defers that to the first restore or save.
#' @returns The Python `kerasdist.CheckpointManager`; call its methods with
#'   `$`: `$checkpoints()`, `$latest()`, `$restore(model)`,
#'   `$save(model, epoch = 1L, step_in_epoch = 0L)`, `$prune(keep)`.
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
