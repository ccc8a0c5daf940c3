# r-docs: python/kerasdist/goodput.py:goodput (make r-docs)
#' Where a run's time went: goodput, and what failures cost
#'
#' The wall time from the run's first start to its end splits into productive training, start-up
#' (the interpreter, TensorFlow, the cluster, the model, the first step), restore, checkpoint
#' blocking (training waiting in saves), redone work (steps trained again because a failure came
#' after the last checkpoint), evaluation, detection (for a start that failed: from the end of its
#' last completed step to its end, e.g. waiting until a dead peer is declared lost), hang (for a
#' start whose step watchdog found it hung: from its last step to the watchdog's exit; the stuck
#' worker and its frame named), other (after training) and downtime (no process running, e.g. a
#' requeued job waiting in the queue). Goodput is productive time over wall time. Under a
#' multi-worker strategy a worker the others persistently waited for is named as a straggler.
#'
#' @inheritParams make_or_restore_model
#' @param checkpoint_dir Directory of checkpoints whose `runs/` holds the run log (never created:
#'   one without a run log is an error naming it), or an object-store URL (`"s3://..."`,
#'   `"gs://..."`, `"memory://..."`, `"file://..."`), as in [make_or_restore_model()].
#' @returns A data frame with one row per part (`part`, `seconds`, `share` of the wall time), of
#'   class `kerasdist_goodput` (its print shows the whole report), with attributes `goodput`,
#'   `goodput_excluding_downtime`, `wall_seconds`, `redone_steps`, `failures`, `save_cost_seconds`,
#'   `mean_time_between_failures`, `suggested_interval_seconds` (the checkpoint interval that loses
#'   least by Young/Daly, `sqrt(2 x save cost x mean time between failures)`, `NA` without failures
#'   or without saves), `mean_save_interval_seconds` (the run's own) and `attempts` (a data frame:
#'   one row per start of the chief's process, with its `status`: `"completed"`, `"preempted"`,
#'   `"peer lost"`, `"hung"` or `"killed or crashed"`, its first step's time, `last_step` and
#'   `last_step_at` (the last step it completed and when), `detection_seconds` (its time after that
#'   step, when it failed), `recovery_seconds`, from the previous attempt's failure (the end of its
#'   last completed step) to this one's first step, `workers`, the workers that trained in it: a job
#'   that shrank on a lost host and grew back shows 2, 1, 2, `redone_steps`, and for a start that
#'   hung (`status` `"hung"`: its step watchdog fired) `hang_seconds`, `hang_worker` and
#'   `hang_frame`, the stuck worker and where it was stuck) and `straggler` (`NULL`, or a list
#'   naming the `worker` the others persistently waited for, `slower_seconds`, `slower_ratio`,
#'   `waiting_share`, `epochs`, `of_epochs`). An error if the directory holds no run log.
#' @family checkpoint
#' @seealso Python: `kerasdist.goodput()`; the shell: `kerasdist goodput DIR`.
#' @examplesIf !is.null(kerasdist_python())
#' dir <- file.path(tempdir(), "example-goodput")
#' x <- matrix(seq_len(64) / 64, ncol = 4)
#' distributed_fit(function() {
#'   keras3::keras_model_sequential(input_shape = 4) |> keras3::layer_dense(1) |>
#'     keras3::compile(optimizer = "adam", loss = "mse")
#' }, x, rowSums(x), epochs = 2, checkpoint_dir = dir, batch_size = 8, strategy = "default", verbose = 0)
#' report <- goodput(dir)
#' report
#' attr(report, "goodput")
#' @export
goodput <- function(checkpoint_dir, storage_options = NULL) {
  report <- call_python(kerasdist_module()$goodput, checkpoint_dir, storage_options = storage_options)
  tables <- call_python(.kerasdist$bridge$goodput_columns, report)
  number <- function(value) if (is.null(value)) NA_real_ else as.numeric(value)
  structure(
    columns_to_data_frame(tables$parts),
    class = c("kerasdist_goodput", "data.frame"),
    goodput = report$goodput,
    goodput_excluding_downtime = report$goodput_excluding_downtime,
    wall_seconds = report$wall_seconds,
    redone_steps = as.integer(report$redone_steps),
    failures = as.integer(report$failures),
    save_cost_seconds = number(report$save_cost_seconds),
    mean_time_between_failures = number(report$mean_time_between_failures),
    suggested_interval_seconds = number(report$suggested_interval_seconds),
    mean_save_interval_seconds = number(report$mean_save_interval_seconds),
    attempts = columns_to_data_frame(tables$attempts),
    straggler = if (is.null(report$straggler)) NULL else py_record_to_r(report$straggler),
    report = report
  )
}

#' @export
print.kerasdist_goodput <- function(x, ...) {
  if (is.null(attr(x, "report"))) {
    return(NextMethod())  # a subset of the rows: a plain data frame's print
  }
  cat(reticulate::py_str(attr(x, "report")), "\n", sep = "")
  invisible(x)
}

# r-docs: python/kerasdist/goodput.py:plot_goodput (make r-docs)
#' Draw a run's timeline, failures marked
#'
#' One bar per start of the chief's process, its parts coloured (start-up, restore, productive,
#' checkpoint blocking, evaluation, redone, detection), each failure marked, the gaps between bars
#' the downtime; the title gives the goodput. It needs matplotlib in the Python kerasdist uses
#' ([install_kerasdist()] installs it).
#'
#' @param report What [goodput()] returned.
#' @param path The PNG file to write.
#' @returns `path`, invisibly.
#' @family checkpoint
#' @seealso Python: `kerasdist.plot_goodput()`; the shell: `kerasdist goodput DIR --plot PNG`.
#' @examples
#' \dontrun{
#' plot_goodput(goodput("checkpoints"), "timeline.png")
#' }
#' @export
plot_goodput <- function(report, path) {
  # Python checks `report` (anything but goodput()'s answer carries no "report": None there); R
  # checks `path` for what Python never sees (NA, a vector of names)
  if (!is.character(path) || length(path) != 1L || is.na(path) || !nzchar(path)) {
    kerasdist_abort("path must be one file name (the PNG to write).", call = sys.call())
  }
  call_python(kerasdist_module()$plot_goodput, attr(report, "report"), path.expand(path))
  invisible(path)
}

