# Parameter-server training from R: the wrappers reach Python and refuse bad input as R
# conditions. The real 4-process cluster runs in tests/python/test_ps.py.

test_that("ps_fit refuses a model not built under a parameter-server strategy", {
  skip_if_no_kerasdist()
  tf <- reticulate::import("tensorflow")
  model <- keras_model_sequential(input_shape = 2) |> layer_dense(1) |> compile(optimizer = "sgd", loss = "mse")
  data <- tf$data$Dataset$from_tensor_slices(reticulate::tuple(
    reticulate::np_array(matrix(0, 4, 2), dtype = "float32"), reticulate::np_array(matrix(0, 4, 1), dtype = "float32")
  ))$batch(2L)
  expect_error(ps_fit(model, data, epochs = 1, steps_per_epoch = 2), "not under a parameter-server strategy",
               class = "kerasdist_ValueError")
  expect_error(ps_fit("model", data, epochs = 1, steps_per_epoch = 2), "must be a Keras model",
               class = "kerasdist_ValueError")
})

test_that("run_server returns on the chief, so the same script goes on to train", {
  skip_if_no_kerasdist()
  cluster <- list(chief = list("127.0.0.1:1"), worker = list("127.0.0.1:2"), ps = list("127.0.0.1:3"))
  expect_null(run_server(list(cluster = cluster, task = list(type = "chief", index = 0L))))
  expect_error(run_server("not json"), class = "kerasdist_ValueError")
})
