# #15 items 6 and 8 from R: default and mirrored on 2 devices agree, and a checkpoint of 2 replicas
# resumes on 1 at the next unseen sample. Runs are scripts/train_resumable.R in 2 Rscripts (the CPU
# split must come before keras3 starts TensorFlow): the 2-replica run killed at step 7, then one
# process for the default run, the mirrored one and the resume on 1 replica. Tolerance: steps x
# float32 eps (20 x 1.19e-7 = 2.4e-6), the bound tests/python/test_reliability.py justifies: the
# replicas add the same gradients in another order, one rounding per step; a resume at the wrong
# sample moves the weights by a whole step (~1e-3).

train_script <- function() normalizePath(test_path("scripts", "train_resumable.R"))
tolerance <- 20 * 2^-23  # 20 steps x float32 eps

# `runs`: list(c(dir, strategy), ...), trained one after another in one Rscript; returns its
# status and, for each run, the steps it printed.
run_training <- function(runs, kill_at = 0L) {
  out <- file.path(runs[[1]][[1]], "console.txt")
  run_args <- unlist(lapply(runs, function(run) {
    c(shQuote(file.path(run[[1]], "ckpt")), shQuote(file.path(run[[1]], "final.npz")), run[[2]])
  }))
  status <- system2(file.path(R.home("bin"), "Rscript"), c("--vanilla", shQuote(train_script()), run_args),
                    stdout = out, stderr = out, env = c(paste0("KILL_AT_STEP=", kill_at), "TF_CPP_MIN_LOG_LEVEL=2"))
  console <- readLines(out, warn = FALSE)
  run_of_line <- cumsum(grepl("^run ", console))
  if (length(runs) == 1) run_of_line <- rep(1L, length(console))
  steps <- lapply(seq_along(runs), function(i) {
    lines <- grep("^step [0-9]+", console[run_of_line == i], value = TRUE)
    as.integer(sub("^step ([0-9]+).*", "\\1", lines))
  })
  list(status = status, steps = steps, console = console)
}

final_weights <- function(dir) {
  np <- reticulate::import("numpy")
  saved <- np$load(file.path(dir, "final.npz"))
  lapply(saved$files, function(name) as.numeric(saved$get(name)))
}

largest_difference <- function(a, b) max(mapply(function(x, y) max(abs(x - y)), a, b))

test_that("from R, default and mirrored on 2 devices train to the same weights; a 2-replica checkpoint resumes on 1", {
  skip_if_no_kerasdist()
  moved <- withr::local_tempdir()
  killed <- run_training(list(c(moved, "mirrored")), kill_at = 7L)
  expect_identical(killed$status, 137L)  # 128 + SIGKILL
  expect_identical(killed$steps[[1]], 1:7)
  expect_identical(latest_checkpoint(file.path(moved, "ckpt"))$global_step, 7L)

  reference <- withr::local_tempdir()
  mirrored <- withr::local_tempdir()
  done <- run_training(list(c(reference, "default"), c(mirrored, "mirrored"), c(moved, "default")))
  expect_identical(done$status, 0L, info = paste(done$console, collapse = "\n"))
  expect_identical(done$steps[[1]], 1:20)
  expect_identical(done$steps[[2]], 1:20)
  expect_lte(largest_difference(final_weights(mirrored), final_weights(reference)), tolerance)
  expect_identical(done$steps[[3]], 8:20)  # the next unseen batch, on 1 replica
  expect_lte(largest_difference(final_weights(moved), final_weights(reference)), tolerance)
})
