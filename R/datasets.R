# Bundled data: thin wrapper over python/kerasdist/datasets (the single copy of the file).

# r-docs: python/kerasdist/datasets/__init__.py:load_digits (make r-docs)
#' The UCI handwritten digits, bundled
#'
#' 1,797 8x8 grey images of the digits 0-9, shipped inside kerasdist (Python package data), so
#' nothing is downloaded. Each pixel is the count of "on" pixels in a 4x4 block of a 32x32 bitmap
#' (0..16), divided by 16. The rows are in the file's order (not sorted by label), so the last ones
#' make a fair held-out set.
#'
#' Data: E. Alpaydin and C. Kaynak, "Optical Recognition of Handwritten Digits", UCI Machine
#' Learning Repository (1998), \doi{10.24432/C50P49}, licensed CC BY 4.0.
#'
#' @param flatten `TRUE` for `x` as a 1797 x 64 matrix instead of images.
#' @returns A list: `x`, a double array of dimension `c(1797, 8, 8, 1)` (channels last, for a Conv2D
#'   model; or a 1797 x 64 matrix with `flatten = TRUE`) with values in \[0, 1\], and `y`, an
#'   integer vector of labels 0-9. Rows are samples.
#' @family data
#' @seealso Python: `kerasdist.load_digits()`; [make_dataset()], [distributed_fit()].
#' @examplesIf !is.null(kerasdist_python())
#' digits <- load_digits()
#' dim(digits$x)   # 1797 8 8 1
#' table(digits$y)
#' @export
load_digits <- function(flatten = FALSE) {
  data <- call_python(kerasdist_module()$load_digits, flatten = flatten)
  list(x = data[[1]], y = as.integer(data[[2]]))
}
