# Runs of 2 workers from R (TF_CONFIG set by launch()), one after another in each worker's one
# process (each R process starting TensorFlow costs about 12 s of CPU), with the step watchdog's
# hang_timeout HANG_TIMEOUT passed through distributed_fit's `...`. In a run whose HANG_STEP is not
# 0, worker 1 blocks for good in an R callback at the end of that step on the launcher's first
# attempt. A run whose weights this worker wrote on an earlier attempt is not run again.
# usage: Rscript train_hang.R HANG_TIMEOUT CHECKPOINT_DIR OUT_DIR HANG_STEP [CHECKPOINT_DIR OUT_DIR HANG_STEP]...
# The stuck process writes the time it blocked to OUT_DIR/hung-at. Each worker writes its final
# weights to OUT_DIR/weights-<task>.txt.
library(kerasdist)
args <- commandArgs(trailingOnly = TRUE)
hang_timeout <- as.numeric(args[[1]])
runs <- split(args[-1], ceiling(seq_along(args[-1]) / 3))

strategy <- select_strategy()   # before keras3 starts TensorFlow
library(keras3)
tf <- reticulate::import("tensorflow")
tf$config$experimental$enable_op_determinism()
set.seed(0)
x <- matrix(rnorm(320 * 4), ncol = 4)
y <- tanh(x %*% c(0.5, -1, 0.25, 1))

build_model <- function() {
  keras_model_sequential(input_shape = 4) |>
    layer_dense(8, activation = "tanh") |>
    layer_dense(1) |>
    compile(optimizer = optimizer_sgd(0.05), loss = "mse")
}

task <- describe_strategy(strategy)$task
first_attempt <- Sys.getenv("KERASDIST_RESTART") == "0"

train <- function(checkpoint_dir, out_dir, hang_step) {
  weights_file <- file.path(out_dir, sprintf("weights-%s.txt", sub(":", "-", task)))
  if (file.exists(weights_file)) return(invisible())
  dir.create(out_dir, showWarnings = FALSE, recursive = TRUE)
  Hang <- Callback("Hang", on_train_batch_end = function(batch, logs = NULL) {
    step <- as.integer(self$model$optimizer$iterations$numpy())
    if (hang_step > 0 && first_attempt && task == "worker:1" && step >= hang_step) {
      writeLines(format(as.numeric(Sys.time()), digits = 15), file.path(out_dir, "hung-at"))
      Sys.sleep(1e6)   # R code that never returns
    }
  })
  set_random_seed(2026)
  history <- distributed_fit(build_model, x, y, epochs = 2, checkpoint_dir = checkpoint_dir,
                             strategy = strategy, batch_size = 32, seed = 2026, every_steps = 1, keep = 2,
                             callbacks = list(Hang()), verbose = 0, hang_timeout = hang_timeout)
  weights <- unlist(lapply(get_weights(history$model), as.numeric))
  writeLines(format(weights, digits = 17), weights_file)
}

for (run in runs) train(run[[1]], run[[2]], as.integer(run[[3]]))
cat(sprintf("%s done\n", task))
