# distributed_fit from R, the R-function guardrail under 2 replicas, load_digits and kerasdist_demo().

train_build_model <- function() {
  keras_model_sequential(input_shape = 64) |>
    layer_dense(16, activation = "relu") |>
    layer_dense(10, activation = "softmax") |>
    compile(optimizer = "adam", loss = "sparse_categorical_crossentropy", metrics = "accuracy")
}

test_that("load_digits gives the bundled digits as R arrays", {
  skip_if_no_kerasdist()
  digits <- load_digits()
  expect_identical(dim(digits$x), c(1797L, 8L, 8L, 1L))
  expect_true(is.integer(digits$y))
  expect_identical(as.vector(table(digits$y)), c(178L, 182L, 177L, 183L, 181L, 182L, 181L, 179L, 174L, 180L))
  expect_identical(range(digits$x), c(0, 1))
  flat <- load_digits(flatten = TRUE)
  expect_identical(dim(flat$x), c(1797L, 64L))
  expect_equal(flat$x[2, 1:8], as.vector(digits$x[2, 1, , 1]))  # row-major pixels, as in Python
})

test_that("distributed_fit records its speed settings and refuses other ones on resume", {
  skip_if_no_kerasdist()
  dir <- file.path(withr::local_tempdir(), "ckpt")
  digits <- load_digits(flatten = TRUE)
  fit_with <- function(steps) {
    distributed_fit(train_build_model, digits$x[1:128, ], digits$y[1:128], epochs = 1, checkpoint_dir = dir,
                    strategy = "default", batch_size = 64, verbose = 0, gradient_accumulation_steps = steps)
  }
  fit_with(2)
  expect_identical(latest_checkpoint(dir)$settings$gradient_accumulation_steps, 2L)
  expect_error(fit_with(NULL), "gradient_accumulation_steps", class = "kerasdist_error")
})

test_that("distributed_fit trains with an R build function, then resumes to the total", {
  skip_if_no_kerasdist()
  dir <- file.path(withr::local_tempdir(), "ckpt")
  digits <- load_digits(flatten = TRUE)
  x <- digits$x[1:256, ]
  y <- digits$y[1:256]
  epochs_seen <- integer()
  # keras3 hands R callbacks 1-based epochs; the history and checkpoints count from 0.
  r_callback <- callback_lambda(on_epoch_end = function(epoch, logs) epochs_seen <<- c(epochs_seen, as.integer(epoch)))
  first <- distributed_fit(train_build_model, x, y, epochs = 1, checkpoint_dir = dir, strategy = "default",
                           batch_size = 64, validation_split = 0.25, every_steps = 2, verbose = 0,
                           callbacks = list(r_callback))
  expect_s3_class(first, "keras_training_history")
  expect_identical(seq_along(first$metrics$loss) - 1L, 0L)
  expect_identical(as.integer(first$model$optimizer$iterations$numpy()), 3L)
  second <- distributed_fit(train_build_model, x, y, epochs = 2, checkpoint_dir = dir, strategy = "default",
                            batch_size = 64, validation_data = list(x[193:256, ], y[193:256]), verbose = 0,
                            callbacks = r_callback)
  expect_identical(seq_along(second$metrics$loss) - 1L, 0:1)
  expect_length(second$metrics$loss, 2)
  expect_identical(as.integer(second$model$optimizer$iterations$numpy()), 7L)
  expect_identical(epochs_seen, 1:2)  # epoch 0 in the first run, epoch 1 (resumed) in the second
  expect_identical(latest_checkpoint(dir)$epoch, 2L)
})

test_that("a callback that stops distributed_fit mid-epoch (or at a resumed epoch's end) leaves that step; run again, it goes on", {
  skip_if_no_kerasdist()
  dir <- file.path(withr::local_tempdir(), "ckpt")
  digits <- load_digits(flatten = TRUE)
  x <- digits$x[1:256, ]  # 4 steps an epoch
  y <- digits$y[1:256]
  StopAtStep <- Callback("StopAtStep",
    initialize = function(step) {
      super$initialize()
      self$step <- step
    },
    on_train_batch_end = function(batch, logs = NULL) {
      if (as.integer(self$model$optimizer$iterations$numpy()) == self$step) self$model$stop_training <- TRUE
    }
  )
  fit_to_3 <- function(...) {
    distributed_fit(train_build_model, x, y, epochs = 3, checkpoint_dir = dir, strategy = "default",
                    batch_size = 64, every_steps = 4, verbose = 0, ...)
  }
  stopped <- fit_to_3(callbacks = list(StopAtStep(6L)))
  expect_identical(as.integer(stopped$model$optimizer$iterations$numpy()), 6L)
  latest <- latest_checkpoint(dir)
  expect_identical(c(latest$global_step, latest$epoch, latest$step_in_epoch), c(6L, 1L, 2L))
  # resumed mid-epoch, stopped within the rest of that epoch, then at its last batch: it stops there
  for (stop in list(c(7L, 1L, 3L), c(8L, 2L, 0L))) {
    ended <- fit_to_3(callbacks = list(StopAtStep(stop[[1]])))
    expect_identical(as.integer(ended$model$optimizer$iterations$numpy()), stop[[1]])
    latest <- latest_checkpoint(dir)
    expect_identical(c(latest$global_step, latest$epoch, latest$step_in_epoch), stop)
  }
  resumed <- fit_to_3()
  expect_identical(as.integer(resumed$model$optimizer$iterations$numpy()), 12L)  # every batch once
  expect_length(resumed$metrics$loss, 3)
})

test_that("distributed_fit refuses bad input with a kerasdist_error before creating the checkpoint dir", {
  skip_if_no_kerasdist()
  dir <- file.path(withr::local_tempdir(), "ckpt")
  digits <- load_digits(flatten = TRUE)
  x <- digits$x[1:64, ]
  y <- digits$y[1:64]
  fit <- function(...) {
    args <- modifyList(list(build_fn = train_build_model, x = x, y = y, epochs = 1, checkpoint_dir = dir,
                            strategy = "default", verbose = 0), list(...))
    do.call(distributed_fit, args)
  }
  expect_error(fit(epochs = 0), "epochs must be an integer >= 1", class = "kerasdist_ValueError")
  expect_error(fit(strategy = "bogus"), "strategy must be", class = "kerasdist_error")
  expect_error(fit(build_fn = "model"), "build_fn must be a function", class = "kerasdist_error")
  expect_error(fit(validation_split = 2), "validation_split", class = "kerasdist_error")
  expect_error(fit(callbacks = list("tensorboard")), "callbacks\\[0\\] must be a Keras callback", class = "kerasdist_error")
  expect_error(fit(keep = 0), "keep must be", class = "kerasdist_error")
  expect_error(fit(batch_size = 32, steps_per_execution = 3), "does not divide the 2 steps of an epoch",
               class = "kerasdist_error")
  expect_error(fit(steps_per_execution = "fast"), "steps_per_execution must be 'auto'", class = "kerasdist_error")
  expect_false(dir.exists(dir))
  history <- fit(batch_size = 16, steps_per_execution = 2, every_steps = 2)  # 4 steps, 2 per call
  expect_identical(as.integer(history$model$steps_per_execution), 2L)
  expect_identical(as.integer(history$model$optimizer$iterations$numpy()), 4L)
  expect_identical(latest_checkpoint(dir)$epoch, 1L)
})

test_that("an R loss under 2 replicas stops with a readable error, a built-in loss trains (2-device R session)", {
  skip_if_no_kerasdist()
  result <- in_two_device_r(function() {
    library(keras3)
    library(kerasdist)
    simulate_devices(2L)
    build <- function(loss) function() {
      keras_model_sequential(input_shape = 64) |>
        layer_dense(10, activation = "softmax") |>
        compile(optimizer = "adam", loss = loss, metrics = "accuracy")
    }
    r_loss <- function(y_true, y_pred) loss_sparse_categorical_crossentropy(y_true, y_pred)
    digits <- load_digits(flatten = TRUE)
    dir <- tempfile()
    err <- tryCatch(
      distributed_fit(build(r_loss), digits$x[1:128, ], digits$y[1:128], epochs = 1, checkpoint_dir = dir, batch_size = 64),
      error = function(e) e
    )
    history <- distributed_fit(build("sparse_categorical_crossentropy"), digits$x[1:128, ], digits$y[1:128],
                               epochs = 1, checkpoint_dir = tempfile(), batch_size = 64, verbose = 0)
    with(select_strategy()$scope(), own <- build(r_loss)())  # made by the user, trained by keras3's fit()
    own_err <- tryCatch(own |> fit(digits$x[1:128, ], digits$y[1:128], epochs = 1, verbose = 0),
                        error = function(e) e)
    list(class = class(err), message = conditionMessage(err), replicas = describe_strategy(select_strategy())$num_replicas,
         checkpoints = nrow(list_checkpoints(dir)), loss = history$metrics$loss,
         own_message = conditionMessage(own_err))
  })
  expect_identical(result$replicas, 2L)
  expect_true("kerasdist_error" %in% result$class)
  expect_match(result$message, "loss is an R function, and the strategy has 2 replicas")
  expect_match(result$message, "built-in Keras loss", fixed = TRUE)
  expect_match(result$message, "py_run_string", fixed = TRUE)
  expect_identical(result$checkpoints, 0L)
  expect_length(result$loss, 1)
  expect_match(result$own_message, "loss is an R function, and the strategy has 2 replicas")
})

test_that("kerasdist_demo() runs end to end from R: killed, resumed, PNG written (fresh R)", {
  skip_if_no_kerasdist()
  run_dir <- withr::local_tempdir()
  output <- in_fresh_r(function(run_dir) {
    # No library(keras3) here: kerasdist_demo() wants a session where TensorFlow has not started
    # (it reads the digits before simulate_devices(2), which keras3's load hook would make too late).
    out <- utils::capture.output(result <- kerasdist::kerasdist_demo(run_dir, epochs = 1))
    list(result = result, out = out)
  }, run_dir = run_dir)
  result <- output$result
  expect_identical(result$strategy, "mirrored")
  expect_identical(result$killed_at, list(epoch = 0L, step_in_epoch = 13L))
  expect_identical(result$resumed_from, list(epoch = 0L, step_in_epoch = 10L, global_step = 10L))
  expect_identical(result$optimizer_steps, 22L)
  expect_true(any(grepl("test accuracy", output$out)))
  png <- file.path(run_dir, "curves.png")
  expect_identical(readBin(png, "raw", 4L), as.raw(c(0x89, 0x50, 0x4e, 0x47)))
})
