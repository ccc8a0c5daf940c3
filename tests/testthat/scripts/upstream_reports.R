# One worker of the R museum of upstream reports met under MultiWorkerMirroredStrategy, written
# the keras3 way: TensorFlow's multi-worker tutorial (keras-team/keras#20585: the user's own
# strategy and plain fit()) and a model with named (dict) inputs (keras-team/keras#20329). Both
# fail in Keras 3.15 as released (tests/python/test_upstream_reports.py holds the canaries);
# library(kerasdist) is all this script adds.
# usage: Rscript upstream_reports.R OUT_DIR   (launched as 2 workers; test-upstream-reports.R
# sources it alone, one worker, as their reference)
library(kerasdist)
out_dir <- commandArgs(trailingOnly = TRUE)[[1]]
strategy <- tensorflow::tf$distribute$MultiWorkerMirroredStrategy()  # before library(keras3)
library(keras3)

set.seed(1)
x <- matrix(runif(64 * 4), ncol = 4)
y <- x %*% c(1, -2, 0.5, 3)
f32 <- function(a) reticulate::np_array(a, dtype = "float32")

# the tutorial: a model built in the strategy's scope, fit() on a dataset of global batches
tutorial_model <- function() {
  set_random_seed(3)
  keras_model_sequential(input_shape = 4) |>
    layer_dense(8, activation = "relu") |>
    layer_dense(1) |>
    compile(optimizer = optimizer_sgd(0.05), loss = "mse")
}
dataset <- tensorflow::tf$data$Dataset$from_tensor_slices(reticulate::tuple(f32(x), f32(y)))$batch(16L)
with(strategy$scope(), model <- tutorial_model())
tutorial <- model |> fit(dataset, epochs = 2, verbose = 0)

# dict inputs: named inputs, a dataset of (list(a =, b =), y)
dict_model <- function() {
  set_random_seed(4)
  a <- keras_input(shape = 3, name = "a")
  b <- keras_input(shape = 1, name = "b")
  output <- layer_concatenate(list(a, b)) |> layer_dense(8, activation = "relu") |> layer_dense(1)
  keras_model(inputs = list(a = a, b = b), outputs = output) |>
    compile(optimizer = optimizer_sgd(0.05), loss = "mse")
}
features <- list(a = f32(x[, 1:3]), b = f32(x[, 4, drop = FALSE]))
dict_data <- tensorflow::tf$data$Dataset$from_tensor_slices(reticulate::tuple(features, f32(y)))$batch(16L)
with(strategy$scope(), model <- dict_model())
dict_inputs <- model |> fit(dict_data, epochs = 2, verbose = 0)

context <- run_context(strategy)
writeLines(format(c(tutorial$metrics$loss, dict_inputs$metrics$loss), digits = 17),
           file.path(out_dir, sprintf("losses-%s.txt", if (context$num_workers > 1) context$task_index else "single")))
