# Input pipelines: thin wrappers over python/kerasdist/data/ (the names its __init__ exports).

# r-docs: python/kerasdist/data/api.py:make_dataset (make r-docs)
#' Build a dataset of batches for distributed fit
#'
#' From R: matrices, arrays, data frames, lists of them (multi-input models), an existing
#' `tf.data.Dataset` or TFRecord/CSV files become a `tf.data.Dataset` of batches for keras3's
#' `fit()` under the active strategy.
#'
#' By default the dataset is one epoch, as tf.data users expect: `model |> fit(ds, epochs = 2)` and
#' `reticulate::iterate()` work, and each new pass over it (read to the end) is the next epoch: pass
#' k is epoch `initial_epoch + k`, the same in every process and after a restart. With `epochs` (or
#' `repeat_epochs = TRUE`) it is instead one stream of batches over epochs `initial_epoch` ..
#' `epochs - 1` (endless with `repeat_epochs`); give `fit()` the `steps_per_epoch` that
#' [dataset_info()] reports. Each epoch's order is a pure function of `(seed, epoch)`: the
#' permutation [epoch_order()] returns. A run resumed after `k` batches of epoch `e` rebuilds its
#' stream with `initial_epoch = e, skip_batches = k`: the batches are the ones the uninterrupted run
#' would have seen next.
#'
#' The first index of a matrix or array is the sample: row `i` of `x` is sample `i`, with its values
#' in R's order (`matrix(1:12, 4)` gives a first sample `c(1, 5, 9)`). Data frames must be all
#' numeric (factor and character columns are refused: encode them first); they become one float
#' matrix.
#'
#' @param x Features: a numeric matrix or array (first index = sample), a numeric vector, a data
#'   frame, an unnamed list (several inputs) or a named list (inputs by name) of those, a
#'   `tf.data.Dataset` of unbatched elements, or a file pattern (character) of TFRecord or CSV
#'   files.
#' @param y Targets with as many samples as `x`, or for a data frame `x` the name of its target
#'   column. `NULL` for none.
#' @param sample_weight Optional per-sample weights (a numeric vector).
#' @param batch_size Global batch size (all replicas together).
#' @param per_replica_batch_size Batch size of one replica; the global size is this times the
#'   strategy's replicas. Give one of the two; neither means 32.
#' @param strategy The strategy fit will run under; `NULL`: the one whose scope is active.
#' @param drop_remainder Drop each epoch's last, smaller batch.
#' @param shuffle Permute each epoch; the order is a pure function of (seed, epoch).
#' @param seed The shuffle seed (an integer).
#' @param initial_epoch The epoch of the first pass (0-based, like Keras's `initial_epoch`), or the
#'   first epoch of the stream.
#' @param skip_batches Batches of `initial_epoch` already consumed (a mid-epoch resume); needs the
#'   stream form (`epochs` or `repeat_epochs`), since a one-epoch dataset's passes all have the same
#'   length.
#' @param epochs `NULL` (default): the dataset is one epoch, the next one on each new pass. An
#'   integer: one stream of the epochs `initial_epoch` .. `epochs - 1` (exclusive, like Keras's
#'   `epochs`).
#' @param repeat_epochs `TRUE` for one endless stream of epochs (Python's `repeat=True`; `repeat` is
#'   a reserved word in R).
#' @param per_worker Build one pipeline per worker with
#'   `strategy$distribute_datasets_from_function()`, each reading only its share; returns a
#'   distributed dataset. Otherwise the dataset carries the auto-shard policy of its source: DATA
#'   for in-memory data, FILE for files when there are at least as many files as workers, DATA
#'   otherwise.
#' @param cache `TRUE` or "memory" to cache in memory, or a file path prefix; caches the source
#'   records (files, an existing dataset) before shuffling. In-memory arrays are already in memory,
#'   so it changes nothing for them.
#' @param map_fn A per-element transform, run in parallel after shuffling. It must be a Python
#'   function (for example from [reticulate::py_run_string()]): TensorFlow calls it from its own
#'   threads, where R code cannot run.
#' @param check_finite Refuse NaN or Inf in the features (checked up front for in-memory data, while
#'   reading for files).
#' @param file_format "tfrecord" or "csv"; default from the file extension.
#' @param label_column For CSV/TFRecord files: the column (feature) that is y.
#' @param features For TFRecord files of `tf.train.Example`: a named list of float feature shapes,
#'   e.g. `list(x = 3L, y = integer(0))`. The non-label features, concatenated, are `x`.
#' @param shuffle_buffer Block size of the stream-source shuffle with `cache`.
#' @returns A `tf.data.Dataset` (Python object), or a distributed dataset with `per_worker = TRUE`;
#'   [dataset_info()] tells what was decided. For a validation split see [make_dataset_split()].
#' @family data
#' @seealso Python: `kerasdist.make_dataset()`.
#' @examples
#' \dontrun{
#' x <- matrix(runif(1000 * 3), ncol = 3)
#' y <- rowSums(x)
#' strategy <- select_strategy()
#' ds <- make_dataset(x, y, per_replica_batch_size = 32, strategy = strategy, seed = 1)
#' model |> fit(ds, epochs = 5)   # one epoch per pass, reshuffled each pass
#' # one stream, resumed after 7 batches of epoch 3 (0-based):
#' ds <- make_dataset(x, y, per_replica_batch_size = 32, strategy = strategy, seed = 1,
#'                    initial_epoch = 3, skip_batches = 7, epochs = 5)
#' }
#' @export
make_dataset <- function(x, y = NULL, sample_weight = NULL, batch_size = NULL,
                         per_replica_batch_size = NULL, strategy = NULL,
                         drop_remainder = FALSE, shuffle = TRUE, seed = 0L,
                         initial_epoch = 0L, skip_batches = 0L, epochs = NULL,
                         repeat_epochs = FALSE, per_worker = FALSE, cache = NULL,
                         map_fn = NULL, check_finite = FALSE, file_format = NULL,
                         label_column = NULL, features = NULL, shuffle_buffer = 10000L) {
  call_python_forwarding(kerasdist_module()$make_dataset, DATASET_RENAMED)
}

# make_dataset()'s R name for the Python argument `repeat`, a reserved word in R.
DATASET_RENAMED <- c(repeat_epochs = "repeat")

# r-docs: python/kerasdist/data/api.py:make_dataset_split (make r-docs)
#' Make a training dataset and a validation dataset from one set of samples
#'
#' [make_dataset()] for all but the last `validation_split` of the rows (as keras3's
#' `fit(validation_split = )` holds out the last ones), and one unshuffled, finite pass over those
#' rows.
#'
#' @inheritParams make_dataset
#' @param x In-memory data: R matrices and arrays, data frames, lists of them.
#' @param y Targets, as `x` (for a data frame `x`, a column name), or `NULL` when `x` holds them.
#' @param validation_split Fraction in (0, 1) of the samples kept out for validation.
#' @returns A list: `train`, the training dataset (as [make_dataset()] makes it from the other
#'   arguments), and `validation`, the held-out rows batched like it; [dataset_info()] of each tells
#'   its sizes (`validation_samples` on the training one).
#' @family data
#' @seealso Python: `kerasdist.make_dataset_split()`.
#' @examples
#' \dontrun{
#' parts <- make_dataset_split(x, y, validation_split = 0.2, batch_size = 64)
#' model |> fit(parts$train, validation_data = parts$validation, epochs = 5)
#' }
#' @export
make_dataset_split <- function(x, y = NULL, validation_split, sample_weight = NULL, batch_size = NULL,
                               per_replica_batch_size = NULL, strategy = NULL,
                               drop_remainder = FALSE, shuffle = TRUE, seed = 0L,
                               initial_epoch = 0L, skip_batches = 0L, epochs = NULL,
                               repeat_epochs = FALSE, per_worker = FALSE, cache = NULL,
                               map_fn = NULL, check_finite = FALSE, file_format = NULL,
                               label_column = NULL, features = NULL, shuffle_buffer = 10000L) {
  parts <- call_python_forwarding(kerasdist_module()$make_dataset_split, DATASET_RENAMED)
  list(train = parts$train, validation = parts$validation)
}

# r-docs: python/kerasdist/data/api.py:plan_dataset (make r-docs)
#' Plan a dataset without building it
#'
#' Checks the same arguments as [make_dataset()], reads the source once and returns what
#' [dataset_info()] would say of the dataset (sizes, steps per epoch, shard policy, form), without
#' building any pipeline.
#'
#' @inheritParams make_dataset
#' @param validation_split Fraction in (0, 1) of the samples (the last ones, as Keras's `fit` holds
#'   out) kept out of training ([make_dataset_split()]); in-memory data only.
#' @returns A list of class `kerasdist_dataset_info`, as [dataset_info()] gives.
#' @family data
#' @seealso Python: `kerasdist.plan_dataset()`.
#' @examplesIf !is.null(kerasdist_python())
#' plan_dataset(matrix(runif(300), ncol = 3), batch_size = 16)$steps_per_epoch
#' @export
plan_dataset <- function(x, y = NULL, sample_weight = NULL, batch_size = NULL,
                         per_replica_batch_size = NULL, strategy = NULL,
                         drop_remainder = FALSE, shuffle = TRUE, seed = 0L,
                         initial_epoch = 0L, skip_batches = 0L, epochs = NULL,
                         repeat_epochs = FALSE, per_worker = FALSE, cache = NULL,
                         map_fn = NULL, check_finite = FALSE, file_format = NULL,
                         label_column = NULL, features = NULL, shuffle_buffer = 10000L,
                         validation_split = NULL) {
  info <- call_python_forwarding(kerasdist_module()$plan_dataset, DATASET_RENAMED)
  structure(py_record_to_r(info), class = "kerasdist_dataset_info")
}

# r-docs: python/kerasdist/data/info.py:dataset_info (make r-docs)
#' What make_dataset decided for a dataset
#'
#' The plan travels on the dataset object itself; a dataset derived from it (`ds$take(3L)`) is a new
#' dataset without one. [plan_dataset()] gives the same without building a pipeline.
#'
#' @param dataset A dataset returned by [make_dataset()].
#' @returns A list of class `kerasdist_dataset_info`: the source kind, the number of samples, the
#'   global and per-replica batch sizes and which of them was given (`sizing`), the steps per epoch
#'   to give `fit()`, the auto-shard policy (or `"per_worker"`) and the order settings.
#' @family data
#' @seealso Python: `kerasdist.dataset_info()`.
#' @examplesIf !is.null(kerasdist_python())
#' ds <- make_dataset(matrix(runif(300), ncol = 3), batch_size = 16)
#' dataset_info(ds)$steps_per_epoch
#' @export
dataset_info <- function(dataset) {
  info <- call_python(kerasdist_module()$dataset_info, dataset)
  structure(py_record_to_r(info), class = "kerasdist_dataset_info")
}

# r-docs: python/kerasdist/data/info.py:batch_size_info (make r-docs)
#' Work out the global and per-replica batch sizes, without building anything
#'
#' @param batch_size The global batch size (all replicas together).
#' @param per_replica_batch_size The batch size of one replica; the global size is this times the
#'   strategy's `num_replicas_in_sync`. Give one of the two; neither means 32.
#' @param strategy The strategy to size for; default the one whose scope is active.
#' @param num_replicas The replica count, instead of asking a strategy.
#' @param num_samples When given, `steps_per_epoch` is computed and the sizes are checked against
#'   it.
#' @param drop_remainder Whether a last, smaller batch is dropped.
#' @param require_even_split The global size must split evenly over the replicas (per-worker
#'   pipelines need that).
#' @returns A list of class `kerasdist_batch_size_info`: `batch_size`, `per_replica_batch_size`
#'   (`NULL` when it does not split evenly), `num_replicas`, `sizing` (`"batch_size"`,
#'   `"per_replica_batch_size"` or `"default"`), `num_samples`, `steps_per_epoch`, `drop_remainder`.
#' @family data
#' @seealso Python: `kerasdist.batch_size_info()`.
#' @examplesIf !is.null(kerasdist_python())
#' batch_size_info(per_replica_batch_size = 16, num_replicas = 2)
#' @export
batch_size_info <- function(batch_size = NULL, per_replica_batch_size = NULL, strategy = NULL,
                            num_replicas = NULL, num_samples = NULL, drop_remainder = FALSE,
                            require_even_split = FALSE) {
  info <- call_python(
    kerasdist_module()$batch_size_info, batch_size = batch_size, per_replica_batch_size = per_replica_batch_size,
    strategy = strategy, num_replicas = num_replicas,
    num_samples = num_samples, drop_remainder = drop_remainder,
    require_even_split = require_even_split
  )
  structure(py_record_to_r(info), class = "kerasdist_batch_size_info")
}

# r-docs: python/kerasdist/data/order.py:epoch_order (make r-docs)
#' The sample order of one epoch
#'
#' The permutation [make_dataset()] uses for epoch `epoch` with `seed`: a pure function of
#' `(n, seed, epoch)`, the same in R, in Python, on every worker and after a restart (TensorFlow's
#' `stateless_shuffle`, the op [make_dataset()] runs; a TensorFlow release may change it). Unlike
#' Python's `kerasdist.epoch_order()`, which gives 0-based indices, this returns R's 1-based ones:
#' `x[epoch_order(nrow(x)), ]` is the epoch's order.
#'
#' @param n Number of samples.
#' @param seed The shuffle seed.
#' @param epoch The epoch, 0-based as in keras3.
#' @returns An integer vector, a permutation of `seq_len(n)`.
#' @family data
#' @seealso Python: `kerasdist.epoch_order()`.
#' @examplesIf !is.null(kerasdist_python())
#' epoch_order(10, seed = 1, epoch = 0)
#' @export
epoch_order <- function(n, seed = 0L, epoch = 0L) {
  order <- call_python(kerasdist_module()$epoch_order, n = n, seed = seed, epoch = epoch)
  as.integer(order) + 1L
}

#' @export
print.kerasdist_dataset_info <- function(x, ...) {
  cat(sprintf(
    "source: %s, %d samples\nbatch:  %d (%s; %s per replica on %d replicas), %d steps per epoch\nshard:  %s\norder:  %s, seed %d, from epoch %d batch %d\n",
    x$source, x$num_samples, x$batch_size, x$sizing,
    if (is.null(x$per_replica_batch_size)) "uneven" else x$per_replica_batch_size,
    x$num_replicas, x$steps_per_epoch, x$shard_policy,
    if (isTRUE(x$shuffle)) "shuffled" else "in order", x$seed, x$initial_epoch, x$skip_batches
  ))
  invisible(x)
}

# r-docs: python/kerasdist/data/resumable.py:resume_rule (make r-docs)
#' What a resumed run does with your data
#'
#' From R: for a `tf.data.Dataset` built with tfdatasets
#' (`tensor_slices_dataset() |> dataset_shuffle() |> dataset_batch()`), keras3's
#' `image_dataset_from_directory()` and `text_dataset_from_directory()`, or a [make_dataset()]
#' dataset. kerasdist's trainers ([distributed_fit()], [resume_fit()], keras3's `fit()` with a
#' [checkpoint_callback()], [custom_fit()]) read such data one batch per step and keep the reader's
#' position in each checkpoint; data they cannot continue exactly is named by one warning at the
#' start, saying what a resume will do.
#'
#' @param data A batched `tf.data.Dataset` (tfdatasets), a Python `keras.utils.PyDataset` or
#'   generator, or a [make_dataset()] dataset.
#' @returns One sentence, a string.
#' @family data
#' @seealso Python: `kerasdist.resume_rule()`; [distributed_fit()] and [resume_fit()], which read
#'   such data.
#' @examplesIf !is.null(kerasdist_python()) && requireNamespace("tfdatasets", quietly = TRUE)
#' library(tfdatasets)
#' data <- tensor_slices_dataset(list(matrix(runif(40), ncol = 4), 1:10)) |>
#'   dataset_shuffle(10, seed = 1) |>
#'   dataset_batch(5)
#' resume_rule(data)
#' @export
resume_rule <- function(data) {
  call_python(kerasdist_module()$resume_rule, data = data)
}
