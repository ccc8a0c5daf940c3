"""What runs inside each timed process of `bench_strategies` (advisor): the user's model built
under the strategy, then the step fed by `make_dataset`, the step fed by one batch held in memory,
and the input alone, each timed in rounds; the result written as JSON for the parent to read.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

WARMUP_STEPS = 10
# The timed steps are split into rounds, real input and held batch alternating, medians kept,
# so a burst of load on a shared machine does not land on one of the two alone.
ROUNDS = 3
SYNTHETIC_SAMPLES = 4096


def load_model_function(spec: str) -> Callable[[], Any]:
    """The function named by "module:function" or "path/to/file.py:function"."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f'model must be "module:function" or "path/to/file.py:function", got {spec!r}.')
    where, name = spec.split(":")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise ValueError(f"model: no file {where!r} (from {spec!r}).")
        loaded = importlib.util.spec_from_file_location(Path(where).stem, where)
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(where)
        except ImportError as err:
            raise ValueError(f"model: cannot import module {where!r} (from {spec!r}): {err}") from None
        finally:
            sys.path.remove(os.getcwd())
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"model: {where!r} has no function {name!r} (from {spec!r}).")
    return function


def run_worker(spec_path: str) -> None:
    """One strategy's process (or one worker of the multi-worker group): measure, write JSON."""
    from kerasdist.strategy import select_strategy, simulate_devices

    spec = json.loads(Path(spec_path).read_text())
    if spec["simulate"]:
        simulate_devices(spec["simulate"])
    strategy = select_strategy(spec["kind"], tpu=False)
    name = f"{os.environ.get('KERASDIST_TASK_TYPE', 'local')}-{os.environ.get('KERASDIST_TASK_INDEX', '0')}"
    measure = _time_speed_options_here if spec.get("speed_options") else _time_strategy_here
    Path(spec["out"], name + ".json").write_text(json.dumps(measure(spec, strategy)))


def _time_strategy_here(spec: dict[str, Any], strategy: Any) -> dict[str, Any]:
    """The step time fed by make_dataset and by one batch held in memory, interleaved."""
    import time

    from kerasdist.data import make_dataset

    with strategy.scope():
        model = load_model_function(spec["model"])()
    _check_compiled(model)
    x, y = _load_data(spec["data"]) if spec["data"] else _synthetic_data(model, spec["seed"])
    batch, steps = spec["batch_size"], spec["steps"]
    real = make_dataset(x, y, batch_size=batch, strategy=strategy, seed=spec["seed"], repeat=True)
    one = make_dataset(x[:batch], y[:batch], batch_size=batch, strategy=strategy, shuffle=False)
    held = one.take(1).cache().repeat()

    def fit_ms(dataset, count):
        start = time.perf_counter()
        model.fit(dataset, epochs=1, steps_per_epoch=count, verbose=0)
        return 1000 * (time.perf_counter() - start) / count

    fit_ms(real, WARMUP_STEPS)
    fit_ms(held, WARMUP_STEPS)
    per_round = max(1, -(-steps // ROUNDS))
    rounds = [(fit_ms(real, per_round), fit_ms(held, per_round)) for _ in range(ROUNDS)]
    return {"step_ms": statistics.median(r[0] for r in rounds),
            "compute_ms": statistics.median(r[1] for r in rounds),
            "input_ms": _input_ms(strategy, real, steps), "parameters": int(model.count_params())}


def _time_speed_options_here(spec: dict[str, Any], strategy: Any) -> dict[str, Any]:
    """In a worker: ms a step on the real pipeline of the model plain and with each speed option
    (mixed precision: built under the policy; XLA: `jit_compile` set), interleaved in rounds."""
    import time

    from kerasdist.data import make_dataset
    from kerasdist.training.speed import TrainingSettings, precision_policy

    models = {}
    for variant in ("plain", *spec["speed_options"]):
        settings = TrainingSettings(mixed_precision=variant == "mixed_precision")
        with precision_policy(settings), strategy.scope():
            models[variant] = load_model_function(spec["model"])()
        _check_compiled(models[variant])
        if variant == "jit_compile":
            models[variant].jit_compile = True
    x, y = _load_data(spec["data"]) if spec["data"] else _synthetic_data(models["plain"], spec["seed"])
    real = make_dataset(x, y, batch_size=spec["batch_size"], strategy=strategy, seed=spec["seed"], repeat=True)

    def fit_ms(model, count):
        start = time.perf_counter()
        model.fit(real, epochs=1, steps_per_epoch=count, verbose=0)
        return 1000 * (time.perf_counter() - start) / count

    for model in models.values():
        fit_ms(model, WARMUP_STEPS)
    per_round = max(1, -(-spec["steps"] // ROUNDS))
    rounds = [{variant: fit_ms(model, per_round) for variant, model in models.items()} for _ in range(ROUNDS)]
    return {"step_ms": {variant: statistics.median(r[variant] for r in rounds) for variant in models}}


def _input_ms(strategy, dataset, steps: int) -> float:
    import time

    batches = iter(strategy.experimental_distribute_dataset(dataset))
    next(batches)
    start = time.perf_counter()
    for _ in range(steps):
        next(batches)
    return 1000 * (time.perf_counter() - start) / steps


def _check_compiled(model: Any) -> None:
    if not getattr(model, "compiled", False):
        raise ValueError("model: the function must return a compiled Keras model (call compile() in it).")


def _synthetic_data(model: Any, seed: int) -> tuple[Any, Any]:
    """Random inputs shaped like the model's input, targets like its output and loss."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ValueError("model: random data is made for one input and one output; pass x and y.")
    x = rng.normal(size=(SYNTHETIC_SAMPLES, *model.inputs[0].shape[1:])).astype("float32")
    return x, _synthetic_targets(model, rng)


def _synthetic_targets(model: Any, rng: Any) -> Any:
    """Class indices for a sparse loss, one-hot (or 0/1) for crossentropy, else normal values."""
    import numpy as np

    shape = (SYNTHETIC_SAMPLES, *model.outputs[0].shape[1:])
    classes = shape[-1]
    loss = str(getattr(model.loss, "name", model.loss) or "").lower()
    if "sparse" in loss:
        return rng.integers(0, classes, size=shape[:-1])
    if "crossentropy" in loss and classes > 1:
        return np.eye(classes, dtype="float32")[rng.integers(0, classes, SYNTHETIC_SAMPLES)]
    if "crossentropy" in loss:
        return rng.integers(0, 2, size=shape).astype("float32")
    return rng.normal(size=shape).astype("float32")


def _load_data(path: str) -> tuple[Any, Any]:
    import numpy as np

    with np.load(path) as data:
        return data["x"], data["y"]
