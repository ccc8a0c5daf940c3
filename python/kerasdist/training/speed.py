"""Speed options of `distributed_fit` and `custom_fit`: mixed precision, XLA, gradient accumulation.

Each option changes what a checkpoint means (the dtype of the computation, the optimizer's
accumulators and step counting), so the settings a run trains with are written into every
checkpoint's record (`settings`) and a resumed run whose settings differ is refused, naming the
setting, before anything is trained or written. Checkpoints written before settings were
recorded carry none and resume with any.

- `mixed_precision=True`: Keras's `mixed_float16` policy where TensorFlow sees a GPU, else
  `mixed_bfloat16` (CPU, TPU). The model is built under the policy (so `model` must be a build
  function, or already built under that policy); Keras's `compile` then wraps the optimizer in a
  `LossScaleOptimizer` for float16, and the training steps scale the loss through
  `optimizer.scale_loss`. The global policy is restored afterwards.
- `jit_compile=True`: XLA for the per-replica step. Refused under a parameter-server strategy
  (Keras 3 cannot fit there and its coordinator schedules functions it compiles itself).
- `gradient_accumulation_steps=N` (N >= 2): Keras 3 optimizers average the gradients of N
  steps and apply them once; `optimizer.iterations` then counts applied updates, while
  `every_steps` and the checkpoints' `global_step` count batches (`model_state.optimizer_step`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import keras

from kerasdist.validation import boolean, optional_integer


@dataclass(frozen=True)
class TrainingSettings:
    """The speed options of one run, as recorded in its checkpoints."""

    mixed_precision: bool = False
    jit_compile: bool = False
    gradient_accumulation_steps: int | None = None

    def record(self) -> dict[str, Any]:
        return asdict(self)


def training_settings(mixed_precision: Any = False, jit_compile: Any = False,
                      gradient_accumulation_steps: Any = None) -> TrainingSettings:
    """Check the speed options (naming the argument and the value received) and bundle them."""
    boolean("mixed_precision", mixed_precision)
    boolean("jit_compile", jit_compile)
    steps = optional_integer("gradient_accumulation_steps", gradient_accumulation_steps, 1)
    return TrainingSettings(mixed_precision, jit_compile, None if steps in (None, 1) else int(steps))


def check_resumed_settings(recorded: dict[str, Any] | None, settings: TrainingSettings, path: Any) -> None:
    """Refuse to resume a checkpoint written with other settings (old checkpoints carry none)."""
    for name, now in settings.record().items():
        if recorded and name in recorded and recorded[name] != now:
            raise ValueError(
                f"{name}={now!r} differs from the checkpoint {path}, which was trained with "
                f"{name}={recorded[name]!r}: resume with the same setting, or start a new checkpoint_dir."
            )


def check_resumed_settings_of(manager: Any, settings: TrainingSettings) -> None:
    """`check_resumed_settings` against the newest checkpoint of a manager's directory, read
    without creating it."""
    latest = manager.latest()
    if latest is not None:
        check_resumed_settings(latest.settings, settings, latest.path)


def precision_policy_name() -> str:
    """`mixed_float16` where TensorFlow sees a GPU, `mixed_bfloat16` on CPU and TPU."""
    import tensorflow as tf

    return "mixed_float16" if tf.config.list_logical_devices("GPU") else "mixed_bfloat16"


@contextlib.contextmanager
def precision_policy(settings: TrainingSettings) -> Iterator[None]:
    """Keras's global dtype policy set for the run (mixed precision on), restored afterwards."""
    if not settings.mixed_precision:
        yield
        return
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision_policy_name())
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def check_model_precision(model: Any, settings: TrainingSettings) -> None:
    """A model given already built must have been built under the run's policy."""
    name = getattr(getattr(model, "dtype_policy", None), "name", "float32")
    mixed = name.startswith("mixed_")
    if settings.mixed_precision and name != precision_policy_name():
        raise ValueError(
            f"mixed_precision=True but the model was built with the {name!r} dtype policy: pass a "
            f"build function as model (it is then built under {precision_policy_name()!r}), or build "
            "it yourself under that policy."
        )
    if not settings.mixed_precision and mixed:
        raise ValueError(f"the model was built with the {name!r} dtype policy: pass mixed_precision=True.")


def apply_to_optimizer(optimizer: Any, settings: TrainingSettings) -> None:
    """Give an optimizer that is not built yet the run's gradient accumulation; refuse a built
    one that differs (its accumulator variables exist or not already)."""
    if optimizer is None:
        return
    inner = getattr(optimizer, "inner_optimizer", None)  # LossScaleOptimizer
    target = inner if inner is not None else optimizer
    wanted = settings.gradient_accumulation_steps
    if (target.gradient_accumulation_steps or None) == wanted:
        return
    if target.built:
        raise ValueError(
            f"gradient_accumulation_steps={wanted!r}, but the model's optimizer is already built with "
            f"gradient_accumulation_steps={target.gradient_accumulation_steps!r}: pass a build function "
            "as model, or make the optimizer with that setting."
        )
    target.gradient_accumulation_steps = wanted
    if target is not optimizer:
        optimizer.gradient_accumulation_steps = wanted


def check_jit(settings: TrainingSettings, context: Any) -> None:
    if settings.jit_compile and context.is_parameter_server:
        raise ValueError(
            "jit_compile=True is not supported under a parameter-server strategy: its "
            "coordinator schedules the step functions on the workers itself."
        )


def with_build_settings(build_fn: Any, settings: TrainingSettings) -> Any:
    """`build_fn` that also gives the built model's optimizer the run's settings."""

    def build() -> Any:
        model = build_fn()
        apply_to_optimizer(getattr(model, "optimizer", None), settings)
        return model

    return build
