"""The GPU check (issue #33 item 6), ready for the day a machine with GPUs runs kerasdist.

`make gpu-check` (or `.venv/bin/python bench/gpu_check.py`) on the machine at hand:
1. says what TensorFlow sees: GPUs and their names, whether this TensorFlow is a CUDA build, and
   its CUDA / cuDNN versions (a `tensorflow-cpu` install, as `make setup` makes, sees no GPU: install
   `kerasdist[gpu]` on a GPU machine);
2. with GPUs: `distributed_fit` of the tutorial CNN mirrored over every GPU (NCCL all-reduce when
   there are several) against one GPU, at the same global batch, steps/s; and batches/s read
   through a graph loop from a `make_dataset` pipeline with and without
   `tf.data.experimental.prefetch_to_device` (does copying ahead to the GPU pay?);
3. then, on any machine, the benchmarks whose answer changes with a GPU, each in its own process:
   `bench_speed.py` (mixed precision, `mixed_float16` on a GPU, and XLA against float32),
   `bench_checkpoint.py` (background against synchronous saves: where training leaves the CPU
   free, the background save's cost should fall to its target, <= 1.02) and `bench_advisor.py`.
Without a GPU it says so and runs part 3 only. Everything goes to bench/results/gpu_check.json
(and each benchmark's own JSON); record the figures, with the card and versions, in
bench/README.md.

usage: .venv/bin/python bench/gpu_check.py [--quick]   (--quick: fewer repetitions, for a smoke run)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import _training as bench  # noqa: E402
import kerasdist  # noqa: E402
from _common import RESULTS, figure  # noqa: E402

HERE = Path(__file__).resolve().parent
GLOBAL_BATCH = 256


def devices() -> dict:
    gpus = tf.config.list_physical_devices("GPU")
    build = tf.sysconfig.get_build_info()
    return {
        "gpus": [tf.config.experimental.get_device_details(g).get("device_name", g.name) for g in gpus],
        "tensorflow": tf.__version__, "built_with_cuda": tf.test.is_built_with_cuda(),
        "cuda": build.get("cuda_version"), "cudnn": build.get("cudnn_version"),
        "kerasdist": kerasdist.__version__,
    }


def fit_rate(strategy, x, y, epochs: int) -> float:
    """Steps/s of a distributed_fit of the tutorial CNN (epochs after the first)."""
    ends = bench.epoch_ends(lambda callbacks: kerasdist.distributed_fit(
        lambda: bench.tutorial_cnn(), x, y, epochs=epochs, checkpoint_dir=tempfile.mkdtemp(),
        strategy=strategy, batch_size=GLOBAL_BATCH, callbacks=callbacks, verbose=0))
    return (len(x) // GLOBAL_BATCH) * (epochs - 1) / (ends[-1] - ends[0])


def mirrored_figures(gpus: list, repeats: int, epochs: int) -> list[dict]:
    x, y = bench.synthetic_digits(GLOBAL_BATCH * 64)
    one = kerasdist.select_strategy("one_device", devices="/gpu:0")
    every = kerasdist.select_strategy("mirrored", cross_device_ops="nccl" if len(gpus) > 1 else None)
    ratios = []
    for _ in range(repeats):
        ratios.append(fit_rate(every, x, y, epochs) / fit_rate(one, x, y, epochs))
    return [figure("mirrored_all_gpus_vs_one", ratios, None,
                   f"steps/s of distributed_fit mirrored over {len(gpus)} GPU(s) (NCCL when several) / one GPU, "
                   f"global batch {GLOBAL_BATCH}, epochs after the first")]


def prefetch_figures(repeats: int) -> list[dict]:
    x, y = bench.synthetic_digits(GLOBAL_BATCH * 64)

    def rate(to_device: bool) -> float:
        data = kerasdist.make_dataset(x, y, batch_size=GLOBAL_BATCH, epochs=5)
        if to_device:
            data = data.apply(tf.data.experimental.prefetch_to_device("/gpu:0"))

        @tf.function
        def read(dataset):
            total = tf.constant(0.0)
            for images, _ in dataset:
                total += tf.reduce_sum(images)
            return total

        read(data)  # traced and warm
        start = time.perf_counter()
        read(data)
        return 5 * 64 / (time.perf_counter() - start)

    ratios = [rate(True) / rate(False) for _ in range(repeats)]
    return [figure("prefetch_to_device_vs_host", ratios, None,
                   "batches/s a graph loop reads from make_dataset with prefetch_to_device('/gpu:0') / without")]


def run_benchmark(script: str, arguments: list[str]) -> dict:
    """One benchmark in its own process; its JSON line, or its failure."""
    done = subprocess.run([sys.executable, str(HERE / script), *arguments], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"benchmark": script, "failed": done.returncode, "stderr": done.stderr[-2000:]}
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: a smoke run, not figures")
    args = parser.parse_args()
    repeats, epochs = (1, 2) if args.quick else (3, 3)
    found = devices()
    result: dict = {"benchmark": "gpu_check", "devices": found, "figures": []}
    if found["gpus"]:
        print(f"gpu_check: {len(found['gpus'])} GPU(s): {', '.join(found['gpus'])}", flush=True)
        result["figures"] += mirrored_figures(found["gpus"], repeats, epochs)
        result["figures"] += prefetch_figures(repeats)
    else:
        why = "this TensorFlow is not a CUDA build (install kerasdist[gpu])" if not found["built_with_cuda"] \
            else "TensorFlow sees none"
        print(f"gpu_check: no GPU here ({why}); running the parts that also answer on a CPU", flush=True)
        result["no_gpu"] = why
    quick = ["--repeats", "1", "--epochs", "2"] if args.quick else []
    result["benchmarks"] = [
        run_benchmark("bench_speed.py", quick + (["--samples", "2048"] if args.quick else [])),
        run_benchmark("bench_checkpoint.py", quick + (["--samples", "1024"] if args.quick else [])),
        run_benchmark("bench_advisor.py", ["--steps", "50"] if args.quick else []),
    ]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result), flush=True)
    failed = [b["benchmark"] for b in result["benchmarks"] if "failed" in b]
    if failed:
        print(f"gpu_check: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
