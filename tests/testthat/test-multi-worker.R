test_that("an R script launched as 2 workers trains, and only the chief writes checkpoints", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  checkpoint_dir <- file.path(dir, "ckpt")
  launch_r_script("train_worker.R", checkpoint_dir, file.path(dir, "weights"))
  weights0 <- readLines(file.path(dir, "weights-worker-0.txt"))
  weights1 <- readLines(file.path(dir, "weights-worker-1.txt"))
  expect_identical(weights0, weights1)
  checkpoints <- list_checkpoints(checkpoint_dir)
  expect_identical(checkpoints$epoch, 1:2)
  expect_identical(unique(checkpoints$writer), "worker:0")
  expect_length(list.files(checkpoint_dir, pattern = "^ckpt-", all.files = TRUE, no.. = TRUE), 2)
  expect_length(list.files(file.path(checkpoint_dir, "runs"), pattern = "[.]jsonl$"), 1)  # the chief's run log only
  attempts <- attr(goodput(checkpoint_dir), "attempts")
  expect_identical(attempts$status, "completed")
  expect_identical(attempts$workers, 2L)
  # run_context() outside the scope knows its place; chief_path and the CSV logger write once
  outside <- lapply(0:1, function(i) readLines(file.path(dir, sprintf("weights-worker-%d-outside.txt", i))))
  expect_identical(outside[[1]][1:3], c("worker:0", "TRUE", "2"))
  expect_identical(outside[[2]][1:3], c("worker:1", "FALSE", "2"))
  expect_identical(outside[[1]][4], file.path(dir, "notes.txt"))
  expect_identical(readLines(file.path(dir, "notes.txt")), "worker:0")
  expect_false(startsWith(outside[[2]][4], dir))
  expect_false(dir.exists(dirname(outside[[2]][4])))  # the other worker's folder: removed at exit
  expect_length(readLines(file.path(dir, "log.csv")), 3)  # the header and 2 epochs, written once
})

test_that("a strategy the R user made with TensorFlow's API trains with keras3's fit() and distributed_fit()", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  launch_r_script("user_strategy.R", dir)
  losses <- lapply(0:1, function(i) readLines(file.path(dir, sprintf("losses-%d.txt", i))))
  expect_length(losses[[1]], 4)  # 2 epochs of fit(), 2 of distributed_fit()
  expect_identical(losses[[1]], losses[[2]])
  checkpoints <- list_checkpoints(file.path(dir, "ckpt"))
  expect_identical(checkpoints$writer, c("worker:0", "worker:0"))
})

test_that("a multi-worker strategy made after keras3 started TensorFlow is a condition saying what to do", {
  skip_if_no_kerasdist()
  port <- reticulate::import("kerasdist.launch.ports")$free_ports("127.0.0.1", 1L)[[1]]
  tf_config <- sprintf('{"cluster": {"worker": ["127.0.0.1:%d"]}, "task": {"type": "worker", "index": 0}}', port)
  result <- withr::with_envvar(c(TF_CONFIG = tf_config), in_fresh_r(function() {
    library(keras3)
    library(kerasdist)
    python_before <- reticulate::py_available(initialize = FALSE)  # library() starts nothing
    err <- tryCatch(tensorflow::tf$distribute$MultiWorkerMirroredStrategy(), error = identity)
    list(python_before = python_before, class = class(err), message = conditionMessage(err))
  }))
  expect_false(result$python_before)
  expect_true("kerasdist.compat.MultiWorkerStrategyTooLate" %in% result$class)
  expect_match(result$message, "create it before library(keras3), or call kerasdist::select_strategy(\"multi_worker\")",
               fixed = TRUE)
  expect_match(result$message, "Collective ops must be configured at program startup", fixed = TRUE)
})
