"""The upstream reports that one process with 3 simulated CPU devices meets, each run as Keras is
released (`compat.keras_as_released()`: the canary, expected to fail the upstream way) and with
kerasdist's patches (expected to train as one device does). Prints one JSON object.

usage: upstream_mirrored.py CHECKPOINT_ROOT [--forced]
With --forced the patches are put in place whatever the Keras version (make upstream-check runs
the museum so against the next Keras, to tell which patches it still needs).

- the uneven batch: a global batch that does not split evenly over MirroredStrategy's replicas
  (64 over 3: 22 + 22 + 20) fails in Keras's symbolic build (AddN of the replicas' slices); with
  the build fixed alone, Keras still weights each replica's mean loss by 1/replicas, not by its
  rows.
- keras-team/keras#23085: a user's own `strategy.run` loop with Adam under MirroredStrategy.
"""

import json
import sys

import keras
import numpy as np
import tensorflow as tf

import kerasdist
from kerasdist import compat
from kerasdist.compat import keras_training

kerasdist.simulate_devices(3)
root = sys.argv[1]
if "--forced" in sys.argv:
    compat.apply_keras_fixes(force=True)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])
one_device = tf.distribute.get_strategy()
rng = np.random.default_rng(0)
X = rng.normal(size=(200, 4)).astype("float32")  # 200 rows, batch 64: 64, 64, 64 and 8 (3 + 3 + 2)
Y = (X @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.1).astype("float32")
report: dict = {"keras": keras.__version__, "tensorflow": tf.__version__}


def build() -> keras.Model:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1, kernel_regularizer=keras.regularizers.l2(0.01))])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse", metrics=["mae"])
    return model


def built_in(scope_of) -> keras.Model:
    with scope_of.scope():
        return build()


def upstream_error(run) -> str:
    """What `run()` raised, shortened to the upstream signature the canaries look for."""
    try:
        run()
    except Exception as error:  # noqa: BLE001 - any failure is the finding
        text = str(error)
        for signature in ("AddN must have the same size and shape", "You must feed a value for placeholder tensor"):
            if signature in text:
                return signature
        return f"{type(error).__name__}: {text[:300]}"
    return "works"


def weights_gap(a: keras.Model, b: keras.Model) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a.get_weights(), b.get_weights(), strict=True))


def fit(model: keras.Model, batch_size: int) -> list[float]:
    return model.fit(X, Y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0).history["loss"]


# -- the uneven batch, plain model.fit -------------------------------------------------------------
single = built_in(one_device)
single_losses = fit(single, 64)
with compat.keras_as_released():
    report["uneven_plain"] = upstream_error(lambda: fit(built_in(strategy), 64))
    compat.apply_uneven_batch_fixes(force=True)  # then Keras's loss scaling as released
    keras_training.loss_module.scale_loss_for_distribution = keras_training._original_scale_loss
    keras_training.loss_module.unscale_loss_for_distribution = keras_training._original_unscale_loss
    build_only = built_in(strategy)
    fit(build_only, 64)
    report["uneven_build_only_gap"] = weights_gap(build_only, single)  # > tolerance: 1/replicas weighting
mirrored = built_in(strategy)
report["uneven_fit_losses"] = [fit(mirrored, 64), single_losses]
report["uneven_fit_gap"] = weights_gap(mirrored, single)
small_single, small_mirrored = built_in(one_device), built_in(strategy)  # 5 over 3: 2 + 2 + 1
report["uneven_small_losses"] = [fit(small_mirrored, 5), fit(small_single, 5)]
report["uneven_small_gap"] = weights_gap(small_mirrored, small_single)
evaluated = mirrored.evaluate(X, Y, batch_size=64, return_dict=True, verbose=0)
expected = single.evaluate(X, Y, batch_size=64, return_dict=True, verbose=0)
report["uneven_evaluate_gap"] = max(abs(evaluated[k] - expected[k]) for k in expected)

# -- the uneven batch, kerasdist's trainers --------------------------------------------------------
common = dict(epochs=2, batch_size=64, shuffle=False, verbose=0)
dist = kerasdist.distributed_fit(build, X, Y, checkpoint_dir=f"{root}/dist", strategy=strategy, **common)
dist_single = kerasdist.distributed_fit(build, X, Y, checkpoint_dir=f"{root}/dist1", strategy="default", **common)
report["distributed_fit_losses"] = [dist.history["loss"], dist_single.history["loss"]]
for trainer in ("custom_fit", "resume_fit"):  # each against itself on one device
    runs = []
    for where in (strategy, one_device):
        stream = kerasdist.make_dataset(X, Y, batch_size=64, shuffle=False, epochs=2, strategy=where)
        model, folder = built_in(where), f"{root}/{trainer}-{where.num_replicas_in_sync}"
        if trainer == "custom_fit":
            history = kerasdist.custom_fit(model, stream, epochs=2, checkpoint_dir=folder, verbose=0)
        else:
            history = kerasdist.resume_fit(model, stream, epochs=2, checkpoint=folder, verbose=0)
        runs.append((history.history["loss"], model))
    report[f"{trainer}_losses"] = [runs[0][0], runs[1][0]]
    report[f"{trainer}_gap"] = weights_gap(runs[0][1], runs[1][1])


# -- keras-team/keras#23085: the reporter's loop, Adam, under MirroredStrategy ---------------------
def reporter_loop(scope_of, global_batch: int = 6) -> keras.Model:
    """The issue's loop: model and optimizer made in the scope, `strategy.run` in a tf.function,
    `compute_average_loss`, `optimizer.apply_gradients`."""
    with scope_of.scope():
        keras.utils.set_random_seed(2)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.Adam(learning_rate=1e-2)
    data = tf.data.Dataset.from_tensor_slices((X[:48], Y[:48])).batch(global_batch)
    dataset = scope_of.experimental_distribute_dataset(data)

    @tf.function
    def train_step(batch):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                per_example = keras.losses.mean_squared_error(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss
        return scope_of.reduce("SUM", scope_of.run(step_fn, args=batch), axis=None)

    for batch in dataset:
        train_step(batch)
    return model


with compat.keras_as_released():
    report["custom_loop_plain"] = upstream_error(lambda: reporter_loop(strategy))
trained = reporter_loop(strategy)
report["custom_loop_gap"] = weights_gap(trained, reporter_loop(one_device))
with one_device.scope():
    keras.utils.set_random_seed(2)
    untrained = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
report["custom_loop_moved"] = weights_gap(trained, untrained)  # it did train
print(json.dumps(report), flush=True)
