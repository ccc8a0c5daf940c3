# The data users bring, from R (tests/cases/user_data.json's kinds with `r`: true), built the way
# keras3's guides build it (tfdatasets, keras3's image_dataset_from_directory), trained under 2
# CPU replicas; test-user-data.R compares uninterrupted and resumed runs.
# usage: Rscript train_user_data.R JOB [JOB ...], a JOB: [--kill-at STEP | --sigterm-at STEP]
#        TRAINER ROOT KIND[,KIND...]
# Each kind trains in ROOT/KIND (a checkpoint every 4 steps, all kept) and writes ROOT/KIND/result.npz
# (the weights, the loss history) and ROOT/KIND/warnings.txt (the data warnings). --kill-at
# SIGKILLs the process after that step's checkpoint is written (its job's first kind);
# --sigterm-at preempts each kind's run of its job at that step (kerasdist_preempted, noted in
# ROOT/KIND/preempted) and goes on. The jobs run one after the other in this one process (each R
# process starting TensorFlow costs about 12 s of CPU), each printing "done ROOT" when it ends.
library(kerasdist)
simulate_devices(2)  # before keras3 starts TensorFlow
library(keras3)
library(tfdatasets)

# The jobs of the command line: list(trainer, root, kinds, kill_at, sigterm_at) each (0: no interruption).
read_jobs <- function(args) {
  jobs <- list()
  at <- c("--kill-at" = 0L, "--sigterm-at" = 0L)
  while (length(args) > 0L) {
    if (args[[1]] %in% names(at)) {
      at[[args[[1]]]] <- as.integer(args[[2]])
      args <- args[-(1:2)]
      next
    }
    jobs[[length(jobs) + 1L]] <- list(trainer = args[[1]], root = args[[2]], kinds = strsplit(args[[3]], ",")[[1]],
                                      kill_at = at[["--kill-at"]], sigterm_at = at[["--sigterm-at"]])
    at[] <- 0L
    args <- args[-(1:3)]
  }
  jobs
}
jobs <- read_jobs(commandArgs(trailingOnly = TRUE))
# each job's, set below: dataset(), image_folder(), train() and Interrupt read them
trainer <- root <- NULL
kill_at <- sigterm_at <- 0L
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
for (job in jobs) {
  trainer <- job$trainer
  root <- job$root
  kill_at <- job$kill_at
  sigterm_at <- job$sigterm_at
  train_kinds(job$kinds)
  cat("done", root, "\n")
}
