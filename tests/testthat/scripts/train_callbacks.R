# The R twin of tests/python/scripts/train_callbacks.py (tests/cases/callbacks.json): a seeded run
# with keras3's callbacks and an R-defined one with get_state/set_state, failed and run again.
# usage: Rscript train_callbacks.R TRAINER RUN_DIR FAULT [TRAINER RUN_DIR FAULT ...]
# TRAINER: distributed_fit, or model.fit (make_or_restore_model, then keras3's fit() with
# checkpoint_callback() last, resumed at epoch boundaries). FAULT: none, or NAME=AT, NAME one of
# KILL_AT_STEP (SIGKILL at that step's end), KILL_AFTER_EPOCH (SIGKILL once that 0-based epoch's
# checkpoint is committed) or TERM_AT_STEP (SIGTERM at that step's start). A run that ends writes
# RUN_DIR/result.json (steps, learning rate, the R callback's state, the newest checkpoint's step,
# TensorBoard's records), weights.npz, best.npz (ModelCheckpoint's best file) and newest.npz, and
# prints "done RUN_DIR". Several runs go one after the other in this one process, each seeded
# alike (each R process starting TensorFlow costs about 12 s of CPU); a faulted one ends it.
library(keras3)
library(kerasdist)
args <- commandArgs(trailingOnly = TRUE)
stopifnot(length(args) %% 3L == 0L)
runs <- matrix(args, nrow = 3L)  # a column a run: trainer, run_dir, fault
ckpt <- NULL  # the run's checkpoint directory, set by train_run(): Fault reads it
faults <- c("KILL_AT_STEP", "KILL_AFTER_EPOCH", "TERM_AT_STEP")
fault <- function(name) as.integer(Sys.getenv(name, "-1"))
set_fault <- function(spec) {  # "none" or NAME=AT, in the environment fault() reads
  Sys.unsetenv(faults)
  if (spec != "none") {
    name_at <- strsplit(spec, "=", fixed = TRUE)[[1]]
    stopifnot(name_at[[1]] %in% faults)
    do.call(Sys.setenv, setNames(list(name_at[[2]]), name_at[[1]]))
  }
}

keras <- reticulate::import("keras")
reticulate::import("tensorflow")$config$experimental$enable_op_determinism()
set.seed(7)
x <- matrix(rnorm(320 * 6), ncol = 6)
y <- x %*% rnorm(6) + 0.1 * rnorm(320)

build_model <- function() {
  keras_model_sequential(input_shape = 6) |>
    layer_dense(16, activation = "relu") |>
    layer_dense(1) |>
    compile(optimizer = optimizer_sgd(0.01, momentum = 0.9), loss = "mse")
}

# A callback of the user's own, with state: it opts in with get_state() and set_state().
UserCounter <- Callback(
  "UserCounter",
  initialize = function() {
    super$initialize()
    self$batches <- 0L
    self$loss_sum <- 0
  },
  on_train_batch_end = function(batch, logs = NULL) {
    self$batches <- self$batches + 1L
    self$loss_sum <- self$loss_sum + logs$loss
  },
  get_state = function() list(batches = self$batches, loss_sum = self$loss_sum),
  set_state = function(state) {
    self$batches <- as.integer(state$batches)
    self$loss_sum <- state$loss_sum
  }
)

step_now <- function(model) as.integer(model$optimizer$iterations$numpy())
Fault <- Callback(
  "Fault",
  on_train_batch_begin = function(batch, logs = NULL) {
    if (step_now(self$model) + 1L == fault("TERM_AT_STEP")) tools::pskill(Sys.getpid(), tools::SIGTERM)
  },
  on_train_batch_end = function(batch, logs = NULL) {
    if (step_now(self$model) == fault("KILL_AT_STEP")) tools::pskill(Sys.getpid(), tools::SIGKILL)
  },
  on_epoch_begin = function(epoch, logs = NULL) {  # keras3 counts epochs from 1
    if (fault("KILL_AFTER_EPOCH") >= 0L && epoch - 1L == fault("KILL_AFTER_EPOCH") + 1L) {
      repeat {  # the epoch-end checkpoint, committed (in the background)
        latest <- latest_checkpoint(ckpt)
        if (!is.null(latest) && latest$global_step == step_now(self$model)) tools::pskill(Sys.getpid(), tools::SIGKILL)
        Sys.sleep(0.02)
      }
    }
  }
)

tensorboard_records <- reticulate::py_run_string("
import pathlib, tensorflow as tf
def tensorboard_records(log_dir):
    records = {}
    for events in sorted(pathlib.Path(log_dir).rglob('events.out.tfevents.*'), key=lambda p: (p.stat().st_mtime_ns, p.name)):
        if events.parent.name == 'kerasdist':
            continue
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == 'scalars':
                    records[f'{events.parent.name} {value.tag} {event.step}'] = float(tf.make_ndarray(value.tensor))
    return records
", convert = TRUE)$tensorboard_records

train_run <- function(trainer, run_dir) {
  ckpt <<- file.path(run_dir, "ckpt")
  keras$utils$set_random_seed(7L)
  counter <- UserCounter()
  early_stopping <- callback_early_stopping(monitor = "loss", patience = 3, min_delta = 10, restore_best_weights = TRUE)
  callbacks <- list(
    early_stopping,
    callback_reduce_lr_on_plateau(monitor = "loss", patience = 1, factor = 0.5, min_delta = 10),
    callback_model_checkpoint(file.path(run_dir, "best.keras"), save_best_only = TRUE, monitor = "loss", mode = "max"),
    callback_tensorboard(file.path(run_dir, "logs"), update_freq = 5),
    callback_csv_logger(file.path(run_dir, "history.csv")),
    counter,
    Fault()
  )

  if (trainer == "distributed_fit") {
    history <- distributed_fit(build_model, x, y, epochs = 8, checkpoint_dir = ckpt, strategy = "default",
                               batch_size = 16, seed = 7, every_steps = 5, callbacks = callbacks, verbose = 0)
    model <- history$model
  } else {
    model <- make_or_restore_model(ckpt, build_model)
    latest <- latest_checkpoint(ckpt)
    start <- if (is.null(latest)) 0L else latest$epoch
    stream <- make_dataset(x, y, batch_size = 16, seed = 7, initial_epoch = start, epochs = 8)
    model |> fit(stream, epochs = 8, initial_epoch = start + 1L, steps_per_epoch = 20, verbose = 0,
                 callbacks = c(callbacks, checkpoint_callback(ckpt)))
  }

  np <- reticulate::import("numpy", convert = FALSE)
  save_weights_npz <- function(weights, path) invisible(do.call(np$savez, c(list(path), weights)))
  save_weights_npz(model$get_weights(), file.path(run_dir, "weights.npz"))
  save_weights_npz(load_model(file.path(run_dir, "best.keras"), compile = FALSE)$get_weights(),
                   file.path(run_dir, "best.npz"))
  newest <- latest_checkpoint(ckpt)
  save_weights_npz(load_model(file.path(newest$path, "model.keras"), compile = FALSE)$get_weights(),
                   file.path(run_dir, "newest.npz"))
  records <- tensorboard_records(file.path(run_dir, "logs"))
  result <- list(steps = step_now(model), learning_rate = as.numeric(model$optimizer$learning_rate$numpy()),
                 stopped_epoch = early_stopping$stopped_epoch,
                 counter = list(batches = counter$batches, loss_sum = counter$loss_sum),
                 newest_checkpoint = newest$global_step, tensorboard = records[order(names(records))])
  writeLines(jsonlite::toJSON(result, auto_unbox = TRUE, digits = NA), file.path(run_dir, "result.json"))
}

for (run in seq_len(ncol(runs))) {
  set_fault(runs[[3, run]])
  train_run(runs[[1, run]], runs[[2, run]])
  cat("done", runs[[2, run]], "\n")
}
