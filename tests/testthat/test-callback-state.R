# keras3's callbacks and an R-defined one resume as if never interrupted (tests/cases/callbacks.json,
# the rows for R): each row's run is scripts/train_callbacks.R in an Rscript, failed as the row
# says, run again, and compared with the same run never interrupted: weights, the newest
# checkpoint, the stop step, the learning rate, ModelCheckpoint's best file, the CSV rows,
# TensorBoard's records and the R callback's state. Each R process starting TensorFlow costs about
# 12 s of CPU, so the runs share processes, each ended by a row's failed run: the first runs every
# trainer never interrupted, then the first row's failed run; each next one runs the row before
# again, then its own row's failed run; the last runs the last row again.

callbacks_script <- function() normalizePath(test_path("scripts", "train_callbacks.R"))

# `runs`: list(c(trainer, run_dir, fault), ...), run one after the other by one Rscript.
run_callbacks <- function(runs) {
  for (run in runs) dir.create(run[[2]], showWarnings = FALSE, recursive = TRUE)
  log <- tempfile("callbacks-console-", fileext = ".txt")
  status <- system2(file.path(R.home("bin"), "Rscript"),
                    c("--vanilla", shQuote(callbacks_script()), shQuote(unlist(runs))),
                    stdout = log, stderr = log, env = "TF_CPP_MIN_LOG_LEVEL=2")
  list(status = status, console = paste(readLines(log, warn = FALSE), collapse = "\n"))
}

# Whether the run in `run_dir` ended in the process whose outcome is `process`.
ran_to_its_end <- function(process, run_dir) {
  paste("done", run_dir) %in% trimws(strsplit(process$console, "\n")[[1]])
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

fault_of <- function(row) {
  paste0(toupper(row$fault), "=", row$at)
}

r_rows <- Filter(function(row) "r" %in% unlist(row$languages), case_rows("callbacks"))

# Every run of this file, made at the first test that asks, in length(r_rows) + 1 processes: every
# trainer never interrupted, then the first row's failed run (in a run_dir nothing has yet); then
# for each row after it, the row before run again in its run_dir, then this row's failed run; then
# the last row run again. `failed[[id]]` is the process a row's run failed in, `resumed[[id]]` the
# one it ran again in; `failed_left_result` is whether a failed run wrote result.json, looked at
# before the run again.
runs <- local({
  made <- NULL
  function() {
    if (!is.null(made)) return(made)
    new_dir <- function(name) file.path(withr::local_tempdir(.local_envir = globalenv()), name)
    trainers <- unique(vapply(r_rows, function(row) row$trainer, ""))
    whole_dirs <- setNames(lapply(trainers, new_dir), trainers)
    ids <- vapply(r_rows, function(row) row$id, "")
    row_dirs <- setNames(lapply(r_rows, function(row) new_dir(row$trainer)), ids)
    again <- function(row) c(row$trainer, row_dirs[[row$id]], "none")
    failing <- function(row) c(row$trainer, row_dirs[[row$id]], fault_of(row))
    failed <- resumed <- list()
    failed_left_result <- setNames(logical(length(ids)), ids)
    for (i in seq_along(r_rows)) {
      before <- if (i == 1L) lapply(trainers, function(trainer) c(trainer, whole_dirs[[trainer]], "none"))
                else list(again(r_rows[[i - 1L]]))
      process <- run_callbacks(c(before, list(failing(r_rows[[i]]))))
      if (i == 1L) whole <- process else resumed[[ids[[i - 1L]]]] <- process
      failed[[ids[[i]]]] <- process
      failed_left_result[[ids[[i]]]] <- file.exists(file.path(row_dirs[[ids[[i]]]], "result.json"))
    }
    resumed[[ids[[length(ids)]]]] <- run_callbacks(list(again(r_rows[[length(r_rows)]])))
    made <<- list(whole = whole, whole_dirs = whole_dirs, row_dirs = row_dirs, failed = failed,
                  failed_left_result = failed_left_result, resumed = resumed)
    made
  }
})

for (row in r_rows) {
  test_that(paste("from R,", row$id, "ends as the run never interrupted, callbacks included"), {
    skip_if_no_kerasdist()
    made <- runs()
    expect_true(ran_to_its_end(made$whole, made$whole_dirs[[row$trainer]]), info = made$whole$console)
    whole <- run_outcome(made$whole_dirs[[row$trainer]])
    expect_identical(whole$result$steps, 80L)  # EarlyStopping stopped after epoch 4
    expect_equal(whole$result$learning_rate, 0.01 / 8, tolerance = 1e-6)  # three plateaus
    failed <- made$failed[[row$id]]
    expect_identical(failed$status, as.integer(row$exit), info = failed$console)
    expect_false(ran_to_its_end(failed, made$row_dirs[[row$id]]))
    expect_false(made$failed_left_result[[row$id]])
    resumed <- made$resumed[[row$id]]
    expect_true(ran_to_its_end(resumed, made$row_dirs[[row$id]]), info = resumed$console)
    expect_false(grepl("start fresh|other callbacks", resumed$console), info = resumed$console)
    expect_identical(run_outcome(made$row_dirs[[row$id]]), whole)
  })
}
