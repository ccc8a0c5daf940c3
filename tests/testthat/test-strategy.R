test_that("the default strategy prints what it is and why", {
  skip_if_no_kerasdist()
  strategy <- select_strategy("default", environ = list(), tpu = FALSE)
  expect_s3_class(strategy, "kerasdist_strategy")
  description <- describe_strategy(strategy)
  expect_identical(description$kind, "default")
  expect_identical(description$num_replicas, 1L)
  expect_true(description$is_chief)
  expect_output(print(strategy), "strategy:  default")
  expect_output(print(strategy), 'why:       kind="default" was asked for', fixed = TRUE)
})

test_that("run_context says where this process runs, as in Python", {
  skip_if_no_kerasdist()
  context <- run_context(select_strategy("default", environ = list(), tpu = FALSE))
  expect_s3_class(context, "kerasdist_run_context")
  expect_identical(context$kind, "default")
  expect_identical(c(context$num_replicas, context$num_workers), c(1L, 1L))
  expect_true(context$is_chief)
  expect_null(context$task)
  expect_output(print(context), "default: 1 replica(s), 1 worker(s), one process, chief", fixed = TRUE)
})

test_that("chief_path is the path itself on the chief (the 2-worker case is in test-multi-worker.R)", {
  skip_if_no_kerasdist()
  path <- file.path(tempdir(), "logs")
  expect_identical(chief_path(path), path)
  expect_identical(chief_path(path, context = run_context()), path)
  expect_error(chief_path(""), "path must be a file or directory path", class = "kerasdist_ValueError")
})

test_that("describe_strategy refuses something that is not a strategy", {
  skip_if_no_kerasdist()
  expect_error(describe_strategy("mirrored"), "strategy must be a tf.distribute.Strategy, got str",
               class = "kerasdist_ValueError")
})

test_that("parse_tf_config accepts an R list with a single worker address", {
  skip_if_no_kerasdist()
  info <- parse_tf_config(list(cluster = list(worker = "a:1"), task = list(type = "worker", index = 0)))
  expect_identical(info$cluster$worker, "a:1")
  expect_identical(info$task_index, 0L)
  expect_true(info$is_chief)
})

test_that("simulated devices give mirrored, with() keeps objects, and fit runs", {
  skip_if_no_kerasdist()
  result <- in_two_device_r(function() {
    library(keras3)
    library(kerasdist)
    simulate_devices(2)
    strategy <- select_strategy()
    with(strategy$scope(), {
      model <- keras_model_sequential(input_shape = 3) |> layer_dense(1) |> compile(optimizer = "sgd", loss = "mse")
    })
    x <- matrix(seq_len(48) / 48, ncol = 3)
    history <- fit(model, x, x[, 1, drop = FALSE], batch_size = 8, epochs = 1, verbose = 0)
    description <- describe_strategy(strategy)
    list(
      kind = description$kind, replicas = description$num_replicas, reason = description$reason,
      devices = description$devices, steps = model$optimizer$iterations$numpy(),
      loss = history$metrics$loss[[1]],
      variable_replicas = length(model$weights[[1]]$value$values)
    )
  })
  expect_identical(result$kind, "mirrored")
  expect_identical(result$replicas, 2L)
  expect_match(result$reason, "split into 2 logical devices")
  expect_identical(result$devices, c("/cpu:0", "/cpu:1"))
  expect_equal(as.integer(result$steps), 2L)
  expect_true(is.finite(result$loss))
  expect_identical(result$variable_replicas, 2L)
})

test_that("simulate_devices after TensorFlow started is a readable R error", {
  skip_if_no_kerasdist()
  message <- in_fresh_r(function() {
    library(kerasdist)
    select_strategy("one_device", tpu = FALSE)$extended  # initializes the devices
    tryCatch(simulate_devices(2), kerasdist_error = function(e) conditionMessage(e))
  })
  expect_match(message, "^simulate_devices\\(2\\) came too late")
})

test_that("with no Python chosen, loading kerasdist declares its Python package and pins for reticulate and starts nothing", {
  result <- callr::r(function() {
    Sys.unsetenv(c("KERASDIST_PYTHON", "RETICULATE_PYTHON"))
    Sys.setenv(UV_CONSTRAINT = "/elsewhere/keras-constraints.txt")  # keras3's own, kept
    setwd(tempdir())
    loadNamespace("keras3")  # library(keras3), which declares TensorFlow
    loadNamespace("kerasdist")
    declared <- list(packages = reticulate::py_require()$packages, constraint = Sys.getenv("UV_CONSTRAINT"),
                     python = kerasdist::kerasdist_python())
    kerasdist::kerasdist_py_require(storage = c("s3", "gcs"))
    c(declared, list(with_storage = reticulate::py_require()$packages,
                     bad = tryCatch(kerasdist::kerasdist_py_require(storage = "azure"), error = conditionMessage),
                     started = reticulate::py_available(initialize = FALSE)))
  }, libpath = .libPaths(), env = c(callr::rcmd_safe_env(), WORKON_HOME = tempfile("no-virtualenvs-")))
  source <- normalizePath(system.file("python", "source", package = "kerasdist"))
  expect_true(paste0("kerasdist@", source) %in% result$packages)
  expect_true("keras" %in% result$packages)  # keras3's, in the same environment
  constraints <- strsplit(result$constraint, " ")[[1]]  # the earlier ones (keras3's too) kept, kerasdist's last
  expect_identical(constraints[[1]], "/elsewhere/keras-constraints.txt")
  expect_identical(utils::tail(constraints, 1), system.file("python", "constraints.txt", package = "kerasdist"))
  expect_null(result$python)
  expect_true(all(c("fsspec", "s3fs", "gcsfs") %in% result$with_storage))
  expect_match(result$bad, 'storage must be NULL or one or both of "s3" and "gcs", got azure')
  expect_false(result$started)  # nothing installed or started until Python is used
})

test_that("a Python without TensorFlow is named, with the command that fixes it", {
  skip_if_no_kerasdist()
  bare <- file.path(tempfile("bare-venv-"))
  on.exit(unlink(bare, recursive = TRUE))
  system2(kerasdist_python(), c("-m", "venv", "--without-pip", bare))
  result <- in_fresh_r(function(python) {
    options(kerasdist.python = python)
    tryCatch(kerasdist::select_strategy(), kerasdist_setup_error = function(e) conditionMessage(e))
  }, python = file.path(bare, "bin", "python"))
  expect_match(result, paste0("^The Python at .* \\(from options\\(kerasdist.python\\)\\) has no 'tensorflow'",
                              "( and 'kerasdist')? module: run `kerasdist::install_kerasdist\\(\".*bare-venv-.*\"\\)` once, then restart R\\.$"))
  expect_false(grepl("make demo|checkout", result))
})
