# Ray Train: thin wrapper over python/kerasdist/ray_train.py.

# r-docs: python/kerasdist/ray_train.py:ray_checkpoint_dir (make r-docs)
#' The checkpoint directory of a Ray Train run
#'
#' Call it inside the training function that a Ray `TensorflowTrainer` runs and give it to
#' [distributed_fit()] (or [make_or_restore_model()] and [resume_fit()]) as `checkpoint_dir`. Each
#' epoch's newest checkpoint is then reported to Ray as the committed directory itself (nothing
#' copied), so `result.checkpoint`, Ray Tune and a new driver with the same
#' `RunConfig(name, storage_path)` see it; a worker group Ray restarts resumes from there.
#' `storage_path` must be a directory every node reaches (shared disk), or `s3://` / `gs://`.
#'
#' From R: Ray's workers run Python, so the training function itself is Python; an R session can
#' drive a Ray run through reticulate (examples/ray/train.R) and call this inside Python code only.
#' It is an error in any R session not running as a Ray Train worker.
#'
#' @param folder The folder's name inside the run's directory (default "kerasdist").
#' @returns A local path, or an `s3://` / `gs://` URL, a string.
#' @family training
#' @seealso Python: `kerasdist.ray_checkpoint_dir()`; the Ray recipe: `docs/ray.md`.
#' @export
ray_checkpoint_dir <- function(folder = "kerasdist") {
  call_python(kerasdist_module()$ray_checkpoint_dir, folder = folder)
}
