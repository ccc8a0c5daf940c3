# Loss scaling for custom steps under a strategy: a thin wrapper over python/kerasdist/loss_scaling.py.

# r-docs: python/kerasdist/loss_scaling.py:scaled_loss (make r-docs)
#' This replica's share of the mean loss over the global batch, ready for `tape.gradient`
#'
#' Call it inside the step function that `strategy.run` runs (or a Keras `train_step`). The
#' gradients of the returned loss, summed over the replicas (what the strategy and the optimizer
#' do), equal the gradients of the mean loss over the whole global batch on one device: also when
#' the last batch is smaller and the replicas get different numbers of rows, and with
#' regularization.
#'
#' From R: the step function itself must be Python (TensorFlow traces it on one thread per replica,
#' where R code cannot run), so from R this is mostly useful on a tensor, for checking; in Python
#' call `kerasdist.scaled_loss()` inside the step.
#'
#' @param per_example_loss A tensor (or numeric vector or matrix) of per-example losses, first axis
#'   = batch; the other axes are averaged per example. A scalar (an already averaged loss) is
#'   refused.
#' @param global_batch_size The number of examples of the global batch; `NULL` to count every
#'   replica's rows.
#' @param sample_weight Optional per-example weights (a numeric vector, or a tensor).
#' @param model A keras3 model whose `losses` are added.
#' @returns A scalar tensor of the dtype of `per_example_loss`.
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
