#' Versions and the strategy chosen here
#'
#' Prints the versions of kerasdist, TensorFlow, Keras, NumPy and Python, then
#' the strategy `select_strategy(kind)` gives on this machine and why.
#'
#' @inheritParams select_strategy
#' @returns The text, invisibly.
#' @family setup
#' @seealso Python: `kerasdist.kerasdist_info()`; `python -m kerasdist info`.
#' @examplesIf !is.null(kerasdist_python())
#' kerasdist_info()   # prints; the text is also returned, invisibly
#' @export
kerasdist_info <- function(kind = "auto") {
  text <- call_python(kerasdist_module()$kerasdist_info, kind)
  cat(sprintf("kerasdist (R %s, reticulate %s)\n", getRversion(), utils::packageVersion("reticulate")))
  cat(text, "\n", sep = "")
  invisible(text)
}
