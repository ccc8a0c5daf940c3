# The main job from R: the same run as `python -m kerasdist demo`, made of the R API.

#' The main job: distributed training on the bundled digits, killed and resumed
#'
#' The R twin of `python -m kerasdist demo`, built from the R API: splits the
#' CPU into 2 devices ([simulate_devices()]), lets [select_strategy()] pick
#' MirroredStrategy, and trains a small CNN (an R build function) on
#' [load_digits()] with [distributed_fit()], checkpointing every epoch and every
#' 5 steps. The first run is a child R process that SIGKILLs itself in the
#' middle of an epoch, a few steps after a checkpoint; this R session then
#' makes the same [distributed_fit()] call, which restores the newest checkpoint
#' and continues at the next batch. Prints progress all along, then the test
#' accuracy on the 297 held-out digits, and writes `curves.png` (loss and
#' accuracy per epoch with the kill and the resume point marked, drawn by
#' Python's matplotlib), `log.csv` and `result.json` in `run_dir`.
#'
#' Call it in a fresh R session: the 2 CPU devices must be set up before
#' TensorFlow starts (before any keras3 function runs; `library(keras3)` first
#' is fine).
#'
#' @param run_dir Directory for `checkpoints/`, `log.csv`, `curves.png` and
#'   `result.json`; its checkpoints are cleared first.
#' @param epochs Total epochs (at least 1); the kill happens in the middle of
#'   epoch `epochs %/% 2 + 1`.
#' @returns A list, invisibly: `strategy`, `replicas`, `killed_at`,
#'   `resumed_from`, `epochs`, `optimizer_steps`, `test_loss`, `test_accuracy`,
#'   `png` and `wall_seconds`.
#' @family training
#' @seealso Python: `python -m kerasdist demo` (`kerasdist.kerasdist_demo()`);
#'   [distributed_fit()], [load_digits()].
#' @examples
#' \dontrun{
#' result <- kerasdist_demo("runs/demo-r", epochs = 6)
#' result$test_accuracy
#' }
#' @export
kerasdist_demo <- function(run_dir = "runs/demo-r", epochs = 6L) {
  started <- Sys.time()
  # The CPU split first, at kerasdist's import (before keras3 or anything else starts TensorFlow's
  # devices); then Python checks `epochs` (kill_point()), before any work.
  split_cpu_at_import(2L)
  py_demo <- demo_module()
  kill <- as.integer(unlist(call_python(py_demo$kill_point, epochs = epochs, call = sys.call())))
  epochs <- as_py(epochs, "count")
  simulate_devices(2L)
  call_python(py_demo$fresh_run_dir, path.expand(run_dir))
  steps <- py_demo$steps_per_epoch()

  cat(sprintf("== kerasdist demo (R): %d epoch(s) of a CNN on the UCI digits, run directory %s\n", epochs, run_dir))
  cat(sprintf("== run 1 (child R process): will be killed with SIGKILL at epoch %d, step %d\n", kill[1] + 1L, kill[2]))
  code <- sprintf("kerasdist:::demo_train(%s, %dL, kill_at = c(%dL, %dL))", deparse(run_dir), epochs, kill[1], kill[2])
  status <- system2(file.path(R.home("bin"), "Rscript"), c("--vanilla", "-e", shQuote(code)))
  cat(sprintf("== run 1 ended with status %d (%s)\n", status, if (status == 137L) "killed by SIGKILL" else "not killed"))
  if (status != 137L) stop("the demo's training process was to be killed, but it ended with status ", status, call. = FALSE)

  latest <- latest_checkpoint(file.path(run_dir, "checkpoints"))
  resume <- if (is.null(latest)) c(0L, 0L, 0L) else c(latest$epoch, latest$step_in_epoch, latest$global_step)
  cat(sprintf(
    "== run 2 (this R session): newest checkpoint is epoch %d, step %d (global step %d): the %d steps after it were lost; training continues at the next batch\n",
    resume[1] + 1L, resume[2], resume[3], kill[2] - resume[2]
  ))
  trained <- demo_train(run_dir, epochs, resume = resume[1:2])
  history <- trained$history
  model <- history$model
  digits <- demo_digits()
  scores <- unlist(model$evaluate(digits$x_test, as_py(digits$y_test, "data"), batch_size = as.integer(py_demo$BATCH_SIZE), verbose = 0L))
  cat(sprintf("== test accuracy %.4f (loss %.4f) on %d held-out digits\n", scores[2], scores[1], length(digits$y_test)))
  png <- py_demo$plot_curves(
    history$metrics, file.path(run_dir, "curves.png"), steps = steps,
    kill = reticulate::tuple(kill[1], kill[2]), resume = reticulate::tuple(resume[1], resume[2])
  )
  result <- list(
    strategy = trained$strategy$kind, replicas = trained$strategy$num_replicas,
    killed_at = list(epoch = kill[1], step_in_epoch = kill[2]),
    resumed_from = list(epoch = resume[1], step_in_epoch = resume[2], global_step = resume[3]),
    epochs = length(history$metrics$loss), optimizer_steps = as.integer(model$optimizer$iterations$numpy()),
    test_loss = scores[1], test_accuracy = scores[2], png = as.character(png),
    wall_seconds = round(as.numeric(difftime(Sys.time(), started, units = "secs")), 1)
  )
  json <- reticulate::import("json")
  writeLines(json$dumps(result, indent = 2L), file.path(run_dir, "result.json"))
  cat(sprintf("== wrote %s and %s; %d optimizer steps in %d epochs, %.1f s in all\n", result$png,
              file.path(run_dir, "result.json"), result$optimizer_steps, result$epochs, result$wall_seconds))
  invisible(result)
}

demo_module <- function() {
  kerasdist_module()
  reticulate::import("kerasdist.demo")
}

# The first 1,500 digits train (distributed_fit holds out the last 10% of them for validation);
# the last 297 are the test set.
demo_digits <- function() {
  digits <- load_digits()
  n_test <- demo_module()$TEST_SAMPLES
  train <- seq_len(length(digits$y) - n_test)
  list(
    x = digits$x[train, , , , drop = FALSE], y = digits$y[train],
    x_test = digits$x[-train, , , , drop = FALSE], y_test = digits$y[-train]
  )
}

demo_build_model <- function() {
  keras3::set_random_seed(1L)
  # Built-in loss and metric names: R functions cannot run on the replica threads.
  keras3::keras_model_sequential(input_shape = c(8, 8, 1)) |>
    keras3::layer_conv_2d(16, 3, padding = "same", activation = "relu") |>
    keras3::layer_max_pooling_2d() |>
    keras3::layer_conv_2d(32, 3, padding = "same", activation = "relu") |>
    keras3::layer_flatten() |>
    keras3::layer_dense(10, activation = "softmax") |>
    keras3::compile(optimizer = keras3::optimizer_adam(0.005), loss = "sparse_categorical_crossentropy",
                    metrics = "accuracy")
}

# One distributed_fit call, the same in the killed run (kill_at = c(epoch, step), 0-based epoch)
# and in the resumed one (resume = the checkpoint's c(epoch, step), to number the steps).
demo_train <- function(run_dir, epochs, kill_at = NULL, resume = c(0L, 0L)) {
  simulate_devices(2L)
  strategy <- select_strategy("auto")
  description <- describe_strategy(strategy)
  cat(sprintf("strategy %s with %d replicas (%s): %s\n", description$kind, description$num_replicas,
              paste(unlist(description$devices), collapse = ", "), description$reason))
  py_demo <- demo_module()
  # The step numbers and the lines are Python's (kerasdist.demo), with its 0-based epochs and
  # batches; keras3 hands R callbacks 1-based numbers.
  current_epoch <- 0L
  killing <- FALSE
  # As the Python demo does: SIGKILL at the next hook, once the checkpoint callback (after this
  # one) has taken the step; its background write may still be going on a loaded machine: wait
  # for it so the demo resumes where it says.
  kill_if_due <- function() {
    if (killing) {
      reticulate::import("kerasdist.checkpoint.background")$wait_for_all()
      tools::pskill(Sys.getpid(), tools::SIGKILL)
    }
  }
  progress <- keras3::callback_lambda(
    on_epoch_begin = function(epoch, logs) {
      current_epoch <<- as.integer(epoch) - 1L
      kill_if_due()
    },
    on_train_batch_begin = function(batch, logs) kill_if_due(),
    on_train_batch_end = function(batch, logs) {
      step <- py_demo$step_in_epoch(current_epoch, as.integer(batch) - 1L, as.list(resume))
      line <- py_demo$step_line(current_epoch, step, logs)
      if (!is.null(line)) cat(line, "\n", sep = "")
      if (!is.null(kill_at) && current_epoch == kill_at[1] && step == kill_at[2]) {
        cat(py_demo$kill_line(current_epoch, step), "\n", sep = "")
        flush(stdout())
        killing <<- TRUE
      }
    },
    on_epoch_end = function(epoch, logs) cat(py_demo$epoch_line(as.integer(epoch) - 1L, logs), "\n", sep = "")
  )
  digits <- demo_digits()
  history <- distributed_fit(
    demo_build_model, digits$x, digits$y, epochs = epochs,
    checkpoint_dir = file.path(run_dir, "checkpoints"), strategy = strategy,
    batch_size = py_demo$BATCH_SIZE, seed = py_demo$SEED, validation_split = py_demo$VALIDATION_SPLIT,
    every_steps = py_demo$EVERY_STEPS, keep = 3L,
    callbacks = list(progress, keras3::callback_csv_logger(file.path(run_dir, "log.csv"), append = TRUE)),
    verbose = 0L
  )
  list(history = history, strategy = description)
}
