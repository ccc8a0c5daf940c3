# Strategy selection: thin wrappers over python/kerasdist/strategy.py.

# r-docs: python/kerasdist/strategy.py:select_strategy (make r-docs)
#' Choose and create a tf.distribute strategy
#'
#' "auto" checks, in order: a reachable TPU -> "tpu"; a cluster with ps tasks -> "parameter_server";
#' a cluster with more than one worker (TF_CONFIG, or Slurm with more than one task) ->
#' "multi_worker"; more than one GPU -> "mirrored"; one GPU -> "one_device" on it; CPU split by
#' `simulate_devices(n)` with n > 1 -> "mirrored" over those; otherwise "default".
#' [describe_strategy()] on the result tells which signal decided.
#'
#' Printing the result describes it (see [describe_strategy()]).
#'
#' @inheritParams plan_strategy
#' @param cross_device_ops For "mirrored": "nccl", "hierarchical_copy", "reduce_to_one_device", a
#'   `tf.distribute.CrossDeviceOps` object, or `NULL` for TensorFlow's choice.
#' @param communication For "multi_worker": "auto", "ring" or "nccl".
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
  strategy <- call_with_signals(
    kerasdist_module()$select_strategy, kind, devices, tf_config, cluster_resolver, environ, gpus,
    tpu, cross_device_ops = cross_device_ops, communication = communication
  )
  class(strategy) <- c("kerasdist_strategy", class(strategy))
  strategy
}

# r-docs: python/kerasdist/strategy.py:plan_strategy (make r-docs)
#' Decide which strategy to use and why, without creating it
#'
#' It applies the rules of [select_strategy()] to the arguments that decide the kind and the
#' devices, so the choice can be checked for hardware or clusters this machine lacks;
#' `cross_device_ops` and `communication`, which only shape a strategy once it is made, are
#' [select_strategy()]'s alone.
#'
#' @param kind "auto" (decide from the signals below) or one of "default", "one_device", "mirrored",
#'   "multi_worker", "parameter_server", "tpu".
#' @param devices Character vector of devices for `"mirrored"` or `"one_device"`, e.g.
#'   `c("/gpu:0", "/gpu:1")`.
#' @param tf_config A TF_CONFIG as JSON text or a nested list to use instead of the TF_CONFIG
#'   variable.
#' @param cluster_resolver A `tf.distribute.cluster_resolver.ClusterResolver`; its cluster is used
#'   instead of TF_CONFIG.
#' @param environ The environment variables to read TF_CONFIG, SLURM_* and TPU_NAME from; `NULL`:
#'   the process environment.
#' @param gpus GPU names to plan for; `NULL`: the GPUs TensorFlow sees.
#' @param tpu A TPU name or address; `FALSE` for none; `NULL`: detected from TPU_NAME,
#'   COLAB_TPU_ADDR or a local TPU device.
#' @returns A list of class `kerasdist_strategy_plan`: `kind`, `reason`, `devices`, `tpu` and
#'   `cluster` (see [parse_tf_config()]); printing it shows Python's text.
#' @family strategy
#' @seealso Python: `kerasdist.plan_strategy()`.
#' @examplesIf !is.null(kerasdist_python())
#' plan_strategy(gpus = c("/gpu:0", "/gpu:1"))   # what two GPUs would give
#' @export
plan_strategy <- function(kind = "auto", devices = NULL, tf_config = NULL,
                          cluster_resolver = NULL, environ = NULL, gpus = NULL,
                          tpu = NULL) {
  plan <- call_with_signals(
    kerasdist_module()$plan_strategy, kind, devices, tf_config, cluster_resolver, environ, gpus, tpu
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

# select_strategy() and plan_strategy() pass Python the same signals (what decides the kind and
# the devices), each by name; `...`: select_strategy()'s own arguments.
call_with_signals <- function(fun, kind, devices, tf_config, cluster_resolver, environ, gpus, tpu,
                              ..., call = sys.call(-1)) {
  call_python(
    fun, kind, devices = devices, tf_config = tf_config, cluster_resolver = cluster_resolver,
    environ = environ, gpus = gpus, tpu = tpu, ..., call = call
  )
}

# r-docs: python/kerasdist/strategy.py:describe_strategy (make r-docs)
#' Describe a strategy
#'
#' @param strategy A strategy from [select_strategy()] or any `tf.distribute.Strategy`; `NULL`: the
#'   strategy whose scope is active (the default strategy outside any scope).
#' @returns A list of class `kerasdist_strategy_description`; printing it shows Python's text.
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

# r-docs: python/kerasdist/strategy.py:simulate_devices (make r-docs)
#' Split the CPU into logical devices
#'
#' Must run before TensorFlow initializes its devices (before any op, model or strategy; from R
#' before any keras3 function runs: `library(keras3)` first is fine). Calling it again with the same
#' `n` is a no-op.
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
