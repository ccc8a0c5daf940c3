# A seeded run from R that can be killed at any step and restarted (tools/kill_resume.py --r,
# tests/testthat/test-reliability.R).
# usage: Rscript train_resumable.R CHECKPOINT_DIR OUT.npz [default|mirrored] [CHECKPOINT_DIR OUT.npz STRATEGY]...
# distributed_fit (320 samples, global batch 32: 20 steps, a checkpoint every step) on the default
# strategy or mirrored on 2 simulated CPU devices; prints "step G" after every optimizer step and
# writes the final weights to OUT.npz. Further triples are more runs, one after another in this
# process (one TensorFlow start-up for all), each preceded by the line "run OUT.npz". With
# KILL_AT_STEP=S it SIGKILLs itself once step S is saved.
library(kerasdist)
args <- commandArgs(trailingOnly = TRUE)
if (length(args) == 2) args <- c(args, "default")
runs <- split(args, ceiling(seq_along(args) / 3))
if ("mirrored" %in% vapply(runs, `[[`, "", 3)) simulate_devices(2)  # before keras3 starts TensorFlow
library(keras3)
kill_at <- as.integer(Sys.getenv("KILL_AT_STEP", "0"))

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

train <- function(checkpoint_dir, out, strategy) {
  reticulate::import("keras")$utils$set_random_seed(2026L)
  latest <- latest_checkpoint(checkpoint_dir)
  step <- if (is.null(latest)) 0L else latest$global_step
  print_step <- callback_lambda(
    on_train_batch_end = function(batch, logs) {
      step <<- step + 1L
      cat("step", step, "\n")
      flush(stdout())
    },
    on_train_batch_begin = function(batch, logs) {
      if (kill_at > 0 && step >= kill_at) {
        # killed once step `kill_at` is checkpointed (the checkpoint callback runs after this one
        # at a batch's end): its background write done
        reticulate::import("kerasdist.checkpoint.background")$wait_for_all()
        tools::pskill(Sys.getpid(), tools::SIGKILL)
      }
    }
  )
  history <- distributed_fit(build_model, x, y, epochs = 2, checkpoint_dir = checkpoint_dir,
                             strategy = strategy, batch_size = 32, seed = 2026, every_steps = 1,
                             keep = 2, callbacks = list(print_step), verbose = 0)
  np <- reticulate::import("numpy", convert = FALSE)
  invisible(do.call(np$savez, c(list(out), history$model$get_weights())))
}

for (run in runs) {
  if (length(runs) > 1) cat("run", run[[2]], "\n")
  train(run[[1]], run[[2]], run[[3]])
}
cat("done\n")
