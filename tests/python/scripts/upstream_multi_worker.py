"""One worker of the multi-worker museum: the upstream reports met under
MultiWorkerMirroredStrategy, each reporter's minimal code on synthetic data, run as Keras is
released (the canary: the upstream error) and with kerasdist's patches (the losses of each epoch).

usage: upstream_multi_worker.py [--single] [--forced]
Run by `kerasdist launch -n 2` (TF_CONFIG set); prints one JSON line. --single: the same models
on one device, no canaries (the reference). --forced: the patches whatever the Keras version.

- tensorflow/tensorflow#72388: `fit` reduces scalar losses with axis=0 ("Invalid reduction
  dimension 0 for input with 0 dimensions"); run with the symbolic-build patch alone, which is
  what reaches that reduction on Keras 3.15.
- keras-team/keras#20329: a model with dict inputs under MWMS (the PerReplica error).
- ray-project/ray#47464: Ray Train's TensorFlow example (TF_CONFIG only, the strategy made by the
  training function, `fit` on a dataset of global batches): the PerReplica error.
"""

import json
import sys

import keras
import numpy as np
import tensorflow as tf

single = "--single" in sys.argv
strategy = tf.distribute.get_strategy() if single else tf.distribute.MultiWorkerMirroredStrategy()
import kerasdist  # noqa: E402,F401 - after the strategy, as users add it to their script
from kerasdist import compat  # noqa: E402
from kerasdist.compat import keras_training  # noqa: E402

if "--forced" in sys.argv:
    compat.apply_keras_fixes(force=True)
rng = np.random.default_rng(0)
report: dict = {}


def upstream_error(run) -> str:
    try:
        run()
    except Exception as error:  # noqa: BLE001 - any failure is the finding
        text = str(error)
        if "Attempt to convert a value (" in text and "PerReplica" in text:
            return "Attempt to convert a value (PerReplica"
        if "Invalid reduction dimension 0" in text:
            return "Invalid reduction dimension 0"
        return f"{type(error).__name__}: {text[:300]}"
    return "works"


# keras-team/keras#20329: dict inputs
A, B = rng.normal(size=(64, 3)).astype("float32"), rng.normal(size=(64, 2)).astype("float32")
Y = (A.sum(1, keepdims=True) - B[:, :1]).astype("float32")


def dict_inputs() -> list[float]:
    with strategy.scope():
        keras.utils.set_random_seed(4)
        a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
        hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
        model = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(hidden))
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    data = tf.data.Dataset.from_tensor_slices(({"a": A, "b": B}, Y)).batch(16)
    return model.fit(data, epochs=2, verbose=0).history["loss"]


# ray-project/ray#47464: Ray Train's TensorFlow example (its train_func), Ray's part left out
X = rng.normal(size=(64, 1)).astype("float32")
T = (2 * X + 1).astype("float32")


def ray_train_func(config: dict) -> list[float]:
    def build_model() -> keras.Model:
        return keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(10), keras.layers.Dense(1)])

    with strategy.scope():
        keras.utils.set_random_seed(5)
        multi_worker_model = build_model()
        multi_worker_model.compile(optimizer=keras.optimizers.SGD(learning_rate=config["lr"]),
                                   loss=keras.losses.MeanSquaredError(), metrics=["mse"])
    dataset = tf.data.Dataset.from_tensor_slices((X, T)).batch(config["batch_size"])
    return multi_worker_model.fit(dataset, epochs=config["epochs"], verbose=0).history["loss"]


# tensorflow/tensorflow#72388: scalar losses reduced across workers
def scalar_reduction() -> list[float]:
    with strategy.scope():
        keras.utils.set_random_seed(6)
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model.fit(tf.data.Dataset.from_tensor_slices((X, T)).batch(8), epochs=2, verbose=0).history["loss"]


ray_config = {"lr": 0.05, "batch_size": 16, "epochs": 2}
if not single:
    with compat.keras_as_released():
        report["keras_20329_plain"] = upstream_error(dict_inputs)
        report["ray_47464_plain"] = upstream_error(lambda: ray_train_func(ray_config))
        compat.apply_multi_worker_fixes(force=True)  # then Keras's reduce_per_replica as released
        keras_training.tf_trainer.reduce_per_replica = keras_training._original_reduce_per_replica
        report["tensorflow_72388_plain"] = upstream_error(scalar_reduction)
report["keras_20329"] = dict_inputs()
report["ray_47464"] = ray_train_func(ray_config)
report["tensorflow_72388"] = scalar_reduction()
print(json.dumps(report), flush=True)
