# kerasdist next to keras3: a keras3 user's script killed and rerun, keras3 histories, callbacks and
# pipes, strategies from the tensorflow package, one readable condition for bad input and for a
# Python without kerasdist, and a quiet console.

run_rscript <- function(script, dir, env = character()) run_r(shQuote(script), dir, env)

# Rscript's arguments `args` in `dir`, its console in dir/console.txt.
run_r <- function(args, dir, env = character()) {
  out <- file.path(dir, "console.txt")
  status <- withr::with_dir(dir, system2(
    file.path(R.home("bin"), "Rscript"), c("--vanilla", args),
    stdout = out, stderr = out, env = c(env, "TF_CPP_MIN_LOG_LEVEL=2")
  ))
  list(status = status, console = readLines(out, warn = FALSE))
}

# The keras3 user's script SIGKILLed (KILL_AT_STEP) in dir/, then rerun unchanged and, in that same
# Rscript (each R process starting TensorFlow costs about 12 s of CPU), scripts/preempted.R, whose
# last run ends the process with 75 (its folders condition/ and exit/ apart from the user's ckpt/).
# Made once for the two tests that read it.
killed_then_rerun_and_preempted <- local({
  outcome <- NULL
  function() {
    if (is.null(outcome)) {
      dir <- withr::local_tempdir(.local_envir = testthat::teardown_env())
      user_script <- normalizePath(test_path("scripts", "keras3_user.R"))
      killed <- run_rscript(user_script, dir, "KILL_AT_STEP=6")
      checkpoint_when_killed <- latest_checkpoint(file.path(dir, "ckpt"))$global_step
      scripts <- c(user_script, normalizePath(test_path("scripts", "preempted.R")))
      sources <- paste(sprintf("source(%s)", vapply(scripts, deparse, "")), collapse = "; ")
      rerun <- run_r(c("-e", shQuote(sources)), dir)
      outcome <<- list(dir = dir, killed = killed, checkpoint_when_killed = checkpoint_when_killed, rerun = rerun)
    }
    outcome
  }
})

test_that("a keras3 user's script is SIGKILLed mid-epoch, rerun unchanged, and resumes at the next step", {
  skip_if_no_kerasdist()
  runs <- killed_then_rerun_and_preempted()
  dir <- runs$dir
  killed <- runs$killed
  expect_identical(killed$status, 137L)  # 128 + SIGKILL
  expect_identical(runs$checkpoint_when_killed, 4L)

  rerun <- runs$rerun
  expect_identical(rerun$status, 75L, info = paste(rerun$console, collapse = "\n"))  # preempted.R's end
  result <- readRDS(file.path(dir, "result.rds"))  # the user's script ran to its end
  expect_identical(result$steps_at_start, 4L)  # restored from the step-4 checkpoint
  expect_identical(result$steps, 30L)          # 3 epochs of 10 steps, none repeated
  expect_identical(result$latest, list(epoch = 3L, step_in_epoch = 0L, global_step = 30L))
  expect_identical(levels(result$history$metric), c("accuracy", "loss"))
  expect_identical(sort(unique(result$history$epoch)), 1:3)
  expect_identical(readBin(file.path(dir, "history.png"), "raw", 4L), as.raw(c(0x89, 0x50, 0x4e, 0x47)))
  console <- c(killed$console, rerun$console)
  expect_false(any(grepl("Traceback|oneDNN|absl::InitializeLog|cpu_feature_guard", console)), info = paste(console, collapse = "\n"))

  # what the kill cost, from the run log: killed at step 6 after the step-4 checkpoint
  report <- goodput(file.path(dir, "ckpt"))
  expect_s3_class(report, "kerasdist_goodput")
  expect_identical(report$part, c("productive", "startup", "restore", "checkpoint_blocking", "redone",
                                  "evaluation", "detection", "hang", "other", "downtime"))
  expect_equal(sum(report$seconds), attr(report, "wall_seconds"), tolerance = 1e-3)
  attempts <- attr(report, "attempts")
  expect_identical(attempts$status, c("killed or crashed", "completed"))
  expect_identical(attempts$last_step, c(6L, 30L))
  expect_identical(attempts$restored_step, c(0L, 4L))
  expect_identical(attempts$workers, c(1L, 1L))
  expect_s3_class(attempts$started, "POSIXct")
  expect_true(is.na(attempts$recovery_seconds[1]) && attempts$recovery_seconds[2] > 0)
  # the killed start's time after its last completed step is detection; the completed one has none
  expect_s3_class(attempts$last_step_at, "POSIXct")
  expect_true(attempts$last_step_at[1] <= attempts$ended[1])
  expect_equal(attempts$detection_seconds, c(as.numeric(attempts$ended[1] - attempts$last_step_at[1], units = "secs"), 0),
               tolerance = 0.01)
  expect_true(all(attempts$first_step_at > attempts$started))
  expect_true(attr(report, "mean_save_interval_seconds") > 0)
  expect_identical(attr(report, "redone_steps"), 2L)
  expect_identical(attr(report, "failures"), 1L)
  expect_true(attr(report, "goodput") > 0 && attr(report, "goodput") < 1)
  expect_equal(attr(report, "suggested_interval_seconds"),
               sqrt(2 * attr(report, "save_cost_seconds") * attr(report, "mean_time_between_failures")))
  expect_output(print(report), "2 attempt\\(s\\), 1 failure\\(s\\)")
  expect_output(print(report[report$part == "redone", ]), "redone")  # a subset prints as a data frame
  png <- file.path(dir, "timeline.png")
  expect_identical(plot_goodput(report, png), png)
  expect_identical(readBin(png, "raw", 4L), as.raw(c(0x89, 0x50, 0x4e, 0x47)))
  expect_error(plot_goodput(data.frame(), png), "what goodput\\(\\) returned", class = "kerasdist_ValueError")
  expect_error(plot_goodput(report, NA_character_), "path must be one file name", class = "kerasdist_ValueError")
})

test_that("the fits return keras3 training histories covering earlier runs; resume_fit pipes", {
  skip_if_no_kerasdist()
  dir <- file.path(withr::local_tempdir(), "ckpt")
  x <- matrix(seq_len(256) / 256, ncol = 4)
  y <- rowSums(x)
  build <- function() keras_model_sequential(input_shape = 4) |> layer_dense(1) |> compile(optimizer = "adam", loss = "mse")
  first <- distributed_fit(build, x, y, epochs = 2, checkpoint_dir = dir, strategy = "default", batch_size = 16, verbose = 0)
  expect_s3_class(first, "keras_training_history")
  expect_length(first$metrics$loss, 2)

  model <- make_or_restore_model(dir, build)
  history <- model |> resume_fit(make_dataset(x, y, batch_size = 16, epochs = 1), epochs = 4, verbose = 0)
  expect_s3_class(history, "keras_training_history")
  expect_identical(history$params$epochs, 4L)
  expect_identical(history$metrics$loss[1:2], first$metrics$loss)  # earlier run's epochs included
  frame <- as.data.frame(history)
  expect_identical(frame$epoch, 1:4)
  expect_identical(frame$value, history$metrics$loss)
  expect_output(print(history), "loss")
  expect_identical(latest_checkpoint(dir)$epoch, 4L)
  expect_error(build() |> resume_fit(make_dataset(x, y, batch_size = 16, epochs = 1), epochs = 1),
               "checkpoint is required", class = "kerasdist_ValueError")
  # a model built elsewhere takes the directory's newest checkpoint first, then trains epoch 5 only
  continued <- build() |> resume_fit(make_dataset(x, y, batch_size = 16, epochs = 1), epochs = 5, checkpoint = dir,
                                     verbose = 0)
  expect_identical(continued$metrics$loss[1:4], history$metrics$loss)
  expect_identical(latest_checkpoint(dir)$global_step, 20L)  # 4 batches an epoch
})

test_that("keras3 callbacks pass through distributed_fit and resume_fit", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  x <- matrix(seq_len(256) / 256, ncol = 4)
  y <- rowSums(x)
  build <- function() keras_model_sequential(input_shape = 4) |> layer_dense(1) |> compile(optimizer = "adam", loss = "mse")
  epochs_seen <- integer()
  callbacks <- list(
    callback_csv_logger(file.path(dir, "log.csv")),
    callback_early_stopping(monitor = "loss", patience = 10),
    callback_tensorboard(file.path(dir, "tb")),
    callback_lambda(on_epoch_end = function(epoch, logs) epochs_seen <<- c(epochs_seen, as.integer(epoch)))
  )
  distributed_fit(build, x, y, epochs = 2, checkpoint_dir = file.path(dir, "ckpt"), strategy = "default",
                  batch_size = 32, callbacks = callbacks, verbose = 0)
  expect_identical(epochs_seen, 1:2)  # keras3 numbers epochs from 1 for R callbacks
  expect_identical(nrow(utils::read.csv(file.path(dir, "log.csv"))), 2L)
  expect_true(length(list.files(file.path(dir, "tb"), recursive = TRUE)) > 0)

  model <- make_or_restore_model(file.path(dir, "ckpt"), build)
  # resumed without the callbacks whose state the checkpoint kept: said once, as a warning
  expect_warning(
    model |> resume_fit(make_dataset(x, y, batch_size = 32, epochs = 1), epochs = 3, callbacks = callbacks[[4]],
                        verbose = 0),
    "match no callback of this run and are not used: CSVLogger"
  )
  expect_identical(epochs_seen, 1:3)
})

test_that("make_or_restore_model works in with(scope) for a strategy from the tensorflow package", {
  skip_if_no_kerasdist()
  dir <- file.path(withr::local_tempdir(), "ckpt")
  strategy <- tensorflow::tf$distribute$MirroredStrategy(list("/cpu:0"))
  build <- function() keras_model_sequential(input_shape = 4) |> layer_dense(1) |> compile(optimizer = "adam", loss = "mse")
  with(strategy$scope(), {
    model <- make_or_restore_model(dir, build)
  })
  expect_true(model$distribute_strategy$`__class__`$`__name__` == "MirroredStrategy")
  x <- matrix(seq_len(64) / 64, ncol = 4)
  ds <- make_dataset(x, rowSums(x), batch_size = 8, epochs = 1)
  model |> fit(ds, epochs = 1, verbose = 0)  # keras3's own fit on a make_dataset pipeline
  expect_identical(as.integer(model$optimizer$iterations$numpy()), 2L)
})

test_that("R code in the step is refused under 2 replicas on every path, keras3's fit() included (2-device R session)", {
  skip_if_no_kerasdist()
  result <- in_two_device_r(function() {
    library(keras3)
    library(kerasdist)
    simulate_devices(2L)
    strategy <- select_strategy()
    r_loss <- function(y_true, y_pred) op_mean(op_square(y_true - y_pred), axis = -1)
    r_metric <- custom_metric("r_mae", function(y_true, y_pred) op_mean(op_abs(y_true - y_pred), axis = -1))
    r_layer <- Layer("RDouble", call = function(inputs) inputs * 2)
    builds <- list(
      loss = function() keras_model_sequential(input_shape = 4) |> layer_dense(1) |> compile(optimizer = "adam", loss = r_loss),
      metric = function() keras_model_sequential(input_shape = 4) |> layer_dense(1) |> compile(optimizer = "adam", loss = "mse", metrics = list(r_metric)),
      layer = function() keras_model_sequential(input_shape = 4) |> r_layer() |> layer_dense(1) |> compile(optimizer = "adam", loss = "mse")
    )
    x <- matrix(seq_len(64) / 64, ncol = 4)
    y <- rowSums(x)
    message_of <- function(expr) tryCatch({ expr; "no error" }, error = function(e) paste(class(e)[1], conditionMessage(e)))
    dir <- tempfile()
    c(
      lapply(builds, function(build) message_of(distributed_fit(build, x, y, epochs = 1, checkpoint_dir = tempfile(), batch_size = 16))),
      resume_fit = message_of({
        with(strategy$scope(), model <- make_or_restore_model(dir, builds$loss))
        model |> resume_fit(make_dataset(x, y, batch_size = 16, epochs = 1), epochs = 1)
      }),
      keras3_fit = message_of(model |> fit(x, y, epochs = 1, verbose = 0)),
      checkpoints = nrow(list_checkpoints(dir))
    )
  })
  for (path in c("loss", "resume_fit")) {
    expect_match(result[[path]], "^kerasdist_ValueError loss is an R function, and the strategy has 2 replicas")
  }
  expect_match(result$metric, "^kerasdist_ValueError metrics\\[0\\] is an R function")
  expect_match(result$layer, "^kerasdist_ValueError layer 'r_double' \\(call\\) is an R function")
  expect_match(result$keras3_fit, "loss is an R function, and the strategy has 2 replicas")
  expect_identical(result$checkpoints, 0L)
})

test_that("a Python without kerasdist, chosen and started before it, gets one sentence with the one fix", {
  skip_if_no_kerasdist()
  system_python <- "/usr/bin/python3"  # Debian's: no TensorFlow, no kerasdist (tools/setup.sh installs it)
  skip_if(!file.exists(system_python), "no /usr/bin/python3")
  result <- callr::r(function(python) {
    reticulate::use_python(python, required = TRUE)
    reticulate::py_config()  # another package started this Python first
    library(kerasdist)
    tryCatch(select_strategy(), error = function(e) list(class = class(e), message = conditionMessage(e)))
  }, args = list(python = unname(system_python)), libpath = .libPaths(),
  env = c(callr::rcmd_safe_env(), KERASDIST_PYTHON = "", RETICULATE_PYTHON = unname(system_python)))
  expect_true(all(c("kerasdist_setup_error", "kerasdist_error") %in% result$class))
  # ('kerasdist' too, unless PYTHONPATH points at a checkout's python/)
  expect_match(result$message, "reticulate already runs the Python at .*python3.* which has no 'tensorflow'( and 'kerasdist')? module")
  expect_match(result$message, "restart R without RETICULATE_PYTHON or reticulate::use_python() choosing it", fixed = TRUE)
  expect_false(grepl("Traceback", result$message))
})

test_that("install_kerasdist() refuses bad arguments before creating anything", {
  env <- file.path(withr::local_tempdir(), "env")
  expect_error(install_kerasdist(envname = c("a", "b")), "envname must be", class = "kerasdist_error")
  expect_error(install_kerasdist(env, gpu = "yes"), "gpu must be TRUE or FALSE", class = "kerasdist_error")
  expect_error(install_kerasdist(env, storage = "azure"), 'storage must be NULL or one or both of "s3" and "gcs"',
               class = "kerasdist_error")
  expect_error(install_kerasdist(env, source = file.path(env, "missing")), "source must be a kerasdist wheel",
               class = "kerasdist_error")
  expect_false(dir.exists(env))
})

test_that("the R package carries kerasdist's Python package and pinned versions for install_kerasdist()", {
  skip_if_no_kerasdist()
  source <- system.file("python", "source", package = "kerasdist")
  expect_true(file.exists(file.path(source, "pyproject.toml")))
  expect_true(file.exists(file.path(source, "python", "kerasdist", "__init__.py")))
  expect_true(file.exists(file.path(source, "python", "kerasdist_cli", "__init__.py")))
  about <- readLines(file.path(source, "python", "kerasdist", "about.py"))
  expect_true(any(grepl(sprintf('VERSION = "%s"', utils::packageVersion("kerasdist")), about, fixed = TRUE)))
  pins <- readLines(system.file("python", "constraints.txt", package = "kerasdist"))
  expect_true(any(grepl("^tensorflow-cpu==2\\.21", pins)))
})

test_that("an Rscript preempted by SIGTERM saves and exits 75; interactively resume_fit signals kerasdist_preempted", {
  skip_if_no_kerasdist()
  runs <- killed_then_rerun_and_preempted()  # after the keras3 user's rerun: interactively, then as the Rscript it is
  dir <- runs$dir
  preempted <- runs$rerun
  info <- paste(preempted$console, collapse = "\n")

  signalled <- file.path(dir, "condition")
  result <- readRDS(file.path(signalled, "preempted.rds"))
  expect_identical(result$class, c("kerasdist_preempted", "kerasdist_error", "error", "condition"))
  expect_identical(result$status, 75L)
  expect_identical(basename(result$checkpoint), basename(latest_checkpoint(file.path(signalled, "ckpt"))$path))
  expect_identical(result$global_step, latest_checkpoint(file.path(signalled, "ckpt"))$global_step)
  expect_match(result$message, "^Preempted \\(SIGTERM\\): saved checkpoint .*ckpt")
  expect_true("the session went on after kerasdist_preempted" %in% preempted$console, info = info)

  exited <- file.path(dir, "exit")
  expect_identical(preempted$status, 75L, info = info)
  expect_false(file.exists(file.path(exited, "preempted.rds")))  # it exited inside resume_fit
  expect_identical(latest_checkpoint(file.path(exited, "ckpt"))$global_step, 3L)  # the step it came in
  expect_false(any(grepl("SystemExit|Traceback", preempted$console)), info = info)
})

test_that("a lost peer (PeerLostExit, status 76) is a kerasdist_peer_lost condition naming the peer", {
  skip_if_no_kerasdist()
  withr::local_options(kerasdist.exit_on_preemption = FALSE)  # an Rscript would exit 76 here
  # TensorFlow's own error for an all-reduce whose peer was SIGKILLed, as a multi-worker fit raises it
  raise <- reticulate::py_run_string(paste(
    "import tensorflow as tf",
    "from kerasdist.preemption.exit import exit_on_lost_peer",
    "def fit():",
    "    with exit_on_lost_peer(2, 'worker:0'):",
    "        raise tf.errors.UnavailableError(None, None, 'Collective ops is aborted by: Socket closed\\n'",
    "            'Additional GRPC error information from remote target /job:worker/replica:0/task:1')",
    sep = "\n"), convert = FALSE)$fit
  err <- expect_error(kerasdist:::call_python(raise), class = "kerasdist_peer_lost")
  expect_s3_class(err, "kerasdist_error")
  expect_identical(err$status, 76L)
  expect_identical(err$peer, "worker:1")
  expect_match(conditionMessage(err), "^worker:1 of this multi-worker cluster was lost \\(Collective ops is aborted by: Socket closed\\); the newest checkpoint is intact")
})

test_that("a cluster task signalled before training exits 75 at once, while R code runs", {
  skip_if_no_kerasdist()
  script <- normalizePath(test_path("scripts", "signalled_before_training.R"))
  dir <- withr::local_tempdir()
  exited <- run_rscript(script, dir, c("SLURM_JOB_ID=7", "SLURM_PROCID=0", "SLURM_NTASKS=1"))
  expect_identical(exited$status, 75L, info = paste(exited$console, collapse = "\n"))
  expect_false(file.exists(file.path(dir, "survived.txt")))
  expect_true(any(grepl("SIGTERM outside training, nothing to save: exiting with 75", exited$console)))
})

test_that("a TensorFlow runtime error reaches R as one condition: the op and the cause, no Python frames", {
  skip_if_no_kerasdist()
  x <- matrix(seq_len(256) / 256, ncol = 4)
  y <- rep(c(0L, 12L), 32)  # labels outside the 3 classes: only the running step can tell
  model <- make_or_restore_model(file.path(withr::local_tempdir(), "ckpt"), function() {
    keras_model_sequential(input_shape = 4) |> layer_dense(3) |>
      compile(optimizer = "adam", loss = "sparse_categorical_crossentropy")
  })
  err <- tryCatch(model |> resume_fit(make_dataset(x, y, batch_size = 16, epochs = 1), epochs = 1, verbose = 0),
                  error = function(e) e)
  expect_s3_class(err, "kerasdist_InvalidArgumentError")
  expect_match(conditionMessage(err), "^TensorFlow failed in the training step at op 'compile_loss/sparse_categorical_crossentropy/")
  expect_match(conditionMessage(err), "Received a label value of 12 which is outside the valid range of [0, 3)", fixed = TRUE)
  expect_false(grepl("File \"|most recent call|Traceback", conditionMessage(err)))
  expect_match(deparse(conditionCall(err))[1], "^resume_fit\\(")
})
