# The main job from R: Python's demo (python/kerasdist/demo.py), its result as an R list.

# r-docs: python/kerasdist/demo.py:kerasdist_demo (make r-docs)
#' The main job: distributed training on the bundled digits, killed and resumed
#'
#' Splits the CPU into 2 devices ([simulate_devices()]), lets [select_strategy()] pick
#' MirroredStrategy and trains a small CNN on the bundled digits ([load_digits()]) with
#' [distributed_fit()], checkpointing at every epoch end and every few steps. The first run is a
#' child process that SIGKILLs itself in the middle of an epoch, a few steps after a checkpoint;
#' this process then makes the same [distributed_fit()] call, which restores the newest checkpoint
#' and continues at the next batch. It prints progress all along, then the test accuracy on the
#' held-out digits, and writes `curves.png` (loss and accuracy per epoch, the kill and the resume
#' point marked), `log.csv` and `result.json` in `run_dir`.
#'
#' From R: call it in a fresh R session, since the 2 CPU devices must be set up before TensorFlow
#' starts (before any keras3 function runs; `library(keras3)` first is fine). The resumed run trains
#' in this R session's Python; the result comes as an R list.
#'
#' @param run_dir Directory for `checkpoints/`, `log.csv`, `curves.png` and `result.json`; its
#'   checkpoints are cleared first, so every demo starts from scratch.
#' @param epochs Total epochs (at least 1); the kill happens in the middle of epoch `epochs %/% 2`
#'   (0-based).
#' @param verbose Print the progress (default `TRUE`).
#' @returns The result as a list, invisibly: `strategy`, `replicas`, `killed_at` and `resumed_from`
#'   (each a list of an epoch, 0-based, and a step in it), `epochs`, `optimizer_steps`, `test_loss`,
#'   `test_accuracy`, `png` (the path of `curves.png`) and `wall_seconds`.
#' @family training
#' @seealso Python: `kerasdist.kerasdist_demo()`; command line: `kerasdist demo`;
#'   [distributed_fit()], [load_digits()].
#' @examples
#' \dontrun{
#' result <- kerasdist_demo("runs/demo-r", epochs = 6)
#' result$test_accuracy
#' }
#' @export
kerasdist_demo <- function(run_dir = "runs/demo", epochs = 6L, verbose = TRUE) {
  # The CPU split first, at kerasdist's import (before keras3 or anything else starts TensorFlow's
  # devices); Python checks `epochs` before any work.
  split_cpu_at_import(2L)
  run_dir <- path.expand(run_dir)
  if (sink.number() == 0 && !isTRUE(getOption("knitr.in.progress"))) {
    return(invisible(call_python_forwarding(kerasdist_module()$kerasdist_demo)))
  }
  # Python prints to the process's stdout, past R's console: where R's output is diverted (a
  # sink, capture.output(), knitr) its progress is caught and shown there once it ends
  call <- sys.call()
  printed <- reticulate::py_capture_output(
    result <- call_python(kerasdist_module()$kerasdist_demo, run_dir = run_dir, epochs = epochs,
                          verbose = verbose, call = call)
  )
  cat(printed)
  invisible(result)
}
