# The data users bring, from R (#58): tests/cases/user_data.json's kinds with `r` true, built with
# tfdatasets and keras3 as keras3's guides build them (scripts/train_user_data.R), trained under 2
# CPU replicas by distributed_fit(), resume_fit() and keras3's fit() with a checkpoint_callback(),
# and resumed: from a copy of the uninterrupted run's checkpoints up to a step inside an epoch and
# at an epoch end (what a kill right after that save leaves), after a SIGTERM and after a real
# SIGKILL; each ends bit for bit as the uninterrupted run. Each R process starting TensorFlow costs
# about 12 s of CPU, so the runs share 2 processes: one runs the uninterrupted ones of every
# trainer, the SIGTERMed one, then the SIGKILLed one (which ends it), the other every resume (each
# from its own directory).

user_cases <- jsonlite::fromJSON(file.path(cases_dir(), "user_data.json"), simplifyVector = FALSE)
r_kinds <- vapply(Filter(function(kind) isTRUE(kind$r), user_cases$kinds), function(kind) kind$id, "")
train_script <- function() normalizePath(test_path("scripts", "train_user_data.R"))

trainers <- c("distributed_fit", "resume_fit", "fit")

# `jobs`: list(list(trainer, root, kinds, interruption flag...), ...), trained one after the other
# by one Rscript.
train_r <- function(jobs) {
  job_args <- unlist(lapply(jobs, function(job) c(job[-(1:3)], job[[1]], job[[2]], paste(job[[3]], collapse = ","))))
  processx::run("Rscript", c(train_script(), job_args),
                error_on_status = FALSE, timeout = 1200, env = c("current", TF_CPP_MIN_LOG_LEVEL = "2"))
}

stderr_tail <- function(run) substr(run$stderr, max(1, nchar(run$stderr) - 3000), nchar(run$stderr))

expect_trained <- function(run) {
  expect_equal(run$status, 0L, info = stderr_tail(run))
}

# The job of `root` ran to its end in `run` (whose process may have been killed after it).
expect_job_done <- function(run, root) {
  expect_true(paste("done", root) %in% trimws(strsplit(run$stdout, "\n")[[1]]), info = stderr_tail(run))
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

# Every run of this file, made at the first test that asks: one process trains every trainer
# uninterrupted, then distributed_fit SIGTERMed at step 10 of every kind, then keras3's fit on the
# guide's pipeline SIGKILLed at step 11; then one resumes them all, each in its own directory:
# copies of the uninterrupted checkpoints up to step 8 (every trainer) and 12 (distributed_fit),
# the SIGTERMed and the SIGKILLed run's.
runs <- local({
  made <- NULL
  function() {
    if (!is.null(made)) return(made)
    new_dir <- function() withr::local_tempdir(.local_envir = globalenv())
    reference <- setNames(lapply(trainers, function(trainer) new_dir()), trainers)
    preempted <- new_dir()
    killed_dir <- new_dir()
    first <- train_r(c(lapply(trainers, function(trainer) list(trainer, reference[[trainer]], r_kinds)),
                       list(list("distributed_fit", preempted, r_kinds, "--sigterm-at", "10"),
                            list("fit", killed_dir, "guide-cache-prefetch", "--kill-at", "11"))))
    preempted_said <- vapply(r_kinds, function(kind) {  # before the resume, which writes there too
      said <- file.path(preempted, kind, "preempted")
      if (file.exists(said)) paste(readLines(said), collapse = "\n") else NA_character_
    }, "")
    killed_left <- file.exists(file.path(killed_dir, "guide-cache-prefetch", "ckpt-8", "input.bin"))
    mid_epoch <- setNames(lapply(trainers, function(trainer) new_dir()), trainers)
    for (trainer in trainers) copy_up_to(reference[[trainer]], mid_epoch[[trainer]], r_kinds, 8L)
    at_epoch_end <- new_dir()
    copy_up_to(reference[["distributed_fit"]], at_epoch_end, r_kinds, 12L)
    resumes <- c(lapply(trainers, function(trainer) list(trainer, mid_epoch[[trainer]], r_kinds)),
                 list(list("distributed_fit", at_epoch_end, r_kinds), list("distributed_fit", preempted, r_kinds),
                      list("fit", killed_dir, "guide-cache-prefetch")))
    made <<- list(reference = reference, first = first, preempted = preempted,
                  preempted_said = preempted_said, killed_dir = killed_dir,
                  killed_left = killed_left, mid_epoch = mid_epoch, at_epoch_end = at_epoch_end,
                  resumed = train_r(resumes))
    made
  }
})

for (trainer in trainers) {
  test_that(paste(trainer, "from R: every kind resumed inside an epoch ends as the uninterrupted run"), {
    skip_if_no_kerasdist()
    made <- runs()
    expect_job_done(made$first, made$reference[[trainer]])
    expect_trained(made$resumed)
    expect_same_run(made$reference[[trainer]], made$mid_epoch[[trainer]], r_kinds)
  })
}

test_that("distributed_fit from R: resumed at an epoch end and after a SIGTERM, each as the uninterrupted run", {
  skip_if_no_kerasdist()
  made <- runs()
  reference <- made$reference[["distributed_fit"]]
  expect_trained(made$resumed)
  expect_same_run(reference, made$at_epoch_end, r_kinds)

  expect_job_done(made$first, made$preempted)
  for (kind in r_kinds) expect_equal(made$preempted_said[[kind]], "75")
  expect_same_run(reference, made$preempted, r_kinds)
})

test_that("keras3's guide pipeline under keras3's fit(): SIGKILLed mid-epoch, the same script ends as the uninterrupted run", {
  skip_if_no_kerasdist()
  made <- runs()
  expect_true(made$first$status != 0)
  expect_false(paste("done", made$killed_dir) %in% trimws(strsplit(made$first$stdout, "\n")[[1]]))
  expect_true(made$killed_left)
  expect_trained(made$resumed)
  expect_same_run(made$reference[["fit"]], made$killed_dir, "guide-cache-prefetch")
})

test_that("resume_rule says what a resume does with data from R", {
  skip_if_no_kerasdist()
  # in this process, as test-data.R's make_dataset() tests: no devices to set up first
  shuffled <- tfdatasets::tensor_slices_dataset(matrix(runif(40), ncol = 4)) |>
    tfdatasets::dataset_shuffle(10, seed = 1) |>
    tfdatasets::dataset_batch(5)
  single <- tfdatasets::tensor_slices_dataset(matrix(runif(40), ncol = 4))
  in_order <- single |> tfdatasets::dataset_batch(5)
  result <- list(shuffled = resume_rule(shuffled), in_order = resume_rule(in_order),
                 single = tryCatch(resume_rule(single), kerasdist_error = function(e) class(e)[[1]]))
  expect_match(result$shuffled, "holds every shuffle's random state, else at the last batch it did", fixed = TRUE)
  expect_match(result$in_order, "where it is (a symbolic tf.data checkpoint), nothing is read again", fixed = TRUE)
  expect_equal(result$single, "kerasdist_ValueError")
})
