# The R training script of the Slurm recipe: every task of the job step runs this file.
#
#   sbatch examples/slurm/train.sbatch Rscript examples/slurm/train.R --checkpoint-dir /shared/ckpt
#
# select_strategy() sees the Slurm step (more than one task) and picks "multi_worker";
# distributed_fit restores the newest checkpoint in --checkpoint-dir (or builds the model), trains
# to --epochs in total (or to --stop-after-step steps) and saves a checkpoint every --every-steps
# steps (the chief writes). On SIGTERM every task stops after one agreed step, the chief saves it,
# and every task exits 75: train.sbatch then requeues the job, which resumes at the next batch.
# Each task writes its final weights to --out-dir/weights-task<SLURM_PROCID>.npz. A tiny
# regression model on seeded data (320 samples, global batch 32: 10 steps an epoch). Its Python
# twin is train.py.
# usage: train.R [--checkpoint-dir DIR] [--out-dir DIR] [--epochs N] [--every-steps N]
#                [--step-seconds S] [--stop-after-step N]
library(kerasdist)             # keras3 comes after select_strategy(), see below

args <- commandArgs(trailingOnly = TRUE)
option <- function(name, default) {
  at <- match(name, args)
  if (is.na(at)) default else args[[at + 1L]]
}
checkpoint_dir <- option("--checkpoint-dir", "ckpt")
out_dir <- option("--out-dir", ".")
epochs <- as.integer(option("--epochs", 3L))
every_steps <- as.integer(option("--every-steps", 1L))
step_seconds <- as.numeric(option("--step-seconds", 0))   # stretches a demo so a signal lands mid-run
# end this job once N steps are trained in total (a checkpoint is saved there; run without it to go on)
stop_after_step <- as.integer(option("--stop-after-step", NA))

strategy <- select_strategy()   # first: multi-worker must be set up before TensorFlow starts,
library(keras3)                 # and keras3's load hook starts it
tf <- reticulate::import("tensorflow")
set_random_seed(2026)
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

latest <- latest_checkpoint(checkpoint_dir)
step <- if (is.null(latest)) 0L else latest$global_step
pace <- callback_lambda(
  on_train_batch_end = function(batch, logs) {
    step <<- step + 1L
    cat("step", step, "\n")
    flush(stdout())
  },
  # paced at the next step's start: the checkpoint callback (after this one) has taken the step
  on_train_batch_begin = function(batch, logs) if (step_seconds > 0) Sys.sleep(step_seconds)
)
StopAfterStep <- Callback("StopAfterStep", on_train_batch_end = function(batch, logs = NULL) {
  if (as.integer(self$model$optimizer$iterations$numpy()) >= stop_after_step) self$model$stop_training <- TRUE
})
callbacks <- if (is.na(stop_after_step)) list(pace) else list(pace, StopAfterStep())
history <- distributed_fit(build_model, x, y, epochs = epochs, checkpoint_dir = checkpoint_dir,
                           strategy = strategy, batch_size = 32, seed = 2026,
                           every_steps = every_steps, keep = 2, callbacks = callbacks, verbose = 0)
model <- history$model
task <- Sys.getenv("SLURM_PROCID", "0")
dir.create(out_dir, showWarnings = FALSE, recursive = TRUE)
np <- reticulate::import("numpy", convert = FALSE)
invisible(do.call(np$savez, c(list(file.path(out_dir, sprintf("weights-task%s.npz", task))),
                              model$get_weights())))
cat(sprintf("task %s done: %d replicas\n", task, strategy$num_replicas_in_sync))
