# keras3's callbacks and an R-defined one resume as if never interrupted (tests/cases/callbacks.json,
# the rows for R): each run is scripts/train_callbacks.R in an Rscript of its own, failed as the row
# says, run again, and compared with the same run never interrupted: weights, the newest
# checkpoint, the stop step, the learning rate, ModelCheckpoint's best file, the CSV rows,
# TensorBoard's records and the R callback's state.

callbacks_script <- function() normalizePath(test_path("scripts", "train_callbacks.R"))

run_callbacks <- function(trainer, run_dir, fault = character()) {
  dir.create(run_dir, showWarnings = FALSE, recursive = TRUE)
  log <- file.path(run_dir, "console.txt")
  status <- system2(file.path(R.home("bin"), "Rscript"),
                    c("--vanilla", shQuote(callbacks_script()), trainer, shQuote(run_dir)),
                    stdout = log, stderr = log, env = c(fault, "TF_CPP_MIN_LOG_LEVEL=2"))
  list(status = status, console = paste(readLines(log, warn = FALSE), collapse = "\n"))
}

npz_arrays <- function(path) {
  saved <- reticulate::import("numpy")$load(path)
  lapply(saved$files, function(name) saved$get(name))
}

run_outcome <- function(run_dir) {
  list(result = jsonlite::fromJSON(file.path(run_dir, "result.json"), simplifyVector = FALSE),
       weights = npz_arrays(file.path(run_dir, "weights.npz")),
       best = npz_arrays(file.path(run_dir, "best.npz")),
       newest = npz_arrays(file.path(run_dir, "newest.npz")),
       csv = readLines(file.path(run_dir, "history.csv")))
}

references <- new.env()
reference_run <- function(trainer) {
  if (is.null(references[[trainer]])) {
    run_dir <- file.path(tempfile("callbacks-"), trainer)
    done <- run_callbacks(trainer, run_dir)
    expect_identical(done$status, 0L, info = done$console)
    references[[trainer]] <- run_outcome(run_dir)
  }
  references[[trainer]]
}

fault_variable <- function(row) {
  paste0(toupper(row$fault), "=", row$at)
}

for (row in Filter(function(row) "r" %in% unlist(row$languages), case_rows("callbacks"))) {
  test_that(paste("from R,", row$id, "ends as the run never interrupted, callbacks included"), {
    skip_if_no_kerasdist()
    whole <- reference_run(row$trainer)
    expect_identical(whole$result$steps, 80L)  # EarlyStopping stopped after epoch 4
    expect_equal(whole$result$learning_rate, 0.01 / 8, tolerance = 1e-6)  # three plateaus
    run_dir <- withr::local_tempdir()
    failed <- run_callbacks(row$trainer, run_dir, fault_variable(row))
    expect_identical(failed$status, as.integer(row$exit), info = failed$console)
    expect_false(file.exists(file.path(run_dir, "result.json")))
    resumed <- run_callbacks(row$trainer, run_dir)
    expect_identical(resumed$status, 0L, info = resumed$console)
    expect_false(grepl("start fresh|other callbacks", resumed$console), info = resumed$console)
    expect_identical(run_outcome(run_dir), whole)
  })
}
