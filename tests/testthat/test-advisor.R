# The strategy advisor from R: the shared argument checks, and a real timed run on R data.

for (row in case_rows("advisor")) {
  test_that(paste("bad arguments are refused, naming them, before any process starts:", row$id), {
    skip_if_no_kerasdist()
    kerasdist:::kerasdist_module()  # import Python's side first: only the checks are timed
    args <- row$args
    if (!is.null(args$x)) args$x <- do.call(rbind, lapply(args$x, unlist))
    if (!is.null(args$strategies)) args$strategies <- unlist(args$strategies)
    advisor <- reticulate::import("kerasdist.advisor")
    run_processes <- advisor$`_run_processes`
    reticulate::py_set_attr(advisor, "_run_processes", function(...) stop("a timing process was started"))
    withr::defer(reticulate::py_set_attr(advisor, "_run_processes", run_processes))
    err <- expect_error(do.call(bench_strategies, c(list(row$model), args)), class = "kerasdist_ValueError")
    expect_true(grepl(row$error, conditionMessage(err), fixed = TRUE), label = paste(row$id, conditionMessage(err)))
  })
}

test_that("bench_strategies times the default strategy on an R matrix and recommends it", {
  skip_if_no_kerasdist()
  set.seed(1)
  x <- matrix(rnorm(256 * 32), 256, 32)
  y <- rowSums(x)
  report <- bench_strategies("kerasdist.example_models:tiny_dense", x, y, strategies = "default",
                             steps = 10L, batch_size = 32L, verbose = FALSE, speed_options = TRUE)
  expect_s3_class(report, "kerasdist_strategy_benchmark")
  expect_s3_class(report$timings, "data.frame")
  expect_equal(report$timings$strategy, "default")
  expect_gt(report$timings$steps_per_second, 0)
  expect_true(is.na(report$timings$error))
  expect_equal(report$recommendation, "default")
  expect_equal(report$parameters, 2177L)
  expect_output(print(report), "Recommendation: default.", fixed = TRUE)
  # speed_options = TRUE: default timed again with mixed precision and with XLA
  expect_s3_class(report$speed_options, "data.frame")
  expect_equal(report$speed_options$option, c("mixed_precision", "jit_compile"))
  expect_equal(report$speed_options$strategy, c("default", "default"))
  expect_true(all(report$speed_options$steps_per_second > 0))
  expect_true(all(is.na(report$speed_options$error)))
  expect_match(report$reason, "Speed options under default: mixed_precision (mixed_bfloat16) ", fixed = TRUE)
})

test_that("a costly hand-off of each batch points to steps_per_execution (one replica only)", {
  skip_if_no_kerasdist()
  kerasdist:::kerasdist_module()  # starts the Python kerasdist uses
  advisor <- reticulate::import("kerasdist.advisor")
  # 10 ms a step, 4 of them compute, 6 waiting for input that the pipeline makes in 1 ms
  handed <- function(kind, replicas) advisor$StrategyTiming(kind, replicas, "test", 100, 6400, 10, 4, 6, 1)
  reason <- advisor$recommend(list(handed("default", 1L)))[[2]]
  expect_match(reason, "steps_per_execution='auto'", fixed = TRUE)
  reason <- advisor$recommend(list(handed("mirrored", 2L)))[[2]]
  expect_match(reason, "handing each batch", fixed = TRUE)
  expect_false(grepl("steps_per_execution", reason, fixed = TRUE))
})
