# r-docs: python/kerasdist/about.py:kerasdist_info (make r-docs)
#' Versions of the stack and a description of the strategy `select_strategy(kind)` gives
#'
#' From R it prints that text (the versions of kerasdist, TensorFlow, Keras, NumPy and Python, then
#' the strategy `select_strategy(kind)` gives on this machine and why) after a line with the
#' versions of R and reticulate.
#'
#' @inheritParams plan_strategy
#' @returns The text, invisibly.
#' @family setup
#' @seealso Python: `kerasdist.kerasdist_info()`; `kerasdist info`.
#' @examplesIf !is.null(kerasdist_python())
#' kerasdist_info()   # prints; the text is also returned, invisibly
#' @export
kerasdist_info <- function(kind = "auto") {
  text <- call_python(kerasdist_module()$kerasdist_info, kind)
  cat(sprintf("kerasdist (R %s, reticulate %s)\n", getRversion(), utils::packageVersion("reticulate")))
  cat(text, "\n", sep = "")
  invisible(text)
}
