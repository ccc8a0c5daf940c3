# r-docs: python/kerasdist/monitoring.py:chief_path (make r-docs)
#' A path the chief writes, and every other worker writes somewhere of its own
#'
#' `path` on the chief (and outside a cluster); on any other worker the same name in a temporary
#' folder of its own, removed when the process exits, as TensorFlow's multi-worker guide prescribes
#' for logs and exports. kerasdist's trainers already do this for keras3's file-writing callbacks
#' (`callback_tensorboard()`, `callback_csv_logger()`, `callback_model_checkpoint()`); use it for
#' what your own code writes.
#'
#' @param path A file or directory path (a name pattern such as "model-{epoch}.keras" is kept).
#' @param context Where this process trains, from [run_context()]; `NULL`: [run_context()] (this
#'   process's place in its cluster).
#' @returns The path to write to, a string.
#' @family strategy
#' @seealso Python: `kerasdist.chief_path()`.
#' @examplesIf !is.null(kerasdist_python())
#' log_dir <- chief_path(file.path(tempdir(), "logs"))   # tempdir()/logs on the chief
#' @export
chief_path <- function(path, context = NULL) {
  python_context <- if (inherits(context, "kerasdist_run_context")) attr(context, "python") else context
  call_python(kerasdist_module()$chief_path, if (is.character(path)) path.expand(path) else path,
              context = python_context)
}
