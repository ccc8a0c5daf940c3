# make_dataset from R: the shared rows of tests/cases/data.json, then what only R has (matrix and
# array order, data frames, factors, R functions as map_fn) and 2 simulated devices.

# A data spec of tests/cases/data.json as R data (see its "about").
build_data <- function(spec) {
  if (!is.list(spec)) return(spec)
  if (!is.null(spec$frame)) {
    return(as.data.frame(lapply(spec$frame, unlist), stringsAsFactors = TRUE))
  }
  shape <- unlist(spec$seq)
  values <- seq_len(prod(shape)) - 1
  data <- if (length(shape) == 1) values else matrix(values, shape[[1]], shape[[2]], byrow = TRUE)
  if (!is.null(spec$nan_at)) data[spec$nan_at[[1]] + 1, spec$nan_at[[2]] + 1] <- NaN
  data
}

batches_of <- function(dataset) {
  it <- reticulate::as_iterator(dataset)
  out <- list()
  while (!is.null(batch <- reticulate::iter_next(it))) out[[length(out) + 1]] <- batch
  out
}

labels_of <- function(dataset) {
  unlist(lapply(batches_of(dataset), function(b) as.numeric(b[[2]]$numpy())))
}

for (row in case_rows("data")) {
  local({
    row <- row
    test_that(paste("case:", row$id), {
      skip_if_no_kerasdist()
      fun <- getExportedValue("kerasdist", row[["function"]])
      args <- row$args
      if (!is.null(row$r_expect)) {  # a whole double: R converts it at the boundary, Python refuses 8.0
        row$expect <- row$r_expect
        row$error <- NULL
      }
      for (name in intersect(names(args), c("x", "y", "sample_weight"))) {
        args[[name]] <- build_data(args[[name]])
      }
      if (!is.null(row$error)) {
        err <- expect_error(do.call(fun, args), class = "kerasdist_error")
        expect_true(grepl(row$error, conditionMessage(err), fixed = TRUE), label = conditionMessage(err))
        expect_false(grepl("Traceback|File \"", conditionMessage(err)))
        return()
      }
      result <- do.call(fun, args)
      if (row[["function"]] == "epoch_order") {
        expect_identical(result - 1L, as.integer(unlist(row$expect$order)))
        return()
      }
      dataset <- if (row[["function"]] == "batch_size_info") NULL else if (row[["function"]] == "make_dataset_split") result$train else result
      info <- if (is.null(dataset)) result else dataset_info(dataset)
      batches <- if (is.null(dataset)) list() else batches_of(dataset)
      for (name in names(row$expect)) {
        expected <- row$expect[[name]]
        if (name == "batch_rows") {
          expect_identical(vapply(batches, function(b) NROW(b[[1]]$numpy()), 1L), as.integer(unlist(expected)))
        } else if (name == "first_batch_y") {
          expect_equal(as.numeric(batches[[1]][[2]]$numpy()), as.numeric(unlist(expected)))
        } else if (is.null(expected)) {
          expect_null(info[[name]])
        } else {
          expect_equal(info[[name]], expected, label = name)
        }
      }
    })
  })
}

test_that("matrix rows stay samples, in R's order", {
  skip_if_no_kerasdist()
  ds <- make_dataset(matrix(1:12, 4), y = c(10, 20, 30, 40), batch_size = 4, shuffle = FALSE, epochs = 1)
  batch <- batches_of(ds)[[1]]
  expect_identical(batch[[1]]$numpy()[1, ], c(1L, 5L, 9L))
  expect_identical(batch[[1]]$numpy(), matrix(1:12, 4))
  expect_identical(as.numeric(batch[[2]]$numpy()), c(10, 20, 30, 40))
})

test_that("a 3-d array keeps its first index as the sample", {
  skip_if_no_kerasdist()
  a <- array(as.numeric(1:24), c(4, 3, 2))
  batch <- batches_of(make_dataset(a, batch_size = 4, shuffle = FALSE, epochs = 1))[[1]]
  expect_equal(batch[[1]]$numpy()[2, , ], a[2, , ])
  expect_identical(unlist(batch[[1]]$shape$as_list()), c(4L, 3L, 2L))
})

test_that("shuffled rows keep their features together and follow epoch_order", {
  skip_if_no_kerasdist()
  x <- cbind(id = 1:10, twice = (1:10) * 2)
  ds <- make_dataset(x, y = 1:10, batch_size = 5, seed = 4, epochs = 1)
  features <- do.call(rbind, lapply(batches_of(ds), function(b) b[[1]]$numpy()))
  expect_identical(features[, 2], features[, 1] * 2L)
  expect_identical(as.integer(features[, 1]), epoch_order(10, seed = 4, epoch = 0))
  expect_false(identical(epoch_order(10, 4, 0), epoch_order(10, 4, 1)))
})

test_that("named and unnamed lists are multi-input models", {
  skip_if_no_kerasdist()
  batch <- batches_of(make_dataset(list(a = matrix(0, 6, 2), b = matrix(1, 6, 3)), y = 1:6,
                                   batch_size = 6, epochs = 1))[[1]]
  expect_setequal(names(batch[[1]]), c("a", "b"))
  expect_identical(dim(batch[[1]]$b$numpy()), c(6L, 3L))
  batch <- batches_of(make_dataset(list(matrix(0, 6, 2), matrix(1, 6, 3)), batch_size = 6, epochs = 1))[[1]]
  expect_length(batch[[1]], 2)
})

test_that("a factor or character column is refused, naming it", {
  skip_if_no_kerasdist()
  df <- data.frame(a = 1:3, kind = c("u", "v", "u"), stringsAsFactors = FALSE)
  expect_error(make_dataset(df), "non-numeric columns: kind", class = "kerasdist_ValueError")
  df$kind <- factor(df$kind)
  expect_error(make_dataset(df), "non-numeric columns: kind", class = "kerasdist_error")
})

test_that("validation split never overlaps the training part", {
  skip_if_no_kerasdist()
  parts <- make_dataset_split(matrix(0, 20, 2), y = 1:20, batch_size = 3, seed = 2, validation_split = 0.25, epochs = 3)
  expect_named(parts, c("train", "validation"))
  seen <- labels_of(parts$train)
  held <- labels_of(parts$validation)
  expect_identical(held, as.numeric(16:20))
  expect_setequal(seen, 1:15)
  expect_length(intersect(seen, held), 0)
  expect_identical(dataset_info(parts$validation)$role, "validation")
  expect_error(make_dataset(matrix(0, 20, 2), validation_split = 0.25), "unused argument")
})

test_that("resuming gives the tail of the uninterrupted stream", {
  skip_if_no_kerasdist()
  x <- matrix(0, 10, 1)
  full <- labels_of(make_dataset(x, y = 1:10, batch_size = 4, seed = 5, epochs = 3))
  resumed <- labels_of(make_dataset(x, y = 1:10, batch_size = 4, seed = 5, epochs = 3,
                                    initial_epoch = 1, skip_batches = 2))
  expect_identical(resumed, full[-seq_len(10 + 2 * 4)])
})

test_that("an R function as map_fn is refused, a Python one runs", {
  skip_if_no_kerasdist()
  expect_error(make_dataset(matrix(0, 4, 1), map_fn = function(x) x), "must be a Python function",
               class = "kerasdist_error")
  py <- reticulate::py_run_string("def double(x, y):\n    return x * 2, y", convert = FALSE)
  batch <- batches_of(make_dataset(matrix(1:4, 4), y = 1:4, map_fn = py$double, shuffle = FALSE,
                                   batch_size = 4, epochs = 1))[[1]]
  expect_identical(as.integer(batch[[1]]$numpy()), c(2L, 4L, 6L, 8L))
})

test_that("R integers give the batches doubles give, in every in-memory form", {
  skip_if_no_kerasdist()
  # R integers arrive as int32, which kerasdist's pipeline functions treat apart (compat.map_on_cpu)
  values_of <- function(x, y, batch_size = 4, ...) {
    lapply(batches_of(make_dataset(x, y = y, batch_size = batch_size, seed = 3, ...)),
           function(b) list(as.numeric(b[[1]]$numpy()), as.numeric(b[[2]]$numpy())))
  }
  py <- reticulate::py_run_string("def double(x, y):\n    return x * 2, y", convert = FALSE)
  forms <- list(list(), list(epochs = 2), list(batch_size = 3), list(map_fn = py$double, epochs = 1))
  for (form in forms) {
    ints <- do.call(values_of, c(list(matrix(1:20, 10), 1:10), form))
    doubles <- do.call(values_of, c(list(matrix(as.numeric(1:20), 10), as.numeric(1:10)), form))
    expect_identical(ints, doubles, label = paste(names(form), collapse = ","))
  }
})

test_that("CSV files from R, with the label column", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  for (f in 0:1) {
    write.csv(data.frame(a = f * 4 + 0:3, label = f * 4 + 0:3), file.path(dir, sprintf("p%d.csv", f)),
              row.names = FALSE)
  }
  ds <- make_dataset(file.path(dir, "*.csv"), label_column = "label", batch_size = 4, seed = 1, epochs = 2)
  info <- dataset_info(ds)
  expect_identical(c(info$source, info$shard_policy), c("files", "FILE"))
  expect_identical(info$num_samples, 8L)
  seen <- labels_of(ds)
  expect_setequal(seen[1:8], 0:7)
  expect_error(make_dataset(file.path(dir, "*.tfrecord")), "matches no file", class = "kerasdist_error")
})

test_that("2 simulated devices: global and per-replica sizing, and fit", {
  skip_if_no_kerasdist()
  result <- in_two_device_r(function() {
    library(keras3)
    library(kerasdist)
    simulate_devices(2)
    strategy <- select_strategy()
    x <- matrix(as.numeric(1:24), 12)
    short <- NULL  # 3 batches an epoch under 2 replicas: make_dataset warns, as in Python
    g <- withCallingHandlers(
      dataset_info(make_dataset(x, y = 1:12, batch_size = 4, strategy = strategy)),
      kerasdist_warning = function(w) {
        short <<- conditionMessage(w)
        invokeRestart("muffleWarning")
      }
    )
    p <- dataset_info(make_dataset(x, y = 1:12, per_replica_batch_size = 4, strategy = strategy))
    uneven <- tryCatch(make_dataset(x, batch_size = 5, strategy = strategy, per_worker = TRUE),
                       kerasdist_error = function(e) conditionMessage(e))
    with(strategy$scope(), {
      model <- keras_model_sequential(input_shape = 2) |> layer_dense(1) |> compile(optimizer = "sgd", loss = "mse")
    })
    ds <- make_dataset(x, y = 1:12, per_replica_batch_size = 2, strategy = strategy, per_worker = TRUE,
                       repeat_epochs = TRUE)
    fit(model, ds, epochs = 2, steps_per_epoch = 3, verbose = 0)
    list(g = g[c("batch_size", "per_replica_batch_size", "num_replicas", "sizing")],
         p = p[c("batch_size", "per_replica_batch_size", "num_replicas", "sizing")],
         uneven = uneven, short = short, steps = as.integer(model$optimizer$iterations$numpy()))
  })
  expect_identical(result$g, list(batch_size = 4L, per_replica_batch_size = 2L, num_replicas = 2L, sizing = "batch_size"))
  expect_identical(result$p, list(batch_size = 8L, per_replica_batch_size = 4L, num_replicas = 2L,
                                  sizing = "per_replica_batch_size"))
  expect_match(result$uneven, "batch_size 5 is not divisible by the 2 replicas")
  expect_match(result$short, "epoch of 3 batches under 2 replicas")
  expect_identical(result$steps, 6L)
})

test_that("the default dataset is one epoch: keras3 fit and a for-style loop end, each pass the next epoch", {
  skip_if_no_kerasdist()
  x <- matrix(runif(1000 * 2), ncol = 2)
  ds <- make_dataset(x, y = seq_len(1000) - 1, batch_size = 100, seed = 7)
  expect_equal(dataset_info(ds)$steps_per_epoch, 10)
  expect_equal(as.integer(ds$cardinality()$numpy()), 10L)
  model <- keras3::keras_model_sequential(input_shape = 2) |> keras3::layer_dense(1)
  model |> keras3::compile(optimizer = "sgd", loss = "mse")
  model |> keras3::fit(ds, epochs = 2, verbose = 0)
  expect_equal(as.integer(model$optimizer$iterations$numpy()), 20L)
  seen <- list()
  reticulate::iterate(ds, function(batch) seen[[length(seen) + 1]] <<- as.numeric(batch[[2]]$numpy()))
  expect_length(seen, 10)
  expect_equal(unlist(seen), as.numeric(epoch_order(1000, seed = 7, epoch = 2) - 1L))  # fit read epochs 0, 1 (1-based order)
  expect_equal(labels_of(ds), as.numeric(epoch_order(1000, seed = 7, epoch = 3) - 1L))
  again <- make_dataset(x, y = seq_len(1000) - 1, batch_size = 100, seed = 7, initial_epoch = 3)
  expect_equal(labels_of(again), labels_of(make_dataset(x, y = seq_len(1000) - 1, batch_size = 100,
                                                        seed = 7, initial_epoch = 3)))
  endless <- make_dataset(x, y = seq_len(1000) - 1, batch_size = 100, seed = 7, repeat_epochs = TRUE)
  expect_true(as.integer(endless$cardinality()$numpy()) < 0)
})

test_that("plan_dataset() says what make_dataset() would, building nothing", {
  skip_if_no_kerasdist()
  x <- matrix(runif(300), ncol = 3)
  plan <- plan_dataset(x, batch_size = 16, strategy = select_strategy("default"))
  expect_s3_class(plan, "kerasdist_dataset_info")
  expect_identical(plan$steps_per_epoch, 7L)
  held_out <- plan_dataset(x, batch_size = 16, validation_split = 0.2)  # the training part
  expect_identical(c(held_out$validation_samples, held_out$num_samples, held_out$steps_per_epoch), c(20L, 80L, 5L))
  expect_identical(unclass(plan), unclass(dataset_info(make_dataset(x, batch_size = 16, strategy = select_strategy("default")))))
  expect_error(plan_dataset(x, batch_size = 0), "batch_size must be an integer >= 1", class = "kerasdist_error")
  expect_error(plan_dataset(x, batch_sise = 16), "unused argument \\(batch_sise = 16\\)")
  expect_identical(names(formals(plan_dataset)), c(names(formals(make_dataset)), "validation_split"))
})
