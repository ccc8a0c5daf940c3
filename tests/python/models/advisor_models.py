"""Model and data functions for the strategy advisor's tests (named as file.py:function)."""

import keras
import numpy as np


def small_classifier():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def classifier_data():
    rng = np.random.default_rng(1)
    return rng.normal(size=(512, 8)).astype("float32"), rng.integers(0, 3, size=512)


def uncompiled():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


def broken():
    raise RuntimeError("the model could not be built: layer sizes disagree")
