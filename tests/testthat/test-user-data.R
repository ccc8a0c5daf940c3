# The data users bring, from R (#58): tests/cases/user_data.json's kinds with `r` true, built with
# tfdatasets and keras3 as keras3's guides build them (scripts/train_user_data.R), trained under 2
# CPU replicas by distributed_fit(), resume_fit() and keras3's fit() with a checkpoint_callback(),
# and resumed: from a copy of the uninterrupted run's checkpoints up to a step inside an epoch and
# at an epoch end (what a kill right after that save leaves), after a SIGTERM and after a real
# SIGKILL; each ends bit for bit as the uninterrupted run.

user_cases <- jsonlite::fromJSON(file.path(cases_dir(), "user_data.json"), simplifyVector = FALSE)
r_kinds <- vapply(Filter(function(kind) isTRUE(kind$r), user_cases$kinds), function(kind) kind$id, "")
train_script <- function() normalizePath(test_path("scripts", "train_user_data.R"))

train_r <- function(trainer, root, kinds, ...) {
  processx::run("Rscript", c(train_script(), trainer, root, paste(kinds, collapse = ","), ...),
                error_on_status = FALSE, timeout = 600, env = c("current", TF_CPP_MIN_LOG_LEVEL = "2"))
}

expect_trained <- function(run) {
  expect_equal(run$status, 0L, info = substr(run$stderr, max(1, nchar(run$stderr) - 3000), nchar(run$stderr)))
}

# The checkpoints a run killed right after saving `step` leaves: `from`'s up to that step.
copy_up_to <- function(from, to, kinds, step) {
  for (kind in kinds) {
    dir.create(file.path(to, kind), recursive = TRUE)
    entries <- list.files(file.path(from, kind), full.names = TRUE)
    entries <- entries[!basename(entries) %in% c("result.npz", "warnings.txt")]
    steps <- suppressWarnings(as.integer(sub("^ckpt-", "", basename(entries))))
    file.copy(entries[is.na(steps) | steps <= step], file.path(to, kind), recursive = TRUE)
  }
  if (dir.exists(file.path(from, "files"))) file.copy(file.path(from, "files"), to, recursive = TRUE)
}

expect_same_run <- function(reference, resumed, kinds) {
  np <- reticulate::import("numpy", convert = FALSE)
  for (kind in kinds) {
    expected <- np$load(file.path(reference, kind, "result.npz"))
    got <- np$load(file.path(resumed, kind, "result.npz"))
    names <- reticulate::py_to_r(expected$files)
    equal <- vapply(names, function(name) {
      reticulate::py_to_r(np$array_equal(expected$get(name), got$get(name)))
    }, logical(1))
    expect_true(all(equal), info = paste(kind, "differs in", paste(names[!equal], collapse = ", ")))
    expect_length(readLines(file.path(resumed, kind, "warnings.txt")), 0)
  }
}

uninterrupted <- local({
  made <- list()
  function(trainer) {
    if (is.null(made[[trainer]])) {
      root <- withr::local_tempdir(.local_envir = globalenv())
      expect_trained(train_r(trainer, root, r_kinds))
      made[[trainer]] <<- root
    }
    made[[trainer]]
  }
})

for (trainer in c("distributed_fit", "resume_fit", "fit")) {
  test_that(paste(trainer, "from R: every kind resumed inside an epoch ends as the uninterrupted run"), {
    skip_if_no_kerasdist()
    reference <- uninterrupted(trainer)
    resumed <- withr::local_tempdir()
    copy_up_to(reference, resumed, r_kinds, 8L)
    expect_trained(train_r(trainer, resumed, r_kinds))
    expect_same_run(reference, resumed, r_kinds)
  })
}

test_that("distributed_fit from R: resumed at an epoch end and after a SIGTERM, each as the uninterrupted run", {
  skip_if_no_kerasdist()
  reference <- uninterrupted("distributed_fit")
  at_epoch_end <- withr::local_tempdir()
  copy_up_to(reference, at_epoch_end, r_kinds, 12L)
  expect_trained(train_r("distributed_fit", at_epoch_end, r_kinds))
  expect_same_run(reference, at_epoch_end, r_kinds)

  preempted <- withr::local_tempdir()
  expect_trained(train_r("distributed_fit", preempted, r_kinds, "--sigterm-at", "10"))
  for (kind in r_kinds) expect_equal(readLines(file.path(preempted, kind, "preempted")), "75")
  expect_trained(train_r("distributed_fit", preempted, r_kinds))
  expect_same_run(reference, preempted, r_kinds)
})

test_that("keras3's guide pipeline under keras3's fit(): SIGKILLed mid-epoch, the same script ends as the uninterrupted run", {
  skip_if_no_kerasdist()
  reference <- uninterrupted("fit")
  dir <- withr::local_tempdir()
  killed <- train_r("fit", dir, "guide-cache-prefetch", "--kill-at", "11")
  expect_true(killed$status != 0)
  expect_true(file.exists(file.path(dir, "guide-cache-prefetch", "ckpt-8", "input.bin")))
  expect_trained(train_r("fit", dir, "guide-cache-prefetch"))
  expect_same_run(reference, dir, "guide-cache-prefetch")
})

test_that("resume_rule says what a resume does with data from R", {
  skip_if_no_kerasdist()
  result <- in_fresh_r(function() {
    library(kerasdist)
    library(tfdatasets)
    shuffled <- tensor_slices_dataset(matrix(runif(40), ncol = 4)) |> dataset_shuffle(10, seed = 1) |> dataset_batch(5)
    cached <- shuffled |> dataset_cache()
    single <- tensor_slices_dataset(matrix(runif(40), ncol = 4))
    list(shuffled = resume_rule(shuffled), cached = resume_rule(cached),
         single = tryCatch(resume_rule(single), kerasdist_error = function(e) class(e)[[1]]))
  })
  expect_match(result$shuffled, "where it is", fixed = TRUE)
  expect_match(result$cached, "at the start of its pass", fixed = TRUE)
  expect_equal(result$single, "kerasdist_ValueError")
})
