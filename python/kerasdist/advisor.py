"""`bench_strategies`: time the user's model under each strategy this machine can run, and say
which to use and why.

Each strategy runs in a fresh process (devices can be split, and a cluster joined, only before
TensorFlow starts): "default" in one process, "mirrored" over the GPUs or over CPU devices split
by `simulate_devices`, "multi_worker" as worker processes on 127.0.0.1 started by the launcher.
Every process trains the same model at the same global batch and times three things:

- the step: `fit` on the real input pipeline (`make_dataset`), after a traced warm-up;
- the compute: the same `fit` fed one batch held in memory, so no input work is left;
- the input alone: the distributed pipeline iterated without training.

The gap between the step and the compute is the time a step waits for its input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# The example models lived here once: "kerasdist.advisor:tiny_dense" still names them.
from kerasdist.advisor_worker import load_model_function
from kerasdist.example_models import mid_cnn, tiny_dense  # noqa: F401
from kerasdist.validation import boolean, integer

STRATEGIES = ("default", "mirrored", "multi_worker")
# Within this fraction of the fastest, the simpler strategy is recommended.
TIE = 0.05
SPEED_OPTIONS = ("mixed_precision", "jit_compile")
ONE_GPU = ("not run: one GPU, nothing to mirror across (default already runs on it; simulated "
           "CPU devices would leave the GPU out)")


@dataclass(frozen=True)
class StrategyTiming:
    """How one strategy did. Times are milliseconds per step; None where the run failed."""

    strategy: str
    replicas: int
    devices: str
    steps_per_second: float | None = None
    examples_per_second: float | None = None
    step_ms: float | None = None
    compute_ms: float | None = None
    input_wait_ms: float | None = None
    input_only_ms: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class SpeedOptionTiming:
    """One speed option timed under the recommended strategy, in one process that times the
    model plain and with each option in turn: `speedup` is its steps/s over the plain model's in
    that process (above 1 + TIE it helps); None where the run failed."""

    option: str
    strategy: str
    steps_per_second: float | None = None
    step_ms: float | None = None
    speedup: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class StrategyBenchmark:
    """What `bench_strategies` measured, and its advice."""

    model: str
    parameters: int
    global_batch_size: int
    steps: int
    device: str
    timings: tuple[StrategyTiming, ...]
    recommendation: str | None
    reason: str
    speed_options: tuple[SpeedOptionTiming, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        header = (f"Strategy advisor: {self.model} ({self.parameters:,} parameters), global batch "
                  f"{self.global_batch_size}, {self.steps} timed steps\ndevice: {self.device}")
        lines = [header, _table(self.timings)]
        advice = f"Recommendation: {self.recommendation}. " if self.recommendation else ""
        lines.append(advice + self.reason)
        return "\n".join(lines)


def bench_strategies(
    model: str,
    x: Any = None,
    y: Any = None,
    *,
    strategies: Sequence[str] | None = None,
    steps: int = 200,
    batch_size: int = 64,
    devices: int = 2,
    workers: int = 2,
    seed: int = 0,
    timeout: float = 600,
    verbose: bool = True,
    speed_options: bool = False,
) -> StrategyBenchmark:
    """Train a few hundred steps of your model under each strategy; recommend one, with the reason.

    ```python
    report = kerasdist.bench_strategies("my_models:build_cnn", x, y, batch_size=128)
    print(report)                # throughput, step time split, recommendation and why
    report.recommendation        # e.g. "default"
    ```

    Args:
        model: where the model comes from, as "module:function" (an importable module) or
            "path/to/file.py:function"; the function takes no arguments and returns a compiled
            Keras model. It is called in each strategy's process, inside the strategy's scope.
        x: training data (arrays, anything `make_dataset` takes in memory); None (and `y`
            None): random data shaped for the model's input and output.
        y: training targets, as `x`.
        strategies: which to time; default all of "default", "mirrored" (over the GPUs, or
            `devices` simulated CPU devices when there are none; not run with one GPU),
            "multi_worker" (`workers` processes on 127.0.0.1, through the launcher).
        steps: timed training steps per strategy (after a warm-up of 10).
        batch_size: the global batch size, the same under every strategy.
        devices: CPU devices to simulate for "mirrored" on a machine without GPUs.
        workers: worker processes for "multi_worker".
        seed: seed of the data and the shuffle.
        timeout: seconds allowed for each strategy's run.
        verbose: print a line as each strategy starts and ends.
        speed_options: also time the recommended strategy with `mixed_precision=True` (the model
            built under `mixed_float16` on a GPU, `mixed_bfloat16` on a CPU) and with
            `jit_compile=True` (XLA), in one more process of that strategy that times the model
            plain and with each option, interleaved round by round (each speedup compares runs
            of the same moment), and say in `reason` whether either helps (more than 5% faster)
            and so is worth passing to `distributed_fit` or `custom_fit`. Off by default: one
            more process.

    Returns:
        A `StrategyBenchmark`: `timings` (one `StrategyTiming` per strategy), `recommendation`
        (the strategy to use) and `reason`, and with `speed_options` the `speed_options` timings
        (one `SpeedOptionTiming` each); `print()` shows it as a table.

    Raises:
        ValueError: a bad argument, or a model spec that does not name a function, before any
            process starts.
    """
    strategies = _check_strategies(strategies)
    for name, value, minimum in (("steps", steps, 1), ("batch_size", batch_size, 1),
                                 ("devices", devices, 2), ("workers", workers, 2)):
        integer(name, value, minimum)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}.")
    boolean("speed_options", speed_options)
    load_model_function(model)
    with tempfile.TemporaryDirectory(prefix="kerasdist-bench-") as work:
        spec = {"model": _absolute_spec(model), "steps": steps, "batch_size": batch_size,
                "seed": seed, "data": _save_data(x, y, work)}
        gpus = _count_gpus()
        layouts = {kind: _layout(kind, gpus, devices, workers) for kind in strategies}
        parameters, timings = 0, []
        for kind in strategies:
            if verbose:
                print(f"bench_strategies: timing {kind} ...", flush=True)
            timing, params = _run_strategy(kind, layouts[kind], spec, work, gpus, workers, timeout)
            parameters = parameters or params
            timings.append(timing)
            if verbose:
                print(f"bench_strategies: {kind}: {_one_line(timing)}", flush=True)
        recommendation, reason = recommend(timings, gpus)
        options: tuple[SpeedOptionTiming, ...] = ()
        if speed_options and recommendation is not None:
            best = next(t for t in timings if t.strategy == recommendation)
            simulate = layouts[recommendation][2]
            options = _time_speed_options(best, spec, work, simulate, workers, timeout, verbose)
            reason = f"{reason} {speed_note(best, options)}"
    return StrategyBenchmark(model, parameters, batch_size, steps, _device_name(gpus),
                             tuple(timings), recommendation, reason, options)


def _time_speed_options(best, spec, work, simulate, workers, timeout, verbose) -> tuple[SpeedOptionTiming, ...]:
    """One more process of the recommended strategy timing the model plain and with each speed
    option, interleaved round by round, so that each speedup compares runs of the same moment."""
    if verbose:
        print(f"bench_strategies: timing {best.strategy} with {' and '.join(SPEED_OPTIONS)} ...", flush=True)
    spec = {**spec, "speed_options": list(SPEED_OPTIONS)}
    results, failure = _run_processes(best.strategy, spec, f"{best.strategy}-speed", work, simulate, workers,
                                      timeout)
    if failure:
        return tuple(SpeedOptionTiming(option, best.strategy, error=failure) for option in SPEED_OPTIONS)
    slowest = {name: max(r["step_ms"][name] for r in results) for name in ("plain", *SPEED_OPTIONS)}
    return tuple(
        SpeedOptionTiming(option, best.strategy, round(1000 / slowest[option], 2), round(slowest[option], 3),
                          round(slowest["plain"] / slowest[option], 3))
        for option in SPEED_OPTIONS
    )


def speed_note(best: StrategyTiming, options: Sequence[SpeedOptionTiming]) -> str:
    """What the speed options did under the recommended strategy, and which to pass."""
    parts, helps = [], []
    for t in options:
        name = f"{t.option} ({_policy_name(best)})" if t.option == "mixed_precision" else t.option
        if t.error:
            parts.append(f"{name} failed ({t.error})")
        elif t.speedup >= 1 + TIE:
            parts.append(f"{name} {t.speedup:.2f}x: helps")
            helps.append(f"{t.option}=True")
        else:
            parts.append(f"{name} {t.speedup:.2f}x: does not help here")
    advice = (f"pass {' and '.join(helps)} to distributed_fit or custom_fit" if helps
              else "train without them")
    return f"Speed options under {best.strategy}: {'; '.join(parts)}; {advice}."


def _policy_name(best: StrategyTiming) -> str:
    return "mixed_float16" if "GPU" in best.devices else "mixed_bfloat16"


def recommend(timings: Sequence[StrategyTiming], gpus: int = 0) -> tuple[str | None, str]:
    """The strategy to use and why, from the measured timings."""
    ran = [t for t in timings if t.steps_per_second]
    if not ran:
        return None, "No strategy ran: " + "; ".join(f"{t.strategy}: {t.error}" for t in timings)
    fastest = max(ran, key=lambda t: t.steps_per_second)
    simplest = next(t for t in ran if t.steps_per_second >= (1 - TIE) * fastest.steps_per_second)
    best = simplest
    reasons = [_why_not(t, best, gpus) for t in ran if t is not best]
    if best is not fastest:
        reasons.insert(0, f"{fastest.strategy} is only {_speedup(fastest, best)} of {best.strategy}, "
                          f"within {TIE:.0%}: not worth the extra moving parts")
    elif best.strategy != "default" and len(ran) > 1:
        reasons.insert(0, f"{best.strategy} is the fastest ({_compute_story(best, ran)})")
    reasons.append(_input_note(best))
    return best.strategy, ". ".join(r for r in reasons if r) + "."


def _why_not(slower: StrategyTiming, best: StrategyTiming, gpus: int) -> str:
    ratio = slower.steps_per_second / best.steps_per_second
    extra = f"{slower.step_ms - best.step_ms:.1f} ms more a step"
    if slower.strategy == "mirrored" and gpus < 2:
        cause = (f"its {slower.replicas} replicas are simulated on the same CPU cores, so they add no "
                 f"compute, and keeping them in sync costs {extra}")
        if best.step_ms < 20:
            cause += (f" than a {best.step_ms:.1f} ms step: the model is too small for the "
                      "all-reduce to pay off")
    elif slower.strategy == "multi_worker":
        cause = (f"{slower.replicas} worker processes on one machine share its cores and add a gRPC "
                 f"all-reduce of the gradients every step ({extra}); it pays off with one "
                 "worker per machine or accelerator")
    else:
        cause = f"computing and synchronising its replicas costs {extra}"
    return f"{slower.strategy} is slower here ({ratio:.2f}x {best.strategy}): {cause}"


def _compute_story(best: StrategyTiming, ran: Sequence[StrategyTiming]) -> str:
    default = next((t for t in ran if t.strategy == "default"), None)
    if default is None:
        return f"{best.steps_per_second:.1f} steps/s"
    return (f"{_speedup(best, default)} of default: spreading the {default.compute_ms:.1f} ms of compute "
            f"over {best.replicas} replicas saves more than synchronising them costs")


def _input_note(timing: StrategyTiming) -> str:
    if not timing.step_ms or not timing.input_wait_ms:
        return ""
    share = timing.input_wait_ms / timing.step_ms
    if share < 0.2:
        return ""
    where = (f"Under {timing.strategy} about {share:.0%} of each step ({timing.input_wait_ms:.1f} ms) "
             "goes to its input")
    if timing.input_only_ms >= 0.8 * timing.input_wait_ms:
        return (f"{where}, and the pipeline alone needs {timing.input_only_ms:.1f} ms a batch: it is the "
                "bottleneck; cache the dataset, map in parallel or read faster storage")
    return (f"{where}, though the pipeline alone makes a batch in {timing.input_only_ms:.1f} ms: the cost "
            "is handing each batch to the step, which a larger batch spreads over more examples"
            + _steps_per_execution_note(timing))


def _steps_per_execution_note(timing: StrategyTiming) -> str:
    """When the hand-off dominates: several steps per call pay it once per call (one replica only:
    Keras 3.15's multi-step loop fails under several, keras-team/keras#19246)."""
    if timing.replicas > 1:
        return ""
    return ("; or run several steps per call into the graph: distributed_fit(steps_per_execution='auto') "
            "(compile(steps_per_execution=N) for your own fit)")


def _speedup(a: StrategyTiming, b: StrategyTiming) -> str:
    return f"{a.steps_per_second / b.steps_per_second:.2f}x"


# --- running each strategy in its own process (what runs inside it: advisor_worker) ---------

def _run_strategy(kind, layout, spec, work, gpus, workers, timeout) -> tuple[StrategyTiming, int]:
    replicas, described, simulate = layout
    if kind == "mirrored" and gpus == 1:
        return StrategyTiming(kind, 1, described, error=ONE_GPU), 0
    results, failure = _run_processes(kind, spec, kind, work, simulate, workers, timeout)
    if failure:
        return StrategyTiming(kind, replicas, described, error=failure), 0
    slowest = max(results, key=lambda r: r["step_ms"])  # synchronous: the group goes at its slowest
    return _timing(kind, replicas, described, slowest, spec["batch_size"]), slowest["parameters"]


def _run_processes(kind, spec, tag, work, simulate, workers, timeout) -> tuple[list[dict], str | None]:
    """Run `kind`'s process (or processes) on `spec`, splitting the CPU into `simulate` devices
    when that is not 0: (the results each wrote, why it failed)."""
    spec = {**spec, "kind": kind, "simulate": simulate, "out": os.path.join(work, tag)}
    os.makedirs(spec["out"], exist_ok=True)
    spec_path = os.path.join(work, f"{tag}.json")
    Path(spec_path).write_text(json.dumps(spec))
    worker = [sys.executable, "-m", "kerasdist", "bench", "--worker-spec", spec_path]
    if kind == "multi_worker":
        command = [sys.executable, "-m", "kerasdist", "launch", "-n", str(workers), "--timeout",
                   str(timeout), "--startup-timeout", "120", "--", *worker]
    else:
        command = worker
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    if kind != "multi_worker":
        env.pop("TF_CONFIG", None)
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout + 30)
        failure = None if done.returncode == 0 else _last_lines(done.stdout + done.stderr)
    except subprocess.TimeoutExpired:
        failure = f"did not finish within {timeout} s"
    results = [json.loads(p.read_text()) for p in sorted(Path(spec["out"]).glob("*.json"))]
    return results, failure or (None if results else "no result written")


def _layout(kind: str, gpus: int, devices: int, workers: int) -> tuple[int, str, int]:
    """(replicas, the devices in words, CPU devices to simulate) for one strategy."""
    if kind == "default":
        return 1, "1 GPU" if gpus else "CPU", 0
    if kind == "mirrored":
        if gpus:
            return gpus, f"{gpus} GPU" + ("s" if gpus > 1 else ""), 0
        return devices, f"{devices} simulated CPU devices", devices
    each = "GPU" if gpus else "CPU"
    return workers, f"{workers} processes (127.0.0.1), {each} each", 0


def _timing(kind, replicas, described, result, batch_size) -> StrategyTiming:
    step, compute = result["step_ms"], result["compute_ms"]
    return StrategyTiming(
        kind, replicas, described,
        steps_per_second=round(1000 / step, 2), examples_per_second=round(1000 * batch_size / step, 1),
        step_ms=round(step, 3), compute_ms=round(compute, 3),
        input_wait_ms=round(max(0.0, step - compute), 3), input_only_ms=round(result["input_ms"], 3),
    )


def _save_data(x: Any, y: Any, work: str) -> str | None:
    if x is None and y is None:
        return None
    if x is None or y is None:
        raise ValueError("x and y: give both (training data) or neither (random data).")
    import numpy as np

    x, y = np.asarray(x), np.asarray(y)
    if x.ndim == 0 or len(x) != len(y):
        raise ValueError("x and y must have the same number of samples (first axis), "
                         f"got {x.shape} and {y.shape}.")
    path = os.path.join(work, "data.npz")
    np.savez(path, x=x, y=y)
    return path


# --- arguments and output ---------------------------------------------------------------------

def _check_strategies(strategies: Sequence[str] | None) -> tuple[str, ...]:
    if strategies is None:
        return STRATEGIES
    if isinstance(strategies, str):
        strategies = [strategies]
    chosen = tuple(strategies)
    unknown = [s for s in chosen if s not in STRATEGIES]
    if not chosen or unknown or len(set(chosen)) != len(chosen):
        raise ValueError(f"strategies must be distinct names among {', '.join(STRATEGIES)}, "
                         f"got {list(chosen)}.")
    return chosen


def _absolute_spec(spec: str) -> str:
    where, name = spec.split(":")
    if where.endswith(".py"):
        return f"{os.path.abspath(where)}:{name}"
    return spec


def _count_gpus() -> int:
    from kerasdist.strategy import local_gpus

    return len(local_gpus())


def _device_name(gpus: int) -> str:
    import platform

    cpu = f"CPU {platform.machine()}, {os.cpu_count()} cores"
    return f"{gpus} GPU(s) + {cpu}" if gpus else f"{cpu}, no GPU"


def _last_lines(text: str, count: int = 5) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-count:]) or "failed without output"


def _one_line(t: StrategyTiming) -> str:
    if t.error:
        return f"failed: {t.error}"
    return f"{t.steps_per_second:.1f} steps/s ({t.step_ms:.1f} ms a step, {t.compute_ms:.1f} ms compute)"


def _table(timings: Sequence[StrategyTiming]) -> str:
    head = ("strategy", "replicas", "devices", "steps/s", "examples/s", "step ms", "compute ms",
            "input wait ms", "input alone ms")
    rows = [head]
    for t in timings:
        if t.error:
            rows.append((t.strategy, str(t.replicas), t.devices, "failed", "", "", "", "", ""))
            continue
        rows.append((t.strategy, str(t.replicas), t.devices, f"{t.steps_per_second:.1f}",
                     f"{t.examples_per_second:.0f}", f"{t.step_ms:.2f}", f"{t.compute_ms:.2f}",
                     f"{t.input_wait_ms:.2f}", f"{t.input_only_ms:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    errors = [f"{t.strategy} failed: {t.error}" for t in timings if t.error]
    return "\n".join(text + errors)
