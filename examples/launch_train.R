# A training script for the launcher: every worker runs this same file.
#
#   Rscript -e 'kerasdist::launch(c("examples/launch_train.R", "--epochs", "5"), num_workers = 2)'
#
# select_strategy() reads the TF_CONFIG the launcher gives each process and picks "multi_worker";
# the chief (worker 0) writes a checkpoint every epoch, so a group the launcher restarts after a
# failure resumes from the newest one instead of starting over. A tiny regression model, a few
# seconds of training; each worker prints one line. Its Python twin is launch_train.py.
# usage: launch_train.R [--epochs N] [--checkpoint-dir DIR]
library(kerasdist)             # keras3 comes after select_strategy(), see below

args <- commandArgs(trailingOnly = TRUE)
option <- function(name, default) {
  at <- match(name, args)
  if (is.na(at)) default else args[[at + 1L]]
}
epochs <- as.integer(option("--epochs", 5L))
checkpoint_dir <- option("--checkpoint-dir", "ckpt")   # only the chief reads and writes it: need not be shared

strategy <- select_strategy()   # first: multi-worker must be set up before TensorFlow starts,
library(keras3)                 # and keras3's load hook starts it
tf <- reticulate::import("tensorflow")

build_model <- function() {
  keras_model_sequential(input_shape = 4) |>
    layer_dense(8, activation = "relu") |>
    layer_dense(1) |>
    compile(optimizer = optimizer_sgd(0.05), loss = "mse")
}

set.seed(0)
x <- matrix(rnorm(128 * 4), ncol = 4)
y <- x %*% c(1, -2, 0.5, 3)
dataset <- tf$data$Dataset$from_tensor_slices(reticulate::tuple(
  reticulate::np_array(x, dtype = "float32"), reticulate::np_array(y, dtype = "float32")
))$batch(16L)                   # the global batch, split over the workers

model <- make_or_restore_model(checkpoint_dir, build_model, strategy = strategy)
history <- resume_fit(model, dataset, epochs, checkpoint_dir, verbose = 0L)
loss <- history$metrics$loss
cat(sprintf("trained %d epochs on %d replicas, loss %.3f -> %.3f\n",
            length(loss), strategy$num_replicas_in_sync, loss[[1]], loss[[length(loss)]]))
