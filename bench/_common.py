"""What every benchmark writes: bench/results/NAME.json with the device and its figures.

A figure is a ratio measured side by side in one run: the median of the per-repetition
values, their spread, the target (if the issue that asked for it set one) and whether the median
meets it. bench/summarize.py turns every results file into bench/results/summary.md and a PNG.
"""

from __future__ import annotations

import json
import operator
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
TESTS = Path(__file__).resolve().parents[1] / "tests"  # kerasdist_testing: the tests' S3 server

_COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


def device_name() -> str:
    """The machine in words: GPU names when TensorFlow sees any, else the CPU."""
    cpu = f"CPU {platform.machine()}, {os.cpu_count()} cores"
    try:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        names = [tf.config.experimental.get_device_details(g).get("device_name", "GPU") for g in gpus]
    except Exception:  # the device is still worth naming without TensorFlow
        names = []
    return f"{len(names)} x {names[0]} + {cpu}" if names else f"{cpu}, no GPU"


def start_s3_test_server() -> Any:
    """The tests' S3 server (tests/kerasdist_testing, which the package does not ship), started;
    call `.stop()` when done."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from kerasdist_testing.s3_test_server import start_s3_server

    return start_s3_server()


def figure(name: str, values: Sequence[float], target: str | None, what: str, **extra: Any) -> dict:
    """One figure: median of `values` (ratios of the repetitions), spread and target check.

    `target` is like ">= 0.98" or "< 1.05"; None for figures that only inform.
    """
    if not values:
        raise ValueError(f"figure {name!r}: no values measured")
    median = statistics.median(values)
    met = None
    if target is not None:
        op, bound = target.split()
        met = bool(_COMPARE[op](median, float(bound)))
    return {"name": name, "median": round(median, 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "runs": [round(v, 4) for v in values],
            "target": target, "met": met, "what": what, **extra}


def write_result(benchmark: str, figures: list[dict], **details: Any) -> Path:
    """Write bench/results/BENCHMARK.json (figures, device, details); print it as one line."""
    result = {"benchmark": benchmark, "device": device_name(), "figures": figures, **details}
    print(json.dumps(result), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{benchmark}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path
