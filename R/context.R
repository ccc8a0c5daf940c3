# Where this process trains: thin wrappers over python/kerasdist/context.py.

#' Where this process runs: the run context of a strategy
#'
#' The replicas, the workers that train and read data, this task and whether
#' it is the chief, decided once per strategy. It is what kerasdist's data
#' pipeline, checkpoints and parameter-server training read, so a training
#' script can ask the same question (for example, write logs only on the chief).
#' With no strategy and no strategy's scope active, it describes this
#' process's place in the cluster its environment describes (TF_CONFIG, Slurm,
#' [launch()]) with the default strategy's replicas: there `is_chief` is `TRUE`
#' on one worker only.
#'
#' @param strategy A strategy; `NULL`: the active one, as above.
#' @returns A list of class `kerasdist_run_context`: `strategy`, `kind`,
#'   `num_replicas`, `num_workers` (workers, plus the chief except under
#'   parameter servers), `task_type` and `task_index` (`NULL` outside a
#'   cluster), `is_chief`, `task` (e.g. `"worker:1"`) and `formed_at` (when
#'   kerasdist first described this strategy, in seconds since the epoch).
#' @family strategy
#' @seealso Python: `kerasdist.run_context()`.
#' @examplesIf !is.null(kerasdist_python())
#' if (run_context()$is_chief) message("this process writes the checkpoints")
#' @export
run_context <- function(strategy = NULL) {
  context <- call_python(kerasdist_module()$run_context, strategy)
  # the record without its strategy, which cannot be deep-copied (the default one is a singleton)
  dataclasses <- reticulate::import("dataclasses", convert = FALSE)
  record <- py_record_to_r(dataclasses$replace(context, strategy = NULL), "task")
  record$strategy <- reticulate::py_get_attr(context, "strategy")
  structure(record, class = "kerasdist_run_context", python = context)
}

#' @export
print.kerasdist_run_context <- function(x, ...) {
  where <- if (is.null(x$task)) "one process" else paste0("task ", x$task)
  cat(sprintf("<run context> %s: %d replica(s), %d worker(s), %s, %s\n", x$kind, x$num_replicas,
              x$num_workers, where, if (x$is_chief) "chief" else "not the chief"))
  invisible(x)
}
