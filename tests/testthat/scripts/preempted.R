# Trains with resume_fit and sends itself SIGTERM at the end of global step 3 (saved at that step's end:
# the checkpoint callback runs after this one). Under Rscript the process must
# exit with status 75 after the save; with options(kerasdist.exit_on_preemption = FALSE) (what an
# interactive session gets) resume_fit stops with a kerasdist_preempted condition instead.
library(keras3)
library(kerasdist)
if (identical(Sys.getenv("PREEMPTED_AS_CONDITION"), "1")) options(kerasdist.exit_on_preemption = FALSE)
x <- matrix(seq_len(256) / 256, ncol = 4)
model <- make_or_restore_model("ckpt", function() {
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
saveRDS(list(class = class(result), checkpoint = result$checkpoint, global_step = result$global_step, status = result$status,
             message = conditionMessage(result)), "preempted.rds")
