# kerasdist on Ray Train, driven from R: the same run as train.py, started from R through reticulate.
#
#   KERASDIST_PYTHON=.venv/bin/python Rscript examples/ray/train.R --address 10.0.0.1:6379 \
#     --storage-path /shared/ray --name digits
#
# Ray's workers are Python processes: the training function they run is train.py's `train_fn`
# (Python, kerasdist's distributed_fit), never R code. What R does is drive the run: train.py's
# `run()` builds Ray's TensorflowTrainer and fits it, and its `Result` comes back to R (the last
# epoch's metrics, kerasdist's newest checkpoint). The same --name and --storage-path resume a
# run that stopped (a new driver: Ray hands the workers its newest reported checkpoint, kerasdist
# resumes at the next unseen batch). The Python must have Ray (pip install 'kerasdist[ray]').
# usage: train.R --storage-path DIR [--address HOST:PORT] [--node-ip-address IP] [--name NAME]
#                [--workers N | MIN-MAX] [--epochs N] [--max-failures N] [--every-steps N]
#                [--step-seconds S] [--out-dir DIR]
args <- commandArgs(trailingOnly = TRUE)
option <- function(name, default = NULL) {
  at <- match(name, args)
  if (is.na(at)) default else args[[at + 1L]]
}
python <- Sys.getenv("KERASDIST_PYTHON")
if (nzchar(python)) reticulate::use_python(python, required = TRUE)

file_arg <- grep("^--file=", commandArgs(FALSE), value = TRUE)
here <- if (length(file_arg)) dirname(normalizePath(sub("^--file=", "", file_arg))) else "."
train <- reticulate::import_from_path("train", path = here)

storage_path <- option("--storage-path")
if (is.null(storage_path)) stop("--storage-path is required: a directory every Ray node reaches, or s3://")
workers <- strsplit(option("--workers", "2"), "-", fixed = TRUE)[[1]]
result <- train$run(
  storage_path, option("--name", "kerasdist-ray"),
  address = option("--address"), node_ip_address = option("--node-ip-address"),
  workers = if (length(workers) == 2) reticulate::tuple(as.list(as.integer(workers))) else as.integer(workers),
  epochs = as.integer(option("--epochs", 3L)), max_failures = as.integer(option("--max-failures", 3L)),
  every_steps = as.integer(option("--every-steps", 5L)), step_seconds = as.numeric(option("--step-seconds", 0)),
  out_dir = option("--out-dir", "out"))

metrics <- result$metrics   # an R list: loss, epoch
cat(sprintf("metrics epoch %d loss %.17g\n", as.integer(metrics$epoch), metrics$loss))
cat("checkpoint", result$checkpoint$path, "\n")
# Disconnect from Ray now, not at R's exit: Ray 2.60's driver once aborted in its teardown on a
# notice of the trainer's finished actors ("Given death cause case 3 doesn't exist"), after the
# run had ended and reported.
reticulate::import("ray")$shutdown()
