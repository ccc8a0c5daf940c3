"""One worker of a multi-worker run whose strategy the user made, as TensorFlow's guides do:
`tf.distribute.MultiWorkerMirroredStrategy()` handed to kerasdist's entry points.

usage: user_strategy.py OUT_DIR [--sigterm]
Prints one JSON line per entry point; writes OUT_DIR/weights-<task index>.npz. With --sigterm the
worker signals itself right after its first kerasdist call, before any training.
"""

import json
import os
import signal
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import kerasdist

strategy = tf.distribute.MultiWorkerMirroredStrategy()  # the user's own, not select_strategy()
out_dir = sys.argv[1]


def report(**values):
    print(json.dumps(values), flush=True)


def build():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def step(model, optimizer, batch):
    x, y = batch
    with tf.GradientTape() as tape:
        per_example = keras.losses.sparse_categorical_crossentropy(y, model(x, training=True), from_logits=True)
        loss = kerasdist.scaled_loss(per_example, model=model)
    grads = tape.gradient(optimizer.scale_loss(loss), model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    return {"loss": loss}


rng = np.random.default_rng(0)
x = rng.random((64, 4), dtype=np.float32)
y = (x.sum(axis=1) * 1.5).astype(np.int32) % 3

context = kerasdist.run_context(strategy)
report(kind=context.kind, task=context.task, chief=context.is_chief, workers=context.num_workers)
if "--sigterm" in sys.argv:  # TensorFlow's coordination agent took SIGTERM; kerasdist takes it back
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    sys.exit("SIGTERM was swallowed")

history = kerasdist.distributed_fit(build, x, y, strategy=strategy, epochs=2, batch_size=16,
                                    checkpoint_dir=f"{out_dir}/fit", verbose=0)
report(fit_loss=history.history["loss"])
report(evaluate=kerasdist.distributed_evaluate(history.model, x, y, batch_size=16))

with strategy.scope():
    model = kerasdist.make_or_restore_model(f"{out_dir}/custom", build)
data = kerasdist.make_dataset(x, y, batch_size=16, seed=1, epochs=2, strategy=strategy)
custom = kerasdist.custom_fit(model, data, step, epochs=2, checkpoint_dir=f"{out_dir}/custom", verbose=0)
report(custom_loss=custom.history["loss"])
np.savez(f"{out_dir}/weights-{context.task_index}.npz", *history.model.get_weights(), *model.get_weights())
