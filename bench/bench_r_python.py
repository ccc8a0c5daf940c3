"""distributed_fit called from R against the same call from Python, data conversion included.

The driver writes synthetic data once (x: 32768 x 64 float64 by default, labels 0..9 from a fixed linear
rule) and starts two persistent workers: `Rscript bench/r_worker.R` (x read into a plain R numeric
matrix, y an R integer vector, passed to kerasdist::distributed_fit; the model built by an R
function calling Keras through `reticulate::import("keras")`) and this file with --worker (x a
C-ordered float64 NumPy array, y int32, passed to kerasdist.distributed_fit; the same model
built by a Python function). Both: MLP 64 -> 256 -> 256 -> 10 (Adam, sparse categorical
cross-entropy), strategy "default", batch 128, 3 epochs, shuffle seed 0, keras seed 0, a fresh
checkpoint directory per run. Each worker imports everything and warms up with one 1-epoch call
first; then the driver asks R, then Python, "run K" for K = 1..repeats and reads back the wall
time of the distributed_fit call alone (process start and imports excluded). Figure: R seconds
over Python seconds per round. Prints one JSON line and writes bench/results/r_python.json.

usage: .venv/bin/python bench/bench_r_python.py [--repeats 5] [--epochs 3] [--samples 32768]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
from _common import figure, write_result  # noqa: E402

FEATURES, CLASSES, BATCH = 64, 10, 128


def write_data(data_dir: Path, samples: int) -> None:
    """x (column-major doubles, as R reads a matrix) and y (doubles) as little-endian files."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((samples, FEATURES))
    y = np.argmax(x @ rng.standard_normal((FEATURES, CLASSES)), axis=1).astype("<f8")
    (data_dir / "x.bin").write_bytes(x.astype("<f8").tobytes(order="F"))
    (data_dir / "y.bin").write_bytes(y.tobytes())


def start_workers(data_dir: Path, args) -> dict[str, subprocess.Popen]:
    rscript = shutil.which("Rscript")
    if rscript is None:
        sys.exit("bench_r_python: Rscript not found on PATH")
    env = {**os.environ, "KERASDIST_PYTHON": sys.executable, "TF_CPP_MIN_LOG_LEVEL": "2"}
    shape = [str(data_dir), str(args.samples), str(FEATURES), str(args.epochs), str(BATCH)]
    commands = {"R": [rscript, str(BENCH / "r_worker.R"), *shape],
                "Python": [sys.executable, str(Path(__file__).resolve()), "--worker", *shape]}
    return {name: subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            for name, command in commands.items()}


def read_line(name: str, worker: subprocess.Popen, prefix: str) -> str:
    """The rest of the worker's next stdout line starting with `prefix` (other lines skipped)."""
    for line in worker.stdout:
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    sys.exit(f"bench_r_python: the {name} worker ended (exit status {worker.wait()}) before {prefix.strip()}")


def ask(name: str, worker: subprocess.Popen, message: str) -> dict:
    worker.stdin.write(message + "\n")
    worker.stdin.flush()
    return json.loads(read_line(name, worker, "RESULT "))


def drive(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_data(Path(tmp), args.samples)
        workers = start_workers(Path(tmp), args)
        for name, worker in workers.items():
            read_line(name, worker, "READY")
        results = {name: [] for name in workers}
        for run in range(1, args.repeats + 1):
            for name, worker in workers.items():
                results[name].append(ask(name, worker, f"run {run}"))
        for worker in workers.values():
            worker.stdin.write("quit\n")
            worker.stdin.close()
            worker.wait()
    report(results, args)


def report(results: dict[str, list[dict]], args) -> None:
    seconds = {name: [r["seconds"] for r in runs] for name, runs in results.items()}
    ratios = [r / p for r, p in zip(seconds["R"], seconds["Python"], strict=True)]
    figures = [figure("r_over_python_seconds", ratios, "<= 1.05",
                      "wall time of distributed_fit called from R (R matrix in) over from Python (NumPy in)",
                      seconds=seconds)]
    write_result(
        "r_python", figures,
        samples=args.samples, features=FEATURES, batch_size=BATCH, epochs=args.epochs,
        repeats=args.repeats, strategy="default", order="warm-up in each worker, then R, Python, ... interleaved",
        final_loss={name: [r["loss"] for r in runs] for name, runs in results.items()},
        r_side=("bench/r_worker.R: x a plain R numeric matrix (double), y an R integer vector; "
                "build_model an R function built with keras3 (keras_model_sequential |> layer_dense |> compile); "
                "kerasdist::distributed_fit(build_model, x, y, strategy='default', batch_size=128, seed=0)"),
        python_side=("x a C-ordered float64 NumPy array, y int32; build_model a Python function; "
                     "kerasdist.distributed_fit(build_model, x, y, strategy='default', batch_size=128, seed=0)"),
        model="Dense 256 relu, Dense 256 relu, Dense 10 softmax; Adam; sparse categorical cross-entropy",
        timed="the distributed_fit call alone, in the worker (process start, imports, data reading excluded)",
    )


def work(data_dir: str, samples: str, features: str, epochs: str, batch: str) -> None:
    """The Python worker: same protocol as bench/r_worker.R."""
    import keras

    import kerasdist

    n, p = int(samples), int(features)
    x = np.fromfile(Path(data_dir) / "x.bin", dtype="<f8").reshape(p, n).T.copy()
    y = np.fromfile(Path(data_dir) / "y.bin", dtype="<f8").astype(np.int32)

    def build_model() -> keras.Model:
        model = keras.Sequential([keras.Input((p,)), keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(256, activation="relu"),
                                  keras.layers.Dense(CLASSES, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        return model

    def fit_once(run: str, fit_epochs: int) -> dict:
        keras.utils.set_random_seed(0)
        start = time.perf_counter()
        history = kerasdist.distributed_fit(build_model, x, y, epochs=fit_epochs,
                                            checkpoint_dir=Path(data_dir) / f"py-{run}", strategy="default",
                                            batch_size=int(batch), seed=0, verbose=0)
        return {"run": int(run), "seconds": round(time.perf_counter() - start, 4),
                "loss": history.history["loss"][-1]}

    fit_once("0", 1)  # warm-up
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        run = line.split()[1]
        print("RESULT " + json.dumps(fit_once(run, int(epochs))), flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        work(*sys.argv[2:])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=32768)
    drive(parser.parse_args())


if __name__ == "__main__":
    main()
