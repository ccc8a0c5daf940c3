# Loss scaling for custom steps under a strategy: a thin wrapper over python/kerasdist/loss_scaling.py.

#' One replica's share of the mean loss over the global batch
#'
#' For custom training steps that run under `strategy$run()`: returns the sum
#' of this replica's per-example losses divided by the global batch size, plus
#' its share of `model$losses` (regularization), so that the gradients summed
#' over the replicas equal the single-device gradients of the mean loss, also
#' for a last batch split unevenly over the replicas. The non-batch axes of a
#' multi-dimensional per-example loss are averaged first; a scalar (already
#' averaged) loss is an error.
#'
#' The step function itself must be Python (TensorFlow traces it on one
#' thread per replica, where R code cannot run), so from R this is mostly
#' useful on a tensor, for checking; in Python call
#' `kerasdist.scaled_loss()` inside the step.
#'
#' @param per_example_loss A tensor (or numeric vector or matrix) of per-example
#'   losses, first axis = batch.
#' @param global_batch_size The number of examples of the global batch;
#'   `NULL` to count every replica's rows.
#' @param sample_weight Optional per-example weights.
#' @param model A keras3 model whose `losses` are added.
#' @returns A scalar tensor.
#' @family evaluation
#' @seealso Python: `kerasdist.scaled_loss()`.
#' @examplesIf !is.null(kerasdist_python())
#' tf <- reticulate::import("tensorflow")
#' scaled_loss(tf$constant(c(1, 2, 3, 6)))  # 3: one replica, the mean
#' scaled_loss(c(1, 2, 3, 6), global_batch_size = 8)  # 1.5
#' @export
scaled_loss <- function(per_example_loss, global_batch_size = NULL, sample_weight = NULL, model = NULL) {
  call_python(
    kerasdist_module()$scaled_loss, per_example_loss = per_example_loss,
    global_batch_size = global_batch_size, sample_weight = sample_weight,
    model = model
  )
}
