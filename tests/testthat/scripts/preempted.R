# Trains with resume_fit and sends itself SIGTERM at the end of global step 3 (saved at that step's
# end: the checkpoint callback runs after this one), once in each of its working directory's
# folders condition/ and exit/, in this order, in this one process (one TensorFlow start-up for
# both; test-keras3.R sources it after another script, in that script's Rscript). In condition/,
# with options(kerasdist.exit_on_preemption = FALSE) (what an interactive session gets),
# resume_fit stops with a kerasdist_preempted condition, written to condition/preempted.rds, and
# the session goes on (it says so). In exit/, with the option back at its default, the Rscript
# must exit with status 75 after the save, inside resume_fit: exit/preempted.rds is never written.
library(keras3)
library(kerasdist)
x <- matrix(seq_len(256) / 256, ncol = 4)

train_until_preempted <- function(dir) {
  dir.create(dir)
  model <- make_or_restore_model(file.path(dir, "ckpt"), function() {
    keras_model_sequential(input_shape = 4) |> layer_dense(1) |> compile(optimizer = "adam", loss = "mse")
  })
  term <- callback_lambda(on_train_batch_end = function(batch, logs) {
    if (model$optimizer$iterations$numpy() == 3) tools::pskill(Sys.getpid(), tools::SIGTERM)
  })
  result <- tryCatch(
    model |> resume_fit(make_dataset(x, rowSums(x), batch_size = 8, epochs = 1), epochs = 2,
                        callbacks = term, verbose = 0),
    kerasdist_preempted = function(e) e
  )
  saveRDS(list(class = class(result), checkpoint = result$checkpoint, global_step = result$global_step,
               status = result$status, message = conditionMessage(result)), file.path(dir, "preempted.rds"))
}

default <- options(kerasdist.exit_on_preemption = FALSE)
train_until_preempted("condition")
cat("the session went on after kerasdist_preempted\n")
options(default)
train_until_preempted("exit")
