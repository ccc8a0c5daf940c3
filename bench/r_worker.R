# The R side of bench/bench_r_python.py: kerasdist::distributed_fit on a plain R matrix.
#
# Reads the data the driver wrote (x: n x p doubles, column-major; y: n labels, as doubles) into
# an R numeric matrix and an R integer vector, builds the model with an R function calling Keras
# through reticulate (as the README's R example does), warms up with one 1-epoch call, prints
# READY, then answers each "run K" line on stdin with one timed call (a fresh checkpoint
# directory, keras seed 0 set before the clock starts) and a line RESULT {"run", "seconds",
# "loss"}; "quit" (or end of input) stops it. Only the distributed_fit call is timed: the R
# matrix's conversion is inside it.
#
#   Rscript bench/r_worker.R DATA_DIR N P EPOCHS BATCH      (started by bench/bench_r_python.py)

args <- commandArgs(trailingOnly = TRUE)
data_dir <- args[[1]]
n <- as.integer(args[[2]])
p <- as.integer(args[[3]])
epochs <- as.integer(args[[4]])
batch <- as.integer(args[[5]])
suppressMessages(library(keras3))
suppressMessages(library(kerasdist))

read_doubles <- function(name, count) {
  con <- file(file.path(data_dir, name), "rb")
  on.exit(close(con))
  readBin(con, "double", count, size = 8L, endian = "little")
}

build_model <- function() {
  keras_model_sequential(input_shape = p) |>
    layer_dense(256, activation = "relu") |>
    layer_dense(256, activation = "relu") |>
    layer_dense(10, activation = "softmax") |>
    compile(optimizer = "adam", loss = "sparse_categorical_crossentropy")
}

fit_once <- function(x, y, run, fit_epochs) {
  checkpoint_dir <- file.path(data_dir, sprintf("r-%s", run))
  set_random_seed(0L)
  start <- proc.time()[["elapsed"]]
  history <- distributed_fit(build_model, x, y, epochs = fit_epochs, checkpoint_dir = checkpoint_dir,
                             strategy = "default", batch_size = batch, seed = 0L, verbose = 0L)
  seconds <- proc.time()[["elapsed"]] - start
  list(seconds = seconds, loss = tail(history$metrics$loss, 1))
}

x <- matrix(read_doubles("x.bin", n * p), n, p)
y <- as.integer(read_doubles("y.bin", n))
invisible(fit_once(x, y, "warmup", 1L))
cat("READY\n")
flush(stdout())
con <- file("stdin", "r")
repeat {
  line <- readLines(con, n = 1)
  if (length(line) == 0 || line == "quit") break
  run <- sub("^run ", "", line)
  result <- fit_once(x, y, run, epochs)
  cat(sprintf('RESULT {"run": %s, "seconds": %.4f, "loss": %.8f}\n', run, result$seconds, result$loss))
  flush(stdout())
}
