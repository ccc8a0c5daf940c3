"""The R-function guard: R code cannot run in TensorFlow's training step under several replicas.

Under a multi-replica strategy TensorFlow traces the training step once per replica, each on its
own thread. An R function there (a loss, a metric, a Lambda layer's function, a layer's `call`;
keras3 wraps all of these for R users) is called off R's main thread and R aborts the whole
process. Every kerasdist training path checks the model first, and so does every other
`model.fit` once kerasdist is imported (keras3's own `fit()` included: `compat.route_fit` hands
each to `training.resume.fit_with_checkpoints`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras

from kerasdist import compat


def check_step_functions(model: Any, strategy: Any = None) -> list[str]:
    """Find R functions that TensorFlow would call inside the training step; refuse them if the
    strategy has more than one replica.

    Under a multi-replica strategy TensorFlow traces the training step once per replica, each on
    its own thread. An R function used there (a loss, a metric, a Lambda layer's function, a
    layer's or the model's `call`) is then called off R's main thread and R aborts the whole
    process ("C stack usage ... is too close to the limit"). reticulate hands R functions to
    Python as functions made by `rpytools.call.make_python_function`; this looks for those,
    also inside wrappers (closures, `functools.wraps`, Keras loss and metric wrappers).

    Args:
        model: a compiled Keras model.
        strategy: the strategy training will run under; None: the active one.

    Returns:
        Where R functions were found (e.g. ["loss", "metrics[1]"]); empty if none. With one
        replica they are allowed (they run on the calling thread) and only reported.

    Raises:
        ValueError: under more than one replica, naming each place and what to use instead.
    """
    if strategy is None:
        from kerasdist.context import context_of

        strategy = context_of().strategy
    found = [where for where, value in _step_functions(model) if is_r_function(value)]
    replicas = int(strategy.num_replicas_in_sync)
    if found and replicas > 1:
        raise ValueError(
            f"{', '.join(found)} {'is an R function' if len(found) == 1 else 'are R functions'}, "
            f"and the strategy has {replicas} replicas: TensorFlow would call "
            f"{'it' if len(found) == 1 else 'them'} on its replica threads, where R cannot run "
            "(R would abort with 'C stack usage is too close to the limit'). Use a built-in Keras "
            'loss or metric by name (loss = "mse", "sparse_categorical_crossentropy", metrics = '
            'list("accuracy")), or define the function in Python, e.g. with '
            'reticulate::py_run_string("def my_loss(y_true, y_pred): ...") and pass '
            "py$my_loss (or reticulate::source_python()). R callbacks are fine."
        )
    return found


def _step_functions(model: Any) -> list[tuple[str, Any]]:
    """(where, value) for everything compile() and the layers put in the training step."""
    places: list[tuple[str, Any]] = []
    _flatten("loss", getattr(model, "loss", None), places)
    metrics, weighted_metrics = compat.compiled_metrics(model)
    _flatten("metrics", metrics, places)
    _flatten("weighted_metrics", weighted_metrics, places)
    layers = [model] + compat.layers_within(model, include_self=False)
    for layer in layers:
        name = "the model" if layer is model else f"layer {layer.name!r}"
        if isinstance(layer, keras.layers.Lambda):
            places.append((f"{name} (Lambda function)", layer.function))
        for method in ("call", "train_step", "compute_loss"):
            for klass in type(layer).__mro__:
                if klass.__module__.startswith("keras."):
                    break
                if method in vars(klass):
                    places.append((f"{name} ({method})", vars(klass)[method]))
                    break
    return places


def _flatten(where: str, value: Any, places: list[tuple[str, Any]]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(f"{where}[{key!r}]", item, places)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _flatten(f"{where}[{index}]", item, places)
    elif value is not None and not isinstance(value, str):
        places.append((where, value))


def is_r_function(value: Any, depth: int = 0) -> bool:
    """True for a function reticulate made from an R function, or a wrapper holding one."""
    if depth > 4 or value is None:
        return False
    module = getattr(value, "__module__", None) or ""
    if module.startswith("rpytools") or module == "rpycall":
        return True
    if "make_python_function" in (getattr(value, "__qualname__", None) or ""):
        return True
    inner = [getattr(value, "__wrapped__", None), getattr(value, "__func__", None)]
    if isinstance(value, (keras.losses.Loss, keras.metrics.Metric)):
        # Keras LossFunctionWrapper / MeanMetricWrapper
        inner.append(compat.wrapped_function(value))
    for cell in getattr(value, "__closure__", None) or ():
        try:
            inner.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    return any(callable(item) and is_r_function(item, depth + 1) for item in inner if item is not value)
