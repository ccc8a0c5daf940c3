"""The strategy advisor on two models: a tiny dense regressor and a mid-sized CNN.

Runs `kerasdist.bench_strategies` (default, mirrored on simulated CPU devices or the GPUs,
2 multi-worker processes through the launcher) for each model at the same global batch, and
records each strategy's throughput relative to default as informational figures (one value per
model and strategy: the advisor times each strategy in 3 rounds and keeps the median) and the
advisor's full report. Prints one JSON line and writes bench/results/advisor.json.

usage: python bench/bench_advisor.py [--steps N (both models; default 200 dense, 60 CNN)] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import kerasdist  # noqa: E402
from _common import figure, write_result  # noqa: E402

# name: (model, timed steps); the CNN's steps take about 30x longer on a CPU.
MODELS = {"tiny_dense": ("kerasdist.example_models:tiny_dense", 200),
          "mid_cnn": ("kerasdist.example_models:mid_cnn", 60)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    figures, reports = [], []
    for name, (spec, steps) in MODELS.items():
        report = kerasdist.bench_strategies(spec, steps=args.steps or steps, batch_size=args.batch_size)
        print(report, flush=True)
        reports.append({"model": f"{name} ({spec}, {report.parameters:,} parameters)", "text": str(report),
                        "recommendation": report.recommendation, "steps": report.steps})
        figures += _relative_throughput(name, report)
    write_result("advisor", figures, reports=reports, batch_size=args.batch_size)


def _relative_throughput(name, report) -> list[dict]:
    rates = {t.strategy: t.steps_per_second for t in report.timings if t.steps_per_second}
    if "default" not in rates:
        return []
    return [figure(f"{name}_{kind}_vs_default", [rate / rates["default"]], None,
                   f"{name}: steps/s under {kind} over default at global batch {report.global_batch_size} "
                   f"(advisor recommends {report.recommendation})")
            for kind, rate in rates.items() if kind != "default"]


if __name__ == "__main__":
    main()
