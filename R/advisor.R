# The strategy advisor: thin wrapper over python/kerasdist/advisor.py.

# r-docs: python/kerasdist/advisor.py:bench_strategies (make r-docs)
#' Time your model under each strategy this machine can run, and recommend one
#'
#' Each strategy runs in a fresh process ([launch()] for `"multi_worker"`), at the same global batch
#' size; for each, the step time on the real input pipeline ([make_dataset()]), the compute time
#' (the same step fed one batch held in memory) and the input pipeline alone are measured, and
#' `reason` says why the recommendation wins, e.g. that mirrored is slower here because the model is
#' too small for the all-reduce to pay off.
#'
#' The model is rebuilt in every strategy's process, so it is named, not passed: a Python function
#' returning a compiled Keras model, as `"module:function"` or `"path/to/file.py:function"` (write
#' it with `reticulate::py_run_string()` into a file, or keep a `models.py` next to your R script).
#' `"kerasdist.example_models:tiny_dense"` and `"kerasdist.example_models:mid_cnn"` are two examples
#' to try. Bad input is refused before any process starts, with an error of class
#' `kerasdist_ValueError` naming the argument.
#'
#' @param model Where the model comes from, as "module:function" (an importable module) or
#'   "path/to/file.py:function"; the function takes no arguments and returns a compiled Keras model.
#'   It is called in each strategy's process, inside the strategy's scope.
#' @param x Training data (matrices, arrays, vectors); `NULL` (and `y` `NULL`): random data shaped
#'   for the model's input and output.
#' @param y Training targets, as `x`.
#' @param strategies Character vector, a subset of `"default"`, `"mirrored"`, `"multi_worker"`;
#'   `NULL` for all three.
#' @param steps Timed training steps per strategy (after a warm-up of 10).
#' @param batch_size The global batch size, the same under every strategy.
#' @param devices CPU devices to simulate for "mirrored" on a machine without GPUs.
#' @param workers Worker processes for "multi_worker".
#' @param seed Seed of the data and the shuffle.
#' @param timeout Seconds allowed for each strategy's run.
#' @param verbose Print a line as each strategy starts and ends.
#' @param speed_options Also time the recommended strategy with `mixed_precision=TRUE` (the model
#'   built under `mixed_float16` on a GPU, `mixed_bfloat16` on a CPU) and with `jit_compile=TRUE`
#'   (XLA), in one more process of that strategy that times the model plain and with each option,
#'   interleaved round by round (each speedup compares runs of the same moment), and say in `reason`
#'   whether either helps (more than 5\% faster) and so is worth passing to [distributed_fit()] or
#'   [custom_fit()]. Off by default: one more process.
#' @returns A list of class `kerasdist_strategy_benchmark`: `timings` (a data frame, one row per
#'   strategy: replicas, devices, steps_per_second, examples_per_second, step_ms, compute_ms,
#'   input_wait_ms, input_only_ms, error), `recommendation`, `reason`, `model`, `parameters`,
#'   `global_batch_size`, `steps`, `device`, `speed_options` (with `speed_options = TRUE`, a data
#'   frame, one row per option: option, strategy, steps_per_second, step_ms, speedup, error; else
#'   `NULL`) and `text` (what `print()` shows).
#' @family strategy
#' @seealso Python: `kerasdist.bench_strategies()`; command line:
#'   `kerasdist bench --model module:function`.
#' @examples
#' \dontrun{
#' report <- bench_strategies("kerasdist.example_models:tiny_dense", steps = 100)
#' report              # the table, the recommendation and the reason
#' report$recommendation
#' }
#' @export
bench_strategies <- function(model, x = NULL, y = NULL, strategies = NULL, steps = 200L,
                             batch_size = 64L, devices = 2L, workers = 2L, seed = 0L,
                             timeout = 600, verbose = TRUE, speed_options = FALSE) {
  report <- call_python(
    kerasdist_module()$bench_strategies, model, x, y,
    strategies = strategies, steps = steps,
    batch_size = batch_size, devices = devices,
    workers = workers, seed = seed, timeout = timeout, verbose = verbose,
    speed_options = speed_options
  )
  strategy_benchmark_to_r(report)
}

strategy_benchmark_to_r <- function(report) {
  fields <- py_record_to_r(report)
  rows <- function(records) {
    do.call(rbind, lapply(records, function(t) {
      t[vapply(t, is.null, logical(1))] <- NA
      as.data.frame(t, stringsAsFactors = FALSE)
    }))
  }
  fields$timings <- rows(fields$timings)
  fields["speed_options"] <- list(if (length(fields$speed_options)) rows(fields$speed_options))
  shown <- c("timings", "recommendation", "reason", "model", "parameters", "global_batch_size", "steps", "device",
             "speed_options")
  structure(c(fields[shown], text = reticulate::py_str(report)), class = "kerasdist_strategy_benchmark")
}

#' @export
print.kerasdist_strategy_benchmark <- function(x, ...) {
  cat(x$text, "\n", sep = "")
  invisible(x)
}
