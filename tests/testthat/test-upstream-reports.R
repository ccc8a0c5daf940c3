# The R twins of the museum of upstream reports (tests/python/test_upstream_reports.py holds the
# canaries, which run the same code as Keras is released): what a keras3 user meets, trained with
# library(kerasdist) as one device trains it.

# One fresh R process with 3 simulated CPU devices (each R process starting TensorFlow costs about
# 12 s of CPU) for both tests' one-process runs, made once: scripts/upstream_reports.R alone (its
# MultiWorkerMirroredStrategy has one worker, one replica: the 2 workers' reference), then a batch
# of 64 over 3 mirrored replicas next to one device.
one_process_runs <- local({
  runs <- NULL
  function() {
    if (is.null(runs)) runs <<- in_fresh_r(function(script, out_dir, three_replicas_and_one) {
      library(kerasdist)
      simulate_devices(3L)
      alone <- new.env()
      alone$commandArgs <- function(trailingOnly = FALSE) out_dir  # the script's one argument
      source(script, local = alone)
      list(alone = list(replicas = alone$strategy$num_replicas_in_sync,
                        losses = as.numeric(readLines(file.path(out_dir, "losses-single.txt")))),
           three_replicas = three_replicas_and_one())
    }, script = normalizePath(test_path("scripts", "upstream_reports.R")),
    out_dir = withr::local_tempdir(.local_envir = testthat::teardown_env()),
    three_replicas_and_one = in_global_env(three_replicas_and_one))
    runs
  }
})

# A function to send to another R process: without this file's environment around it.
in_global_env <- function(fun) {
  environment(fun) <- globalenv()
  fun
}

# In a process with 3 CPU devices: keras3's fit() of one model on one device and on 3 mirrored
# replicas, and distributed_fit() on the 3, a batch of 64 over 200 rows.
three_replicas_and_one <- function() {
  library(keras3)
  build <- function() {
    set_random_seed(1)
    keras_model_sequential(input_shape = 4) |>
      layer_dense(8, activation = "relu") |>
      layer_dense(1) |>
      compile(optimizer = optimizer_sgd(0.01, momentum = 0.9), loss = "mse")
  }
  set.seed(2)
  x <- matrix(rnorm(200 * 4), ncol = 4)  # batches of 64: 22 + 22 + 20 rows, the last 3 + 3 + 2
  y <- x %*% c(1, -2, 0.5, 3)
  strategy <- tensorflow::tf$distribute$MirroredStrategy(list("/cpu:0", "/cpu:1", "/cpu:2"))
  single <- build()
  with(strategy$scope(), mirrored <- build())
  one <- single |> fit(x, y, batch_size = 64, epochs = 2, shuffle = FALSE, verbose = 0)
  three <- mirrored |> fit(x, y, batch_size = 64, epochs = 2, shuffle = FALSE, verbose = 0)
  gap <- max(mapply(function(a, b) max(abs(a - b)), single$get_weights(), mirrored$get_weights()))
  dist <- distributed_fit(build, x, y, epochs = 2, batch_size = 64, shuffle = FALSE, strategy = strategy,
                          checkpoint_dir = file.path(tempdir(), "uneven"), verbose = 0)
  list(replicas = strategy$num_replicas_in_sync, one = one$metrics$loss, three = three$metrics$loss,
       gap = gap, dist = dist$metrics$loss)
}

test_that("the multi-worker tutorial and dict inputs train under 2 workers with keras3's fit(), as one process", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  launch_r_script("upstream_reports.R", dir)
  losses <- lapply(c("0", "1"), function(i) as.numeric(readLines(file.path(dir, sprintf("losses-%s.txt", i)))))
  alone <- one_process_runs()$alone
  expect_identical(as.integer(alone$replicas), 1L)
  expect_length(losses[[1]], 4)  # 2 epochs of the tutorial, 2 of dict inputs
  expect_identical(losses[[1]], losses[[2]])  # one synchronous model
  expect_equal(losses[[1]], alone$losses, tolerance = 1e-5)
})

test_that("a batch of 64 over 3 mirrored replicas trains with keras3's fit() and distributed_fit() as one device", {
  skip_if_no_kerasdist()
  result <- one_process_runs()$three_replicas
  expect_identical(as.integer(result$replicas), 3L)
  expect_equal(result$three, result$one, tolerance = 1e-5)
  expect_lt(result$gap, 1e-5)
  expect_equal(result$dist, result$one, tolerance = 1e-5)
})
