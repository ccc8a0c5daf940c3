# distributed_evaluate and distributed_predict from R: keras3's single-device results,
# under 2 simulated devices (the R session the 2-device tests share) and on a model restored from a
# checkpoint.

eval_build_model <- function() {
  keras3::set_random_seed(1)
  keras_model_sequential(input_shape = 4) |>
    layer_dense(8, activation = "relu") |>
    layer_dense(3, kernel_regularizer = regularizer_l2(0.1)) |>
    compile(optimizer = "adam", loss = loss_sparse_categorical_crossentropy(from_logits = TRUE),
            metrics = "accuracy")
}
environment(eval_build_model) <- globalenv()  # callr sends it to fresh sessions without the test's frames

test_that("distributed_evaluate and distributed_predict give keras3's results on one device", {
  skip_if_no_kerasdist()
  model <- eval_build_model()
  set.seed(1)
  x <- matrix(rnorm(11 * 4), ncol = 4)
  y <- sample(0:2, 11, replace = TRUE)
  expected <- evaluate(model, x, y, batch_size = 4, verbose = 0)
  got <- distributed_evaluate(model, x, y, batch_size = 4)
  expect_identical(sort(names(got)), sort(names(expected)))
  expect_equal(got[names(expected)], lapply(expected, as.numeric), tolerance = 1e-6)
  predicted <- distributed_predict(model, x, batch_size = 4)
  expect_true(is.matrix(predicted))
  expect_equal(predicted, predict(model, x, verbose = 0), tolerance = 1e-6)
  expect_error(distributed_evaluate(model, "data/*.csv"), "x is a file pattern", class = "kerasdist_error")
})

# Both 2-replica tests below from one call into the 2-device R session (TensorFlow splits the CPU
# once per process, and each start-up costs seconds): evaluate and predict on partial batches, then
# a model restored from the checkpoint `dir`, which this test process wrote.
two_replica_results <- local({
  results <- NULL
  function(dir, x, y) {
    if (is.null(results)) results <<- in_two_device_r(function(build, partial, restored, dir, x, y) {
      library(keras3)
      library(kerasdist)
      simulate_devices(2L)
      strategy <- select_strategy()
      list(partial_batches = partial(build, strategy), restored = restored(strategy, dir, x, y))
    }, build = eval_build_model, partial = partial_batch_cases, restored = restored_evaluation,
    dir = dir, x = x, y = y)
    results
  }
})

# the checkpoint of a 2-epoch run on the default strategy, 40 samples; its data
restored_fixture <- local({
  fixture <- NULL
  function() {
    if (is.null(fixture)) {
      dir <- file.path(tempfile("evaluation-"), "ckpt")
      set.seed(3)
      x <- matrix(rnorm(40 * 4), ncol = 4)
      y <- sample(0:2, 40, replace = TRUE)
      distributed_fit(eval_build_model, x, y, epochs = 2, checkpoint_dir = dir, strategy = "default",
                      batch_size = 8, verbose = 0)
      fixture <<- list(dir = dir, x = x[1:21, ], y = y[1:21])
    }
    fixture
  }
})

partial_batch_cases <- function(build, strategy) {
  single <- build()
  with(strategy$scope(), mirrored <- build())
  mirrored$set_weights(single$get_weights())
  set.seed(2)
  cases <- list()
  for (case in list(c(13, 4), c(13, 5), c(3, 4), c(1, 2))) {
    rows <- case[[1]]
    x <- matrix(rnorm(rows * 4), ncol = 4)
    y <- sample(0:2, rows, replace = TRUE)
    w <- runif(rows)
    expected <- evaluate(single, x, y, sample_weight = w, batch_size = case[[2]], verbose = 0)
    got <- distributed_evaluate(mirrored, x, y, sample_weight = w, batch_size = case[[2]])
    predicted <- distributed_predict(mirrored, x, batch_size = case[[2]])
    cases[[length(cases) + 1]] <- list(
      names = identical(sort(names(got)), sort(names(expected))),
      metrics = max(abs(unlist(got[names(expected)]) - unlist(expected))),
      dim = dim(predicted),
      predict = max(abs(predicted - predict(single, x, verbose = 0)))
    )
  }
  list(replicas = strategy$num_replicas_in_sync, cases = cases)
}

restored_evaluation <- function(strategy, dir, x, y) {
  with(strategy$scope(), mirrored <- make_or_restore_model(dir))  # no build_fn
  single <- make_or_restore_model(dir, strategy = reticulate::import("tensorflow")$distribute$get_strategy())
  got <- distributed_evaluate(mirrored, x, y, batch_size = 8)
  expected <- evaluate(single, x, y, batch_size = 8, verbose = 0)
  predicted <- distributed_predict(mirrored, x, batch_size = 5)
  list(replicas = mirrored$distribute_strategy$num_replicas_in_sync, names = sort(names(got)),
       metrics = max(abs(unlist(got[names(expected)]) - unlist(expected))), dim = dim(predicted),
       predict = max(abs(predicted - predict(single, x, verbose = 0))))
}
# callr sends these to the fresh session without the test's frames
environment(partial_batch_cases) <- globalenv()
environment(restored_evaluation) <- globalenv()

two_replica_session <- function() {
  fixture <- restored_fixture()
  two_replica_results(fixture$dir, fixture$x, fixture$y)
}

test_that("under 2 replicas evaluate and predict equal one device, partial batches included", {
  skip_if_no_kerasdist()
  result <- two_replica_session()$partial_batches
  expect_identical(as.integer(result$replicas), 2L)
  for (case in result$cases) {
    expect_true(case$names)
    expect_lt(case$metrics, 1e-6)
    expect_identical(case$dim[[2]], 3L)
    expect_lt(case$predict, 1e-6)  # row i is sample i, no padding rows
  }
  expect_identical(vapply(result$cases, function(case) case$dim[[1]], 1L), c(13L, 13L, 3L, 1L))
})

test_that("a model restored from a checkpoint in a new session evaluates under 2 replicas", {
  skip_if_no_kerasdist()
  result <- two_replica_session()$restored
  expect_identical(as.integer(result$replicas), 2L)
  expect_identical(result$names, c("accuracy", "loss"))
  expect_lt(result$metrics, 1e-6)
  expect_identical(result$dim, c(21L, 3L))
  expect_lt(result$predict, 1e-6)
})
