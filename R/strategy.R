# Strategy selection: thin wrappers over python/kerasdist/strategy.py.

#' Choose and create a tf.distribute strategy
#'
#' Picks the right `tf.distribute` strategy from the hardware and the cluster
#' signals, and remembers why. `"auto"` checks, in order: a reachable TPU ->
#' `"tpu"`; a cluster (TF_CONFIG) with ps tasks -> `"parameter_server"`; a
#' cluster with more than one worker (TF_CONFIG, or Slurm with more than one
#' task) -> `"multi_worker"`; more than one GPU -> `"mirrored"`; one GPU ->
#' `"one_device"`; the CPU split by [simulate_devices()] -> `"mirrored"`;
#' otherwise `"default"`. Printing the result describes it.
#'
#' @param kind `"auto"`, `"default"`, `"one_device"`, `"mirrored"`,
#'   `"multi_worker"`, `"parameter_server"` or `"tpu"`.
#' @param devices Character vector of devices for `"mirrored"` or
#'   `"one_device"`, e.g. `c("/gpu:0", "/gpu:1")`.
#' @param cross_device_ops For `"mirrored"`: `"nccl"`, `"hierarchical_copy"`,
#'   `"reduce_to_one_device"` or `NULL` for TensorFlow's choice.
#' @param communication For `"multi_worker"`: `"auto"`, `"ring"` or `"nccl"`.
#' @param tf_config A TF_CONFIG as JSON text or a nested list, used instead of
#'   the `TF_CONFIG` environment variable.
#' @param cluster_resolver A TensorFlow cluster resolver (Python object).
#' @param environ Named list of environment variables to read TF_CONFIG,
#'   SLURM_* and TPU_NAME from; `NULL` for the process environment.
#' @param gpus GPU names to plan for; `NULL` for the GPUs TensorFlow sees.
#' @param tpu A TPU name or address, `FALSE` for none, `NULL` to detect.
#' @returns The strategy (a Python `tf.distribute.Strategy`); use it as
#'   `with(strategy$scope(), { ... })`.
#' @family strategy
#' @seealso Python: `kerasdist.select_strategy()`.
#' @examplesIf !is.null(kerasdist_python())
#' library(keras3)
#' strategy <- select_strategy()
#' strategy                      # the kind, why, replicas, devices, workers, chief
#' with(strategy$scope(), {
#'   model <- keras_model_sequential(input_shape = 4) |>
#'     layer_dense(1) |>
#'     compile(optimizer = "adam", loss = "mse")
#' })
#' @export
select_strategy <- function(kind = "auto", devices = NULL, cross_device_ops = NULL,
                            communication = "auto", tf_config = NULL,
                            cluster_resolver = NULL, environ = NULL, gpus = NULL,
                            tpu = NULL) {
  strategy <- call_python(
    kerasdist_module()$select_strategy, kind,
    devices = devices, cross_device_ops = cross_device_ops,
    communication = communication, tf_config = tf_config,
    cluster_resolver = cluster_resolver, environ = environ,
    gpus = gpus, tpu = tpu
  )
  class(strategy) <- c("kerasdist_strategy", class(strategy))
  strategy
}

#' Decide a strategy without creating it
#'
#' Applies the same rules as [select_strategy()] and returns the decision, so
#' the choice can be checked for hardware or clusters this machine lacks. It
#' takes the arguments that decide the kind and the devices;
#' `cross_device_ops` and `communication`, which only shape a strategy once it
#' is made, are [select_strategy()]'s alone.
#'
#' @inheritParams select_strategy
#' @returns A list of class `kerasdist_strategy_plan`: `kind`, `reason`,
#'   `devices`, `tpu` and `cluster` (see [parse_tf_config()]).
#' @family strategy
#' @seealso Python: `kerasdist.plan_strategy()`.
#' @examplesIf !is.null(kerasdist_python())
#' plan_strategy(gpus = c("/gpu:0", "/gpu:1"))   # what two GPUs would give
#' @export
plan_strategy <- function(kind = "auto", devices = NULL, tf_config = NULL,
                          cluster_resolver = NULL, environ = NULL, gpus = NULL,
                          tpu = NULL) {
  plan <- call_python(
    kerasdist_module()$plan_strategy, kind,
    devices = devices, tf_config = tf_config,
    cluster_resolver = cluster_resolver, environ = environ,
    gpus = gpus, tpu = tpu
  )
  structure(
    list(
      kind = plan$kind, reason = plan$reason, devices = as.character(unlist(plan$devices)),
      tpu = plan$tpu, cluster = py_record_to_r(plan$cluster, "is_chief")
    ),
    text = reticulate::py_str(plan),
    class = "kerasdist_strategy_plan"
  )
}

#' Describe a strategy
#'
#' Tells the kind, the signal that chose it, the number of replicas, the
#' devices, the workers and whether this process is the chief.
#'
#' @param strategy A strategy from [select_strategy()] or any
#'   `tf.distribute.Strategy`; `NULL` for the one whose scope is active.
#' @returns A list of class `kerasdist_strategy_description`.
#' @family strategy
#' @seealso Python: `kerasdist.describe_strategy()`.
#' @examplesIf !is.null(kerasdist_python())
#' describe_strategy(select_strategy())
#' @export
describe_strategy <- function(strategy = NULL) {
  description <- call_python(kerasdist_module()$describe_strategy, strategy)
  structure(
    py_record_to_r(description),
    text = reticulate::py_str(description),
    class = "kerasdist_strategy_description"
  )
}

#' Split the CPU into logical devices
#'
#' Lets mirrored code run on one CPU: after `simulate_devices(2)`,
#' `select_strategy()` returns a MirroredStrategy with two replicas. It must run
#' before TensorFlow initializes its devices: before any model, op or strategy
#' (with keras3 loaded, before the first keras3 model or op; loading keras3 is
#' fine).
#'
#' @param n Number of logical CPU devices (at least 1).
#' @returns The device names, invisibly.
#' @family strategy
#' @seealso Python: `kerasdist.simulate_devices()`.
#' @examples
#' \dontrun{
#' simulate_devices(2)
#' }
#' @export
simulate_devices <- function(n) {
  n <- as_py(n, "count")
  split_cpu_at_import(n)
  names <- call_python(kerasdist_module()$simulate_devices, n)
  invisible(as.character(unlist(names)))
}

# keras3's load hook starts TensorFlow's devices right after Python's keras is imported, so the
# split must happen inside kerasdist's own import (see python/kerasdist/startup.py): before it,
# Python is told `n` here; once kerasdist is imported this does nothing.
split_cpu_at_import <- function(n) {
  if (is.null(.kerasdist$module) && is_count(n) && !keras_imported()) {
    activate_python()
    python_environ()$update(list(KERASDIST_SIMULATE_DEVICES = as.character(n)))
  }
  invisible()
}

#' @export
print.kerasdist_strategy <- function(x, ...) {
  print(describe_strategy(x))
  invisible(x)
}

#' @export
format.kerasdist_strategy_description <- function(x, ...) attr(x, "text")

#' @export
print.kerasdist_strategy_description <- function(x, ...) {
  cat(format(x), sep = "\n")
  invisible(x)
}

#' @export
format.kerasdist_strategy_plan <- function(x, ...) attr(x, "text")

#' @export
print.kerasdist_strategy_plan <- function(x, ...) {
  cat(format(x), sep = "\n")
  invisible(x)
}
