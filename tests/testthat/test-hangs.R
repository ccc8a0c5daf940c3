# The step watchdog from R (#59): a worker stuck in R code is noticed, the launcher restarts the
# group, and the run ends equal to an uninterrupted one; goodput() names the stuck worker.

hang_run <- function(dir, hang_step, max_restarts = 0L) {
  script <- normalizePath(test_path("scripts", "train_hang.R"))
  launch(c(script, file.path(dir, "ckpt"), file.path(dir, "out"), hang_step, 8),
         num_workers = 2L, max_restarts = max_restarts, grace_period = 5, timeout = 400)
}

test_that("a worker stuck in an R callback is restarted after hang_timeout and the run ends equal", {
  skip_if_no_kerasdist()
  reference <- withr::local_tempdir()
  expect_true(hang_run(reference, 0L)$ok)
  dir <- withr::local_tempdir()
  result <- hang_run(dir, 7L, max_restarts = 1L)
  expect_true(result$ok)
  expect_identical(result$restarts, 1L)
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
