# Where this process trains: thin wrappers over python/kerasdist/context.py.

# r-docs: python/kerasdist/context.py:run_context (make r-docs)
#' Where this process runs: the run context of a strategy
#'
#' With a strategy (or inside a strategy's scope), that strategy's context. With neither, this
#' process's place in the cluster its environment describes (TF_CONFIG, Slurm, `kerasdist launch`)
#' with the default strategy's replicas, so outside any scope `run_context().is_chief` is `TRUE` on
#' one worker only: the test for chief-only work (logs, exports, plots).
#'
#' It is what kerasdist's data pipeline, checkpoints and parameter-server training read, so a
#' training script can ask the same question (for example, write logs only on the chief); [launch()]
#' describes its tasks' clusters too.
#'
#' @param strategy A `tf.distribute.Strategy`; `NULL`: the active one, as above.
#' @returns A list of class `kerasdist_run_context`: `strategy`, `kind`, `num_replicas`,
#'   `num_workers` (workers, plus the chief except under parameter servers), `task_type` and
#'   `task_index` (`NULL` outside a cluster), `is_chief`, `task` (e.g. `"worker:1"`) and `formed_at`
#'   (when kerasdist first described this strategy, in seconds since the epoch).
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
