# #15 items 6 and 8 from R: default and mirrored on 2 devices agree, and a checkpoint of 2 replicas
# resumes on 1 at the next unseen sample. Each run is scripts/train_resumable.R in its own Rscript
# (the CPU split must come before keras3 starts TensorFlow). Tolerance: steps x float32 eps
# (20 x 1.19e-7 = 2.4e-6), the bound tests/python/test_reliability.py justifies: the replicas
# add the same gradients in another order, one rounding per step; a resume at the wrong sample
# moves the weights by a whole step (~1e-3).

train_script <- function() normalizePath(test_path("scripts", "train_resumable.R"))
tolerance <- 20 * 2^-23  # 20 steps x float32 eps

run_training <- function(dir, strategy, kill_at = 0L) {
  out <- file.path(dir, "console.txt")
  status <- system2(file.path(R.home("bin"), "Rscript"),
                    c("--vanilla", shQuote(train_script()), shQuote(file.path(dir, "ckpt")),
                      shQuote(file.path(dir, "final.npz")), strategy),
                    stdout = out, stderr = out, env = c(paste0("KILL_AT_STEP=", kill_at), "TF_CPP_MIN_LOG_LEVEL=2"))
  console <- readLines(out, warn = FALSE)
  steps <- as.integer(sub("^step ([0-9]+).*", "\\1", grep("^step [0-9]+", console, value = TRUE)))
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
  reference <- withr::local_tempdir()
  done <- run_training(reference, "default")
  expect_identical(done$status, 0L, info = paste(done$console, collapse = "\n"))
  expect_identical(done$steps, 1:20)

  mirrored <- withr::local_tempdir()
  expect_identical(run_training(mirrored, "mirrored")$status, 0L)
  expect_lte(largest_difference(final_weights(mirrored), final_weights(reference)), tolerance)

  moved <- withr::local_tempdir()
  killed <- run_training(moved, "mirrored", kill_at = 7L)
  expect_identical(killed$status, 137L)  # 128 + SIGKILL
  expect_identical(latest_checkpoint(file.path(moved, "ckpt"))$global_step, 7L)
  resumed <- run_training(moved, "default")
  expect_identical(resumed$status, 0L, info = paste(resumed$console, collapse = "\n"))
  expect_identical(resumed$steps, 8:20)  # the next unseen batch, on 1 replica
  expect_lte(largest_difference(final_weights(moved), final_weights(reference)), tolerance)
})
