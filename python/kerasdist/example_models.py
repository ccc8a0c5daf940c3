"""Example models to try the strategy advisor on: `--model kerasdist.example_models:tiny_dense`.

Each function takes no arguments and returns a compiled Keras model, as `bench_strategies`
expects of the user's own "module:function".
"""

from __future__ import annotations

from typing import Any


def tiny_dense() -> Any:
    """A tiny dense regressor: 32 features -> 64 -> 1 (2,177 parameters)."""
    import keras

    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def mid_cnn() -> Any:
    """A mid-sized CNN classifier on 32x32x3 images, 10 classes (about 0.6M parameters)."""
    import keras

    layers = keras.layers
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        layers.Conv2D(32, 3, activation="relu", padding="same"), layers.MaxPooling2D(),
        layers.Conv2D(64, 3, activation="relu", padding="same"), layers.MaxPooling2D(),
        layers.Conv2D(128, 3, activation="relu", padding="same"), layers.MaxPooling2D(),
        layers.Flatten(), layers.Dense(256, activation="relu"), layers.Dense(10),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
