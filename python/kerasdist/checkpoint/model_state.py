"""Model state that `model.save` / `load_weights` miss or that needs checking before a load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np

from kerasdist import compat


def optimizer_step(model: Any) -> int:
    """Training steps (batches) the model's optimizer has taken (0 without an optimizer).

    Under gradient accumulation Keras's `optimizer.iterations` counts applied updates
    (batches // k): it stays put for k batches, so `every_steps` and the checkpoint names
    (`ckpt-<step>`) built on it would fire and collide k times in a row. The optimizer's own
    batch counter (`compat.optimizer_batch_counter`, what `iterations` divides) moves every batch;
    without accumulation the two are equal.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return 0
    optimizer = getattr(optimizer, "inner_optimizer", None) or optimizer  # LossScaleOptimizer
    return int(compat.optimizer_batch_counter(optimizer).numpy())


def _seed_generators(model: Any) -> list[Any]:
    """Keras SeedGenerators (Dropout and friends), in a stable order."""
    found = []
    for layer in compat.layers_within(model):
        for name in sorted(vars(layer)):
            value = getattr(layer, name, None)
            if isinstance(value, keras.random.SeedGenerator):
                found.append(value)
    return found


def seed_states(model: Any) -> list[np.ndarray]:
    return [np.asarray(generator.state.numpy()) for generator in _seed_generators(model)]


def restore_seed_states(model: Any, path: Path, checkpoint: str | None = None) -> None:
    """Load the seed-generator states of `path` (an `rng.npz`) into the model; `checkpoint` names
    the checkpoint in messages (default: the file's directory)."""
    generators = _seed_generators(model)
    with np.load(path) as saved:
        states = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    if len(states) != len(generators):
        raise ValueError(
            f"The checkpoint {checkpoint or path.parent} has {len(states)} random-generator states, the model "
            f"has {len(generators)}: it was saved from a different architecture."
        )
    for generator, state in zip(generators, states, strict=True):
        generator.state.assign(state)


def signature(model: Any) -> list[list[Any]]:
    """Shape and dtype of every weight: what must match for a checkpoint to load."""
    return [[list(map(int, w.shape)), str(w.dtype)] for w in model.weights]


def check_signature(model: Any, saved: list[list[Any]], path: str | Path) -> None:
    current = signature(model)
    if len(current) != len(saved):
        raise ValueError(
            f"The checkpoint {path} does not match the model build_fn returned: it has "
            f"{len(saved)} weights, the model has {len(current)}."
        )
    for index, (now, then) in enumerate(zip(current, saved, strict=True)):
        if now != then:
            raise ValueError(
                f"The checkpoint {path} does not match the model build_fn returned: weight "
                f"{index} ({model.weights[index].path}) is {now[0]} {now[1]} in the model but "
                f"{then[0]} {then[1]} in the checkpoint."
            )


def plain(value: Any) -> Any:
    """Logs as JSON-safe floats."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
