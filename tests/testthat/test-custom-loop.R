# custom_fit from R: an R step_fn is refused, a Python one trains and resumes, keras3 history.

custom_loop_build <- function() {
  keras_model_sequential(input_shape = 4) |>
    layer_dense(8, activation = "relu") |>
    layer_dense(1) |>
    compile(optimizer = optimizer_sgd(0.05), loss = "mse")
}

test_that("custom_fit refuses an R step_fn, saying why", {
  skip_if_no_kerasdist()
  expect_error(
    custom_fit(custom_loop_build, NULL, function(model, optimizer, batch) NULL, epochs = 1,
               checkpoint_dir = withr::local_tempdir()),
    "R function.*thread", class = "kerasdist_error"
  )
})

test_that("a Python step_fn trains, resumes to the total and returns a keras_training_history", {
  skip_if_no_kerasdist()
  reticulate::py_run_string("
import keras, tensorflow as tf, kerasdist
def custom_loop_step(model, optimizer, batch):
    x, y = batch
    with tf.GradientTape() as tape:
        per_example = keras.losses.mean_squared_error(y, model(x, training=True))
        loss = kerasdist.scaled_loss(per_example, model=model)
    grads = tape.gradient(optimizer.scale_loss(loss), model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    return {'loss': loss}
")
  dir <- file.path(withr::local_tempdir(), "ckpt")
  set.seed(1)
  x <- matrix(runif(160), ncol = 4)
  data <- make_dataset(x, rowSums(x), batch_size = 8, seed = 1, epochs = 1, shuffle = FALSE)
  first <- custom_fit(custom_loop_build, data, reticulate::py$custom_loop_step, epochs = 1,
                      checkpoint_dir = dir, every_steps = 2, verbose = 0)
  expect_s3_class(first, "keras_training_history")
  expect_length(first$metrics$loss, 1)
  expect_identical(as.integer(first$model$optimizer$iterations$numpy()), 5L)
  second <- custom_fit(custom_loop_build, data, reticulate::py$custom_loop_step, epochs = 3,
                       checkpoint_dir = dir, verbose = 0)
  expect_length(second$metrics$loss, 3)
  expect_identical(second$metrics$loss[1], first$metrics$loss[1])
  expect_identical(as.integer(second$model$optimizer$iterations$numpy()), 15L)
  expect_identical(latest_checkpoint(dir)$epoch, 3L)
  expect_error(custom_fit(custom_loop_build, data, reticulate::py$custom_loop_step, epochs = 4,
                          checkpoint_dir = dir, verbose = 0, gradient_accumulation_steps = 2),
               "gradient_accumulation_steps=2 differs", class = "kerasdist_error")
})

test_that("fit_step() runs one of fit's steps from R: the loss, and one optimizer update", {
  skip_if_no_kerasdist()
  model <- keras_model_sequential(input_shape = 4) |> layer_dense(1) |> compile(optimizer = "sgd", loss = "mse")
  x <- matrix(seq_len(32) / 32, ncol = 4)
  batch <- reticulate::iter_next(reticulate::as_iterator(make_dataset(x, rowSums(x), batch_size = 8, shuffle = FALSE)))
  result <- fit_step(model, model$optimizer, batch)
  expect_named(result, "loss")
  expect_true(is.finite(as.numeric(result$loss)))
  expect_identical(as.integer(model$optimizer$iterations$numpy()), 1L)
})

test_that("every_steps counts batches under gradient accumulation: no checkpoint replaces another", {
  skip_if_no_kerasdist()
  dir <- file.path(withr::local_tempdir(), "ckpt")
  x <- matrix(seq_len(160) / 160, ncol = 4)
  data <- make_dataset(x, rowSums(x), batch_size = 4, shuffle = FALSE)  # 10 batches an epoch
  history <- custom_fit(custom_loop_build, data, epochs = 2, checkpoint_dir = dir, every_steps = 4,
                        keep = 100, verbose = 0, gradient_accumulation_steps = 3)
  saved <- list_checkpoints(dir)
  expect_identical(basename(saved$path),
                   c("ckpt-4", "ckpt-8", "ckpt-10", "ckpt-12", "ckpt-16", "ckpt-20"))
  expect_identical(saved$step_in_epoch, c(4L, 8L, 0L, 2L, 6L, 0L))
  expect_identical(as.integer(history$model$optimizer$iterations$numpy()), 6L)  # applied updates
})
