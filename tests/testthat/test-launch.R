# The local launcher from R, with real processes on 127.0.0.1 running an R script
# (scripts/launch_task.R records its TF_CONFIG; no TensorFlow).

task_script <- function() normalizePath(test_path("scripts", "launch_task.R"))

recorded <- function(dir, restart = 0L) {
  files <- list.files(dir, pattern = sprintf("^%d-.*\\.json$", restart), full.names = TRUE)
  configs <- lapply(files, function(f) jsonlite::fromJSON(f, simplifyVector = FALSE))
  names(configs) <- vapply(configs, function(c) paste(c$task$type, c$task$index), character(1))
  configs[order(names(configs))]
}

test_that("an R script launched as 2 workers gets its own task in the same cluster", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  result <- launch(c(task_script(), dir), num_workers = 2)

  expect_s3_class(result, "kerasdist_launch_result")
  expect_identical(result$exit_code, 0L)
  expect_true(result$ok)
  expect_identical(result$restarts, 0L)
  expect_null(result$failed)
  expect_identical(result$message, "all 2 workers finished.")
  expect_identical(result$exit_codes, list(c("worker 0" = 0L, "worker 1" = 0L)))
  configs <- recorded(dir)
  expect_named(configs, c("worker 0", "worker 1"))
  expect_identical(configs[["worker 1"]]$task, list(type = "worker", index = 1L))
  expect_identical(configs[["worker 0"]]$cluster, configs[["worker 1"]]$cluster)
  workers <- unlist(configs[["worker 0"]]$cluster$worker)
  expect_identical(workers, result$cluster$worker)
  expect_length(unique(workers), 2)
  expect_true(all(startsWith(workers, "127.0.0.1:")))
  expect_output(print(result), "launch: all 2 workers finished.", fixed = TRUE)
})

test_that("a failing process restarts the whole group, which then completes", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  result <- launch(c(task_script(), dir, "worker 1", "3"), num_workers = 2, max_restarts = 1,
                   grace_period = 5)

  expect_identical(c(result$exit_code, result$restarts), c(0L, 1L))
  expect_identical(result$failures, "worker 1 exited with status 3")
  expect_named(recorded(dir, restart = 1L), c("worker 0", "worker 1"))
})

test_that("with no restarts left the result is non-zero and names the failed process", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  result <- launch(c(task_script(), dir, "worker 1", "3"), num_workers = 2, max_restarts = 0,
                   grace_period = 5)

  expect_identical(result$exit_code, 3L)
  expect_false(result$ok)
  expect_identical(result$failed, "worker 1 exited with status 3")
  expect_identical(result$message, "worker 1 exited with status 3; no restarts left (max_restarts=0).")
  expect_length(recorded(dir, restart = 1L), 0)
})

test_that("with min_workers a group whose restarts ran out goes on with one worker fewer", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  result <- launch(c(task_script(), dir, "worker 1", "3"), num_workers = 2, max_restarts = 0,
                   min_workers = 1, grace_period = 5)

  expect_true(result$ok)
  expect_identical(c(result$restarts, result$num_workers), c(1L, 1L))
  expect_identical(result$failures, "worker 1 exited with status 3")
  expect_identical(result$message, "all 1 worker finished after 1 restart.")
  configs <- recorded(dir, restart = 1L)
  expect_named(configs, "worker 0")
  expect_length(configs[["worker 0"]]$cluster$worker, 1)
  expect_error(launch(c(task_script(), dir), num_workers = 2, min_workers = 3),
               "min_workers must be at most num_workers \\(2\\), got 3", class = "kerasdist_ValueError")
})

test_that("parameter servers add a chief, and env reaches every process", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  result <- launch(c("sh", "-c", "echo \"$KERASDIST_TASK_TYPE $KD_X\" > \"$KD_DIR/$KERASDIST_TASK_TYPE-$KERASDIST_TASK_INDEX\""),
                   num_workers = 1, num_ps = 1, env = list(KD_DIR = dir, KD_X = "x"))
  expect_true(result$ok)
  expect_identical(lengths(result$cluster), c(chief = 1L, worker = 1L, ps = 1L))
  expect_identical(readLines(file.path(dir, "chief-0")), "chief x")
})

test_that("bad input is refused before anything starts, naming the argument", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  command <- c(task_script(), dir)
  expect_error(launch(command, num_workers = 0), "num_workers must be an integer >= 1, got 0",
               class = "kerasdist_ValueError")
  expect_error(launch(command, num_workers = 2, num_ps = -1), "num_ps must be an integer >= 0",
               class = "kerasdist_ValueError")
  expect_error(launch(command, num_workers = 2, max_restarts = -1), "max_restarts must be an integer >= 0",
               class = "kerasdist_ValueError")
  expect_error(launch(character(), num_workers = 2), "command is empty", class = "kerasdist_ValueError")
  expect_error(launch(1, num_workers = 2), "command must be a character vector",
               class = "kerasdist_ValueError")
  expect_error(launch("kerasdist-no-such-program", num_workers = 2),
               "'kerasdist-no-such-program' was not found on PATH", class = "kerasdist_ValueError")
  expect_error(launch(file.path(dir, "missing.R"), num_workers = 2), "missing.R' does not exist",
               class = "kerasdist_ValueError")
  expect_error(launch(command, num_workers = 2, timeout = 0), "timeout must be more than 0",
               class = "kerasdist_ValueError")
  expect_length(list.files(dir), 0)
})

test_that("warm_start forks the Python tasks from a process that has imported TensorFlow", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  script <- file.path(dir, "task.py")
  writeLines(c(
    "import os, sys",
    "warm = 'tensorflow' in sys.modules  # before this script imported anything",
    "open(os.path.join(sys.argv[1], os.environ['KERASDIST_TASK_INDEX']), 'w').write(str(warm))"
  ), script)
  withr::local_envvar(KERASDIST_WARM_START = NA)  # the launcher's own server, not one set up around it
  result <- launch(c(script, dir), num_workers = 2, warm_start = TRUE)

  expect_true(result$ok)
  written <- vapply(file.path(dir, c("0", "1")), readLines, character(1), warn = FALSE, USE.NAMES = FALSE)
  expect_identical(written, c("True", "True"))
  expect_error(launch(c(script, dir), num_workers = 1, warm_start = "yes"),
               "warm_start must be True, False or None, got 'yes'", class = "kerasdist_ValueError")
})
