"""A training script for the launcher: every worker runs this same file.

    kerasdist launch -n 2 --max-restarts 3 -- examples/launch_train.py --epochs 5

select_strategy() reads the TF_CONFIG the launcher gives each process and picks "multi_worker";
the chief (worker 0) writes a checkpoint every epoch, so a group the launcher restarts after a
failure resumes from the newest one instead of starting over. A tiny regression model, a few
seconds of training; each worker prints one line. Its R twin is launch_train.R.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=5, help="epochs in total, earlier runs included")
parser.add_argument("--checkpoint-dir", default="ckpt",
                    help="only the chief reads and writes it; other workers get its state, so it need not be shared")
args = parser.parse_args()


def build_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


strategy = kerasdist.select_strategy()  # first: before anything else starts TensorFlow

x = np.random.default_rng(0).normal(size=(128, 4)).astype("float32")
y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)  # the global batch, split over workers

model = kerasdist.make_or_restore_model(args.checkpoint_dir, build_model, strategy=strategy)
history = kerasdist.resume_fit(model, dataset, args.epochs, args.checkpoint_dir, verbose=0)
loss = history.history["loss"]
print(f"trained {len(loss)} epochs on {strategy.num_replicas_in_sync} replicas, "
      f"loss {loss[0]:.3f} -> {loss[-1]:.3f}", flush=True)
