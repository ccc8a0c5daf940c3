"""Write the format-compatibility fixture with the checkpoint code before #42 (6647a13)."""
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import kerasdist
from kerasdist.checkpoint.model_state import seed_states

out = Path(sys.argv[1])
keras.utils.set_random_seed(7)


def build_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dropout(0.25, seed=3),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


x = np.linspace(0, 1, 48, dtype="float32").reshape(16, 3)
data = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).batch(4)
ckpt = out / "ckpt"
model = kerasdist.make_or_restore_model(ckpt, build_model)
kerasdist.resume_fit(model, data, 2, kerasdist.checkpoint_callback(ckpt, keep=1), verbose=0)
arrays = {f"weight_{i}": w for i, w in enumerate(model.get_weights())}
arrays.update({f"optimizer_{i}": np.asarray(v.numpy()) for i, v in enumerate(model.optimizer.variables)})
arrays.update({f"seed_{i}": s for i, s in enumerate(seed_states(model))})
np.savez(out / "expected.npz", **arrays)
print(kerasdist.__file__, kerasdist.latest_checkpoint(ckpt))
