# keras3's callbacks and an R-defined one resume as if never interrupted (tests/cases/callbacks.json,
# the rows for R): each row's run is scripts/train_callbacks.R in an Rscript of its own, failed as
# the row says, run again, and compared with the same run never interrupted: weights, the newest
# checkpoint, the stop step, the learning rate, ModelCheckpoint's best file, the CSV rows,
# TensorBoard's records and the R callback's state. Each R process starting TensorFlow costs about
# 12 s of CPU, so the runs that end share processes: one runs every trainer never interrupted,
# one runs every row again after all the failed runs.

callbacks_script <- function() normalizePath(test_path("scripts", "train_callbacks.R"))

# `runs`: list(c(trainer, run_dir), ...), run one after the other by one Rscript.
run_callbacks <- function(runs, fault = character()) {
  for (run in runs) dir.create(run[[2]], showWarnings = FALSE, recursive = TRUE)
  log <- tempfile("callbacks-console-", fileext = ".txt")
  status <- system2(file.path(R.home("bin"), "Rscript"),
                    c("--vanilla", shQuote(callbacks_script()), shQuote(unlist(runs))),
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

fault_variable <- function(row) {
  paste0(toupper(row$fault), "=", row$at)
}

r_rows <- Filter(function(row) "r" %in% unlist(row$languages), case_rows("callbacks"))

# Every run of this file, made at the first test that asks: every trainer never interrupted (one
# process), each row's failed run (a process each, whose run_dir nothing has yet), then every row
# run again in its run_dir (one process). `failed_left_result` is whether a failed run wrote
# result.json, looked at before the run again.
runs <- local({
  made <- NULL
  function() {
    if (!is.null(made)) return(made)
    new_dir <- function(name) file.path(withr::local_tempdir(.local_envir = globalenv()), name)
    trainers <- unique(vapply(r_rows, function(row) row$trainer, ""))
    whole_dirs <- setNames(lapply(trainers, new_dir), trainers)
    whole <- run_callbacks(lapply(trainers, function(trainer) c(trainer, whole_dirs[[trainer]])))
    row_dirs <- setNames(lapply(r_rows, function(row) new_dir(row$trainer)), vapply(r_rows, function(row) row$id, ""))
    failed <- lapply(r_rows, function(row) run_callbacks(list(c(row$trainer, row_dirs[[row$id]])), fault_variable(row)))
    names(failed) <- names(row_dirs)
    failed_left_result <- vapply(row_dirs, function(dir) file.exists(file.path(dir, "result.json")), logical(1))
    resumed <- run_callbacks(lapply(r_rows, function(row) c(row$trainer, row_dirs[[row$id]])))
    made <<- list(whole = whole, whole_dirs = whole_dirs, row_dirs = row_dirs, failed = failed,
                  failed_left_result = failed_left_result, resumed = resumed)
    made
  }
})

for (row in r_rows) {
  test_that(paste("from R,", row$id, "ends as the run never interrupted, callbacks included"), {
    skip_if_no_kerasdist()
    made <- runs()
    expect_identical(made$whole$status, 0L, info = made$whole$console)
    whole <- run_outcome(made$whole_dirs[[row$trainer]])
    expect_identical(whole$result$steps, 80L)  # EarlyStopping stopped after epoch 4
    expect_equal(whole$result$learning_rate, 0.01 / 8, tolerance = 1e-6)  # three plateaus
    failed <- made$failed[[row$id]]
    expect_identical(failed$status, as.integer(row$exit), info = failed$console)
    expect_false(made$failed_left_result[[row$id]])
    expect_identical(made$resumed$status, 0L, info = made$resumed$console)
    expect_false(grepl("start fresh|other callbacks", made$resumed$console), info = made$resumed$console)
    expect_identical(run_outcome(made$row_dirs[[row$id]]), whole)
  })
}
