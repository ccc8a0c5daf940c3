# One worker of a multi-worker run whose strategy the R user made with TensorFlow's own API, then
# trained with keras3's fit() and with distributed_fit(): library(kerasdist) is all it adds.
# usage: Rscript user_strategy.R OUT_DIR
# The strategy comes before library(keras3): keras3 starts TensorFlow when Python's keras is
# imported, and a MultiWorkerMirroredStrategy must be created before that.
library(kerasdist)
out_dir <- commandArgs(trailingOnly = TRUE)[[1]]
strategy <- tensorflow::tf$distribute$MultiWorkerMirroredStrategy()
library(keras3)

build_model <- function() {
  set_random_seed(3)
  keras_model_sequential(input_shape = 4) |>
    layer_dense(8, activation = "relu") |>
    layer_dense(1) |>
    compile(optimizer = optimizer_sgd(0.05), loss = "mse")
}

set.seed(1)
x <- matrix(runif(64 * 4), ncol = 4)
y <- x %*% c(1, -2, 0.5, 3)
dataset <- tensorflow::tf$data$Dataset$from_tensor_slices(
  reticulate::tuple(reticulate::np_array(x, dtype = "float32"), reticulate::np_array(y, dtype = "float32"))
)$batch(16L)

with(strategy$scope(), model <- build_model())
history <- model |> fit(dataset, epochs = 2, verbose = 0)
fitted <- distributed_fit(build_model, x, y, strategy = strategy, epochs = 2, batch_size = 16,
                          checkpoint_dir = file.path(out_dir, "ckpt"), verbose = 0)
context <- run_context(strategy)
writeLines(format(c(history$metrics$loss, fitted$metrics$loss), digits = 17),
           file.path(out_dir, sprintf("losses-%d.txt", context$task_index)))
cat(sprintf("%s kind %s, chief %s\n", context$task, context$kind, context$is_chief))
