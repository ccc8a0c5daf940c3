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
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import keras

from kerasdist.validation import boolean, integer, optional_integer


@dataclass(frozen=True)
class TrainingSettings:
    """The speed options of one run, each checked when the record is made (naming it).
    `record()` is what its checkpoints record (all but `steps_per_execution`).

    Args:
        mixed_precision: train under `mixed_float16` (GPU) or `mixed_bfloat16` (CPU, TPU); the
            model must be built under it (pass a build function). Recorded in every
            checkpoint, as the next two: a resumed run with other values is refused, naming the
            setting.
        jit_compile: compile the per-replica step with XLA.
        gradient_accumulation_steps: apply the optimizer once every this many batches, their
            gradients averaged (Keras 3 optimizers accumulate them); None or 1: every batch.
        steps_per_execution: training steps per call into the graph (Keras's `compile` option;
            callbacks' batch hooks then run once per call). An integer must divide the steps of
            an epoch, and `every_steps` must be a multiple of it; above 1 it needs a strategy of
            one replica (Keras 3.15's multi-step loop fails under several: keras-team/keras#19246).
            "auto" (default): the model's own compiled value if above 1; else 1 when a callback
            has batch hooks, under several replicas and parameter servers; else a divisor of the
            epoch's steps (and of `every_steps`) that makes one call last about 50 ms of estimated
            compute (from the model's size and the batch), which hides the per-call hand-off of
            small models. Not recorded: a resumed run may use another value and still continues
            exactly.
    """

    mixed_precision: bool = False
    jit_compile: bool = False
    gradient_accumulation_steps: int | None = None
    steps_per_execution: int | str = "auto"

    def __post_init__(self) -> None:
        boolean("mixed_precision", self.mixed_precision)
        boolean("jit_compile", self.jit_compile)
        steps = optional_integer("gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        object.__setattr__(self, "gradient_accumulation_steps", None if steps in (None, 1) else steps)
        object.__setattr__(self, "steps_per_execution", check_steps_per_execution(self.steps_per_execution))

    def record(self) -> dict[str, Any]:
        """The settings a checkpoint records and a resumed run must match."""
        return {name: getattr(self, name) for name in RECORDED_SETTINGS}


RECORDED_SETTINGS = ("mixed_precision", "jit_compile", "gradient_accumulation_steps")


def check_resumed_settings(recorded: dict[str, Any] | None, settings: TrainingSettings, path: Any) -> None:
    """Refuse to resume a checkpoint written with other settings (old checkpoints carry none)."""
    name = _differing_setting(recorded, settings)
    if name is not None:
        raise ValueError(
            f"{name}={settings.record()[name]!r} differs from the checkpoint {path}, which was trained with "
            f"{name}={recorded[name]!r}: resume with the same setting, or start a new checkpoint_dir."
        )


def check_resumed_settings_of(manager: Any, settings: TrainingSettings) -> None:
    """`check_resumed_settings` against the checkpoint a restore from a manager's directory would
    load, read without creating it: the records only, unless one differs
    (`CheckpointManager.refused_restore`)."""
    refused = manager.refused_restore(lambda info: _differing_setting(info.settings, settings) is None)
    if refused is not None:
        check_resumed_settings(refused.settings, settings, refused.path)


def _differing_setting(recorded: dict[str, Any] | None, settings: TrainingSettings) -> str | None:
    """The first setting a checkpoint recorded with another value than the run's, or None."""
    return next((name for name, now in settings.record().items()
                 if recorded and name in recorded and recorded[name] != now), None)


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


# ---------------------------------------------------------------------------------------------
# steps_per_execution: several training steps per call into the graph.
#
# Keras runs `steps_per_execution` steps per call of its train function and calls the batch
# callbacks once per call. It always runs whole executions: on a stream of epochs (what
# resume_fit feeds) an epoch whose steps it does not divide would run into the next epoch. So a
# value must divide the steps of an epoch, and `every_steps` (checkpoints are written at
# execution ends) must be a multiple of it. It changes no checkpoint: a run resumed with another
# value continues exactly (the rest of an interrupted epoch runs with a value that divides it).

# "auto": an execution should take at least _EXECUTION_S of estimated compute, so the per-call
# hand-off stays small beside it (figures: bench/README.md, "Input pipeline").
# The estimate counts 6 flops per parameter and sample (dense layers); a convolution does more per
# parameter, so its calls last longer than estimated, which only delays a SIGTERM save a little.
_EXECUTION_S = 0.05
_FLOPS = 1e10  # a conservative guess at a CPU's throughput; faster devices only raise the choice
_MAX_STEPS_PER_EXECUTION = 1000


def check_steps_per_execution(value: Any, steps_per_epoch: int | None = None,
                              every_steps: int | None = None, replicas: int = 1) -> int | str:
    """'auto' or an integer >= 1 (the message names the argument); an integer above 1 is also
    checked against the replicas (`multi_replica_refusal`), the epoch's steps and `every_steps`
    (`fits_epoch`) when they are given."""
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f"steps_per_execution must be 'auto' or an integer >= 1, got {value!r}.")
        return value
    value = integer("steps_per_execution", value, 1, hint="or 'auto'")
    if value > 1 and replicas > 1:
        raise ValueError(multi_replica_refusal(value, replicas))
    if steps_per_epoch is not None:
        fits_epoch(value, steps_per_epoch, every_steps)
    return value


def multi_replica_refusal(value: int, replicas: int) -> str:
    return (
        f"steps_per_execution={value} needs a strategy with one replica, this one has {replicas}: Keras "
        f"{keras.__version__}'s multi-step loop fails under several replicas (\"You must feed a value for "
        "placeholder tensor\", keras-team/keras#19246). Use 1 or 'auto' (which is 1 there)."
    )


def fits_epoch(steps_per_execution: int, steps_per_epoch: int, every_steps: int | None) -> None:
    """Refuse a value that does not divide the epoch or does not divide `every_steps`."""
    n = steps_per_execution
    if steps_per_epoch % n:
        divisors = _divisors(steps_per_epoch)
        raise ValueError(
            f"steps_per_execution={n} does not divide the {steps_per_epoch} steps of an epoch: Keras runs "
            f"whole executions, so an epoch's last one would take batches of the next epoch. Use one of "
            f"{', '.join(map(str, divisors[:12]))}{' ...' if len(divisors) > 12 else ''}, or 'auto'."
        )
    if every_steps is not None and every_steps % n:
        raise ValueError(
            f"every_steps={every_steps} is not a multiple of steps_per_execution={n}: checkpoints are "
            "written at the end of an execution. Use a multiple, or steps_per_execution='auto'."
        )


def choose_steps_per_execution(value: int | str, model: Any, context: Any, steps_per_epoch: int,
                               batch_size: int, every_steps: int | None = None,
                               callbacks: Any = ()) -> tuple[int, str]:
    """The steps per execution a run uses, and why. An integer is checked (`fits_epoch`); 'auto'
    keeps a model compiled with a value of its own (checked too), and is otherwise 1 where more
    would change what callbacks see, where fit does not run steps itself (parameter servers) or
    cannot run several (several replicas); else the divisor of the epoch (and of every_steps)
    nearest above the steps that make an execution last `_EXECUTION_S`, from the model's size and
    the batch (at most 4 times that; below it when no divisor is that close)."""
    own = model_steps_per_execution(model)
    if value == "auto" and own > 1:
        value = own
    if context.is_parameter_server:
        if value != "auto" and value > 1:
            raise ValueError(
                f"steps_per_execution={value} is not supported under a parameter-server strategy: its "
                "coordinator schedules one step at a time on the workers."
            )
        return 1, "parameter servers schedule single steps"
    if value != "auto":
        check_steps_per_execution(value, steps_per_epoch, every_steps, context.num_replicas)
        return int(value), "given"
    if context.num_replicas > 1:
        return 1, "Keras cannot run several steps per call under several replicas (keras-team/keras#19246)"
    batch_hooks = [type(c).__name__ for c in callbacks or () if _has_batch_hooks(c)]
    if batch_hooks:
        return 1, f"{', '.join(batch_hooks)} has batch hooks; 'auto' keeps them called every step"
    step_s = 6.0 * max(model.count_params(), 1) * batch_size / _FLOPS
    wanted = min(max(1, math.ceil(_EXECUTION_S / step_s)), _MAX_STEPS_PER_EXECUTION)
    divisors = _divisors(math.gcd(steps_per_epoch, every_steps) if every_steps else steps_per_epoch)
    above = [d for d in divisors if wanted <= d <= 4 * wanted]
    chosen = above[0] if above else max(d for d in divisors if d <= wanted)
    return chosen, f"about {wanted} steps make an execution of {_EXECUTION_S * 1000:.0f} ms (estimated)"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _has_batch_hooks(callback: Any) -> bool:
    """Whether a callback does something per batch (its class overrides a batch hook, or it was
    given one, as `LambdaCallback(on_train_batch_end=...)` is)."""
    base = keras.callbacks.Callback
    hooks = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")
    return any(getattr(getattr(callback, hook, None), "__func__", None) is not getattr(base, hook) for hook in hooks)


def model_steps_per_execution(model: Any) -> int:
    """The steps per execution a model was compiled with (1 if none)."""
    return int(getattr(model, "steps_per_execution", 1) or 1)


def set_steps_per_execution(model: Any, steps_per_execution: int) -> None:
    """Give a compiled model another value (Keras reads it when it traces its train function,
    which is then traced again)."""
    if model_steps_per_execution(model) != steps_per_execution:
        model.steps_per_execution = steps_per_execution
        model.train_function = model.test_function = model.predict_function = None
