#' kerasdist: distributed, fault-tolerant Keras 3 training from R
#'
#' The R front end of the kerasdist Python core: the same functions, with the
#' same names and arguments, through reticulate. Start with [select_strategy()].
#'
#' @keywords internal
"_PACKAGE"
