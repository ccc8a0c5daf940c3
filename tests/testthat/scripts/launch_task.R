# A stand-in for an R training script, for the launcher tests (no TensorFlow).
# usage: Rscript launch_task.R RECORD_DIR [FAIL_TASK EXIT_STATUS]
# Writes its TF_CONFIG to RECORD_DIR/<restart>-<type>-<index>.json and prints the task it names;
# the task FAIL_TASK ("worker 1") then exits with EXIT_STATUS on the first attempt.
args <- commandArgs(trailingOnly = TRUE)
tf_config <- Sys.getenv("TF_CONFIG")
me <- paste(Sys.getenv("KERASDIST_TASK_TYPE"), Sys.getenv("KERASDIST_TASK_INDEX"))
restart <- Sys.getenv("KERASDIST_RESTART")
writeLines(tf_config, file.path(args[[1]], sprintf("%s-%s.json", restart, sub(" ", "-", me))))
task <- sub('.*"task": *\\{"type": *"([a-z]+)", *"index": *([0-9]+)\\}.*', "\\1 \\2", tf_config)
cat("TF_CONFIG task:", task, "\n")
if (length(args) >= 3 && identical(args[[2]], me) && identical(restart, "0")) {
  Sys.sleep(0.3)
  quit(status = as.integer(args[[3]]))
}
