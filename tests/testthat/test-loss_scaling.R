# scaled_loss from R (R/loss_scaling.R over python/kerasdist/loss_scaling.py).

test_that("scaled_loss divides by the global batch and refuses a reduced loss", {
  skip_if_no_kerasdist()
  tf <- reticulate::import("tensorflow")
  expect_equal(as.numeric(scaled_loss(tf$constant(c(1, 2, 3, 6)))$numpy()), 3)
  expect_equal(as.numeric(scaled_loss(c(1, 2, 3, 6), global_batch_size = 8)$numpy()), 1.5)
  # a matrix: the non-batch axis is averaged per example
  expect_equal(as.numeric(scaled_loss(matrix(c(1, 2, 3, 5), 2, byrow = TRUE))$numpy()), 2.75)
  expect_equal(as.numeric(scaled_loss(c(1, 2), sample_weight = c(1, 0))$numpy()), 0.5)
  err <- expect_error(scaled_loss(tf$constant(1)), class = "kerasdist_ValueError")
  expect_match(conditionMessage(err), "per_example_loss is a scalar: it is already reduced", fixed = TRUE)
})
