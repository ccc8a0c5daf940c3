# The step watchdog from R (#59): a worker stuck in R code is noticed, the launcher restarts the
# group, and the run ends equal to an uninterrupted one; goodput() names the stuck worker.

# One launch, each worker starting TensorFlow once for both runs (a launch of its own for the
# reference would cost 2 more): first the uninterrupted reference in `reference`, then the run in
# `dir` whose worker 1 hangs after step 7 on the first attempt; the restarted group skips the
# reference it finished.
hang_runs <- function(reference, dir) {
  script <- normalizePath(test_path("scripts", "train_hang.R"))
  launch(c(script, 8, file.path(reference, "ckpt"), file.path(reference, "out"), 0L,
           file.path(dir, "ckpt"), file.path(dir, "out"), 7L),
         num_workers = 2L, max_restarts = 1L, grace_period = 5, timeout = 400)
}

test_that("a worker stuck in an R callback is restarted after hang_timeout and the run ends equal", {
  skip_if_no_kerasdist()
  reference <- withr::local_tempdir()
  dir <- withr::local_tempdir()
  result <- hang_runs(reference, dir)
  expect_true(result$ok)
  expect_identical(result$restarts, 1L)
  expect_identical(attr(goodput(file.path(reference, "ckpt")), "attempts")$status, "completed")  # uninterrupted
  for (task in c("worker-0", "worker-1")) {
    expect_identical(readLines(file.path(dir, "out", sprintf("weights-%s.txt", task))),
                     readLines(file.path(reference, "out", sprintf("weights-%s.txt", task))))
  }
  attempts <- attr(goodput(file.path(dir, "ckpt")), "attempts")
  expect_identical(attempts$status, c("hung", "completed"))
  expect_identical(attempts$hang_worker[[1]], "worker:1")
  expect_match(attempts$hang_frame[[1]], "^R code, called from ")
  expect_gte(attempts$hang_seconds[[1]], 8)
  # from the hang to the group's restart: the watchdog's share, whatever the machine's load
  hung_at <- as.numeric(readLines(file.path(dir, "out", "hung-at")))
  expect_lte(as.numeric(attempts$started[[2]]) - hung_at, 8 + 8)
})

test_that("hang_timeout reaches the checkpoint options from R and a bad one is refused", {
  skip_if_no_kerasdist()
  callback <- checkpoint_callback(withr::local_tempdir(), hang_timeout = 30)
  expect_identical(callback$options$hang_timeout, 30)
  expect_null(checkpoint_callback(withr::local_tempdir(), hang_timeout = NULL)$options$hang_timeout)
  expect_error(checkpoint_callback(withr::local_tempdir(), hang_timeout = -1),
               "hang_timeout must be a positive number of seconds, \"auto\" or None", class = "kerasdist_ValueError")
})
