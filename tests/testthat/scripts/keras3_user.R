# A keras3 user's script in the style of the keras3 distributed-training guide, with kerasdist's
# checkpoints. Run twice by test-keras3.R: the first run is SIGKILLed mid-epoch (KILL_AT_STEP), the
# second resumes and finishes. Writes history.png and result.rds in its working directory.
library(keras3)
library(kerasdist)

kill_at_step <- as.integer(Sys.getenv("KILL_AT_STEP", "0"))  # global step, 0 for none
simulate_devices(2)
strategy <- select_strategy()

set.seed(1)
x_train <- matrix(runif(640 * 784), ncol = 784)  # MNIST-like: 784 pixels, 10 classes
y_train <- sample(0:9, 640, replace = TRUE)

build_model <- function() {
  keras_model_sequential(input_shape = 784) |>
    layer_dense(64, activation = "relu") |>
    layer_dense(10, activation = "softmax") |>
    compile(optimizer = optimizer_adam(), loss = "sparse_categorical_crossentropy", metrics = "accuracy")
}

with(strategy$scope(), {
  model <- make_or_restore_model("ckpt", build_model)
})

steps_done <- model$optimizer$iterations$numpy()
killer <- callback_lambda(on_train_batch_begin = function(batch, logs) {  # the step before done and saved
  if (kill_at_step > 0 && model$optimizer$iterations$numpy() == kill_at_step) {
    # the test expects the step-4 checkpoint (saved in the background) on disk when it dies
    reticulate::import("kerasdist.checkpoint.background")$wait_for_all()
    Sys.sleep(1.5)  # the run log's heartbeat (every second) records step 6: goodput() counts 2 redone
    tools::pskill(Sys.getpid(), tools::SIGKILL)
  }
})
data <- function(epoch) {
  make_dataset(x_train, y_train, batch_size = 64, seed = 1, initial_epoch = epoch, epochs = epoch + 1)
}
history <- model |>
  resume_fit(data, epochs = 3, checkpoint = checkpoint_callback("ckpt", every_steps = 4),
             callbacks = killer, verbose = 0)

png("history.png")
plot(history)
dev.off()
saveRDS(list(
  steps_at_start = as.integer(steps_done),
  steps = as.integer(model$optimizer$iterations$numpy()),
  history = as.data.frame(history),
  latest = latest_checkpoint("ckpt")[c("epoch", "step_in_epoch", "global_step")]
), "result.rds")
