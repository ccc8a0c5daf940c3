"""custom_fit on the default strategy, deterministic; optionally SIGKILLs itself after a given
optimizer step. usage: custom_fit_resumable.py CKPT_DIR OUT.npz [KILL_AT_STEP]"""

import os
import signal
import sys

import keras
import numpy as np
import tensorflow as tf

import kerasdist
from kerasdist.checkpoint import background

tf.config.experimental.enable_op_determinism()
EPOCHS = 3


def build():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    return model


def step(model, optimizer, batch):
    x, y = batch
    with tf.GradientTape() as tape:
        per_example = keras.losses.sparse_categorical_crossentropy(y, model(x, training=True), from_logits=True)
        loss = kerasdist.scaled_loss(per_example, model=model)
    grads = tape.gradient(optimizer.scale_loss(loss), model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    return {"loss": loss}


class Kill(keras.callbacks.Callback):
    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_train_batch_begin(self, batch, logs=None):  # step `at` done, its checkpoint taken
        if int(self.model.optimizer.iterations.numpy()) == self.at:
            background.wait_for_all()  # its checkpoint written (saves run in the background)
            os.kill(os.getpid(), signal.SIGKILL)


rng = np.random.default_rng(0)
x = rng.random((60, 4), dtype=np.float32)
y = (x.sum(axis=1) * 1.5).astype(np.int32) % 3
data = kerasdist.make_dataset(x, y, batch_size=8, seed=5, epochs=EPOCHS)
kill = [Kill(int(sys.argv[3]))] if len(sys.argv) > 3 else []
history = kerasdist.custom_fit(build, data, step, epochs=EPOCHS, checkpoint_dir=sys.argv[1], every_steps=1,
                               callbacks=kill, verbose=0)
np.savez(sys.argv[2], *history.model.get_weights(), loss=np.array(history.history["loss"]))
