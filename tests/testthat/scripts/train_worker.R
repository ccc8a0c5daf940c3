# One worker of a multi-worker run from R (TF_CONFIG set by launch()).
# usage: Rscript train_worker.R CHECKPOINT_DIR OUT_PREFIX
# select_strategy() comes before library(keras3): keras3's load hook starts TensorFlow, and
# MultiWorkerMirroredStrategy must be created before that.
library(kerasdist)
args <- commandArgs(trailingOnly = TRUE)
checkpoint_dir <- args[[1]]
out_prefix <- args[[2]]

strategy <- select_strategy()
library(keras3)
description <- describe_strategy(strategy)
tf <- reticulate::import("tensorflow")

build_model <- function() {
  keras_model_sequential(input_shape = 4) |>
    layer_dense(8, activation = "relu") |>
    layer_dense(1) |>
    compile(optimizer = optimizer_sgd(0.05), loss = "mse")
}

set.seed(1)
x <- matrix(rnorm(64 * 4), ncol = 4)
y <- x %*% c(1, -2, 0.5, 3)
dataset <- tf$data$Dataset$from_tensor_slices(reticulate::tuple(
  reticulate::np_array(x, dtype = "float32"), reticulate::np_array(y, dtype = "float32")
))$batch(16L)

with(strategy$scope(), {
  model <- make_or_restore_model(checkpoint_dir, build_model)
})
outside <- run_context()  # outside the scope: this process's place in the cluster
notes <- chief_path(file.path(dirname(out_prefix), "notes.txt"))
writeLines(description$task, notes)
history <- resume_fit(model, dataset, 2L, checkpoint_callback(checkpoint_dir), verbose = 0L,
                      callbacks = list(callback_csv_logger(file.path(dirname(out_prefix), "log.csv"))))
weights <- unlist(lapply(get_weights(model), as.numeric))
task <- gsub(":", "-", description$task)
writeLines(format(weights, digits = 17), paste0(out_prefix, "-", task, ".txt"))
cat(sprintf("%s trained %d epochs, chief: %s\n", description$task, length(history$metrics$loss), description$is_chief))
writeLines(c(outside$task, outside$is_chief, outside$num_workers, notes), paste0(out_prefix, "-", task, "-outside.txt"))
