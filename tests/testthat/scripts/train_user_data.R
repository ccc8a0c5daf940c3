# The data users bring, from R (tests/cases/user_data.json's kinds with `r`: true), built the way
# keras3's guides build it (tfdatasets, keras3's image_dataset_from_directory), trained under 2
# CPU replicas; test-user-data.R compares uninterrupted and resumed runs.
# usage: Rscript train_user_data.R TRAINER ROOT KIND[,KIND...] [TRAINER ROOT KIND[,KIND...] ...]
#        [--kill-at STEP | --sigterm-at STEP]
# Each kind trains in ROOT/KIND (a checkpoint every 4 steps, all kept) and writes ROOT/KIND/result.npz
# (the weights, the loss history) and ROOT/KIND/warnings.txt (the data warnings). --kill-at
# SIGKILLs the process after that step's checkpoint is written; --sigterm-at preempts every kind's
# run at that step (kerasdist_preempted, noted in ROOT/KIND/preempted) and goes on. Several
# TRAINER ROOT KINDS triples run one after the other in this one process (each R process starting
# TensorFlow costs about 12 s of CPU).
library(kerasdist)
simulate_devices(2)  # before keras3 starts TensorFlow
library(keras3)
library(tfdatasets)

args <- commandArgs(trailingOnly = TRUE)
flag <- function(name) if (name %in% args) as.integer(args[[match(name, args) + 1]]) else 0L
kill_at <- flag("--kill-at")
sigterm_at <- flag("--sigterm-at")
flag_at <- Filter(function(at) at > 0L, match(c("--kill-at", "--sigterm-at"), args, nomatch = 0L))
job_args <- if (length(flag_at) > 0L) args[-c(flag_at, flag_at + 1L)] else args
stopifnot(length(job_args) %% 3L == 0L)
jobs <- matrix(job_args, nrow = 3L)  # a column a job: trainer, root, kinds
trainer <- root <- NULL  # each job's, set below: dataset(), image_folder() and train() read them
options(kerasdist.exit_on_preemption = FALSE)

tf <- reticulate::import("tensorflow")
tf$config$experimental$enable_op_determinism()
epochs <- 3L
set.seed(0)
x <- matrix(runif(96 * 4), ncol = 4)
y <- as.integer(floor(rowSums(x) * 1.5) %% 3)

image_folder <- function() {
  folder <- file.path(root, "files", "images")
  if (!dir.exists(folder)) {
    for (i in seq_len(nrow(x))) {
      class_dir <- file.path(folder, paste0("class_", y[[i]]))
      dir.create(class_dir, recursive = TRUE, showWarnings = FALSE)
      pixels <- outer(x[i, ], rev(x[i, ]))
      png::writePNG(array(pixels[rep(1:4, each = 2), rep(1:4, each = 2)], c(8, 8, 3)),
                    file.path(class_dir, sprintf("%02d.png", i)))
    }
  }
  folder
}

dataset <- function(kind) {
  set_random_seed(21)  # the global seed the pipeline's own seeds pair with
  slices <- tensor_slices_dataset(list(np_array(x, "float32"), y))
  switch(kind,
    "slices-batch" = slices |> dataset_batch(16),
    "shuffle-reshuffled" = slices |> dataset_shuffle(96, seed = 1) |> dataset_batch(16),
    "map-filter" = slices |>
      dataset_map(function(a, b) list(a * 2, b)) |>
      dataset_filter(function(a, b) a[1] > 0.1) |>
      dataset_shuffle(32, seed = 2) |>
      dataset_batch(16),
    # keras3's guide "Multi-GPU distributed training with TensorFlow", as it builds its data
    "guide-cache-prefetch" = slices |> dataset_shuffle(96, seed = 4) |> dataset_batch(16) |>
      dataset_cache() |> dataset_prefetch(tf$data$AUTOTUNE),
    "image-directory" = image_dataset_from_directory(image_folder(), image_size = c(8, 8), batch_size = 16,
                                                     seed = 9, verbose = FALSE),
    stop("unknown kind ", kind)
  )
}

build <- function(kind) {
  shape <- if (kind == "image-directory") c(8, 8, 3) else 4
  function() {
    set_random_seed(3)
    keras_model_sequential(input_shape = shape) |>
      layer_flatten() |>
      layer_dense(16, activation = "relu") |>
      layer_dense(3) |>
      compile(optimizer = optimizer_adam(0.01), loss = loss_sparse_categorical_crossentropy(from_logits = TRUE))
  }
}

# SIGKILL (or SIGTERM) this process once optimizer step `at` is done and its checkpoint written
Interrupt <- Callback(
  "Interrupt",
  on_train_batch_end = function(batch, logs = NULL) {
    at <- max(kill_at, sigterm_at)
    if (as.integer(self$model$optimizer$iterations$numpy()) == at) {
      if (kill_at > 0L) reticulate::import("kerasdist.checkpoint.background")$wait_for_all()
      tools::pskill(Sys.getpid(), if (kill_at > 0L) tools::SIGKILL else tools::SIGTERM)
    }
  }
)
interrupt <- function() if (max(kill_at, sigterm_at) > 0L) list(Interrupt()) else list()
current_model <- NULL

train <- function(kind, folder) {
  data <- dataset(kind)
  if (trainer == "distributed_fit") {
    return(distributed_fit(build(kind), data, epochs = epochs, checkpoint_dir = folder, every_steps = 4L,
                           keep = 100L, callbacks = interrupt(), verbose = 0))
  }
  with(select_strategy()$scope(), {
    model <- make_or_restore_model(folder, build(kind))
  })
  current_model <<- model
  checkpoint <- checkpoint_callback(folder, every_steps = 4L, keep = 100L)
  if (trainer == "resume_fit") {
    return(resume_fit(model, data, epochs, checkpoint = checkpoint, callbacks = interrupt(), verbose = 0))
  }
  stopifnot(trainer == "fit")
  model |> fit(data, epochs = epochs, callbacks = c(interrupt(), checkpoint), verbose = 0)
}

np <- reticulate::import("numpy", convert = FALSE)
train_kinds <- function(kinds) for (kind in kinds) {
  folder <- file.path(root, kind)
  said <- character()
  history <- withCallingHandlers(
    tryCatch(train(kind, folder), kerasdist_preempted = function(e) e),
    warning = function(w) {
      said <<- c(said, conditionMessage(w))
      invokeRestart("muffleWarning")
    }
  )
  dir.create(folder, recursive = TRUE, showWarnings = FALSE)
  if (inherits(history, "kerasdist_preempted")) {
    writeLines(as.character(history$status), file.path(folder, "preempted"))
    next
  }
  writeLines(said, file.path(folder, "warnings.txt"))
  model <- if (is.null(history$model)) current_model else history$model
  do.call(np$savez, c(list(file.path(folder, "result.npz")), model$get_weights(),
                      list(loss = np$array(unlist(history$metrics$loss)))))
}
for (job in seq_len(ncol(jobs))) {
  trainer <- jobs[[1, job]]
  root <- jobs[[2, job]]
  train_kinds(strsplit(jobs[[3, job]], ",")[[1]])
}
cat("done\n")
