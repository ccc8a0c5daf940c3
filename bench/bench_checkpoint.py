"""Checkpoint overhead: fits with a checkpoint every epoch (written in the background, and written
synchronously) against the same fit without checkpoints, plus how long training waits per save.

Prints one JSON line and writes bench/results/checkpoint.json (checkpoint_object_store.json when
the checkpoints go to a URL). Three variants train the same
model for --epochs epochs per call: `none` (no callback), `sync` (`checkpoint_callback(...,
async_save=False)`) and `background` (`async_save=True`, the default), each with keep=1 and a
checkpoint at every epoch end. They run interleaved as the other training benchmarks do
(bench/_training.py: one untimed warm-up call each, then --repeats rounds, every other round in
the reverse order, the garbage collector run before and kept off during each timed call). Figures,
medians over the rounds with their spread:
- `background_vs_none_fit_time`: seconds of a background-checkpointed fit / the plain fit's
  (target <= 1.02 on local disk, issue #22 item 6);
- `sync_vs_none_fit_time`: the same for synchronous saves (informational);
- `background_blocked_vs_sync_save`: per save, the seconds the training thread spent in the
  callback's save call (`CheckpointCallback.blocked_seconds`: the snapshot) with background saves /
  with synchronous ones (the whole save) (target <= 0.10).
`--with-equal-priority-writer` adds a fourth variant, `background_equal`: background saves whose
writer thread keeps normal priority instead of SCHED_IDLE (how they ran before), and the figure
`background_equal_vs_none_fit_time`, to measure what the idle class is worth side by side.
The checkpoints go to --dest: a local directory (default a temporary one) or an object-store URL
(`s3://bucket/prefix`, configured by the standard AWS_* environment variables; target <= 1.05),
so local and S3 saves are measured the same way. `--s3-test-server` starts kerasdist's S3 test
server (SeaweedFS on 127.0.0.1, `tests/kerasdist_testing`) and saves there: `shared` on the
benchmark's cores, `idle` the same in the SCHED_IDLE class (it takes only the CPU training
leaves), `apart` on a core of its own, the last one, with the benchmark pinned to the others
before TensorFlow sizes its thread pools by them: a training machine with one core fewer and
its bucket elsewhere, as with a real bucket. The JSON records the server's CPU seconds per save
(per epoch for `none`). The model has 5.27M parameters (a 63 MB checkpoint); how much a save
costs a fit depends on how long an epoch is against one save, so --samples sets the epoch (the
JSON records both).

usage: python bench/bench_checkpoint.py [--repeats 3] [--epochs 10] [--samples 4096]
                                      [--dest DIR_OR_URL | --s3-test-server {shared,idle,apart}]
                                      [--with-equal-priority-writer]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _cpus_apart() -> tuple[set[int], set[int]]:
    """(the benchmark's CPUs, the S3 test server's) for `--s3-test-server apart`: the last one
    for the server."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--s3-test-server apart needs at least 2 CPUs")
    return set(cpus[:-1]), {cpus[-1]}


CPUS_APART = _cpus_apart() if "--s3-test-server apart" in " ".join(sys.argv[1:]).replace("=", " ") else None
if CPUS_APART:  # before TensorFlow counts the CPUs it may use
    os.sched_setaffinity(0, CPUS_APART[0])

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasdist  # noqa: E402
from _common import figure, start_s3_test_server, write_result  # noqa: E402  (bench/ is the script's directory)
from _training import EpochTimes, interleaved  # noqa: E402
from kerasdist.checkpoint import background  # noqa: E402

FEATURES, HIDDEN, CLASSES, BATCH = 512, 2048, 10, 128
VARIANTS = ("none", "sync", "background")


def build_model() -> keras.Model:
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--dest", type=str, default=None,
                        help="where the checkpoints go: a directory or an s3:// URL (default: a temporary directory)")
    parser.add_argument("--s3-test-server", choices=("shared", "idle", "apart"), default=None,
                        help="save to the tests' S3 server on this machine: on the benchmark's cores "
                             "(shared), the same in the idle class (idle) or on a core of its own (apart)")
    parser.add_argument("--with-equal-priority-writer", action="store_true",
                        help="also time background saves whose writer keeps normal priority")
    args = parser.parse_args()
    if args.epochs < 2 or args.repeats < 1 or args.samples < BATCH:
        parser.error(f"--epochs must be >= 2, --repeats >= 1 and --samples >= {BATCH}")
    if args.dest and args.s3_test_server:
        parser.error("--dest and --s3-test-server exclude each other")
    return args


def main() -> None:
    args = parse()
    with _s3_test_server(args.s3_test_server) as server:
        if server is not None:
            args.dest = f"s3://{server.make_bucket('bench')}/run"
        measure(args, server)


@contextlib.contextmanager
def _s3_test_server(where: str | None):
    """The tests' S3 server placed as `--s3-test-server` says, reached through the AWS_*
    variables; or None."""
    if where is None:
        yield None
        return
    server = start_s3_test_server()
    try:
        for thread in os.listdir(f"/proc/{server.process.pid}/task"):  # Go starts new ones from these
            if where == "idle":
                os.sched_setscheduler(int(thread), os.SCHED_IDLE, os.sched_param(0))
            elif where == "apart":
                os.sched_setaffinity(int(thread), CPUS_APART[1])
        os.environ.update(server.environment())
        yield server
    finally:
        server.stop()


def _cpu_seconds_of(pid: int) -> float:
    """User and system CPU seconds of another process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(args: argparse.Namespace, server) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.samples, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=args.samples)
    # One endless stream cut into epochs by steps_per_epoch, as distributed_fit feeds fit: a dataset
    # that fit iterates anew each epoch paused 2-2.5 s before about one epoch in three here (with
    # or without checkpoints), which buried the save's cost in noise. Without tf.data's autotuning:
    # with it, about half the fits, of every variant, ended only at the autotune thread's next
    # wake-up (it sleeps 10 ms, then twice as long each time: 10.23, 20.47, 40.95, 81.91 s after
    # the iterator started), after the last epoch (bench/history/2026-11-25-checkpoints.md).
    untuned = tf.data.Options()
    untuned.autotune.enabled = False
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).cache().repeat().prefetch(2).with_options(untuned)
    steps = -(-args.samples // BATCH)
    model = build_model()
    model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)  # trace and build before timing
    variants = (*VARIANTS, "background_equal") if args.with_equal_priority_writer else VARIANTS

    with tempfile.TemporaryDirectory() as scratch:
        dest = (args.dest or scratch).rstrip("/")
        blocked: dict[str, list[list[float]]] = {name: [] for name in variants}
        server_seconds: dict[str, list[float]] = {name: [] for name in variants}  # its CPU seconds per call

        def server_cpu() -> float:
            return _cpu_seconds_of(server.process.pid) if server is not None else 0.0

        def variant(name: str):
            def run(epochs: int, _workdir: str) -> list[float]:
                timer, callbacks = EpochTimes(), []
                server_before = server_cpu()
                if name != "none":
                    directory = f"{dest}/{name}-{uuid.uuid4().hex[:8]}"
                    checkpoint = kerasdist.checkpoint_callback(directory, keep=1, async_save=name != "sync")
                    callbacks.append(checkpoint)
                with _equal_priority_writer() if name == "background_equal" else contextlib.nullcontext():
                    model.fit(data, epochs=epochs, steps_per_epoch=steps, callbacks=[*callbacks, timer], verbose=0)
                server_seconds[name].append(server_cpu() - server_before)
                if callbacks:
                    blocked[name].append(list(checkpoint.blocked_seconds))
                return timer.ends

            return run

        whole, steady = interleaved({name: variant(name) for name in variants}, args.repeats, args.epochs, steps)
        checkpoint_bytes = _size_of_one_checkpoint(Path(dest)) if "://" not in dest else 0

    for name in variants[1:]:
        blocked[name] = blocked[name][1:]  # the warm-up call's
    figures = _figures(whole, steady, blocked, args, model)
    on_object_store = _on_object_store(args.dest)
    write_result(
        "checkpoint_object_store" if on_object_store else "checkpoint", figures,
        parameters=int(model.count_params()),
        checkpoint_megabytes=round(checkpoint_bytes / 1e6, 1),
        epoch_seconds_median=round(steps / statistics.median(steady["none"]), 3),
        fit_seconds={name: [round(steps * args.epochs / rate, 3) for rate in whole[name]] for name in variants},
        blocked_seconds_per_save={name: [round(statistics.median(call), 4) for call in blocked[name]]
                                  for name in variants[1:]},
        s3_server_cpu_seconds_per_save={name: [round(seconds / args.epochs, 3) for seconds in calls[1:]]
                                        for name, calls in server_seconds.items()} if server else None,
        destination=str(args.dest or "local temporary directory")
        + (f" (the tests' S3 server on this machine, --s3-test-server {args.s3_test_server})" if server else ""),
        cpus=sorted(os.sched_getaffinity(0)),
        repeats=args.repeats, epochs_per_fit=args.epochs, samples=args.samples, batch_size=BATCH,
        load_average=[round(v, 2) for v in os.getloadavg()],
        versions=f"TF {tf.__version__}, Keras {keras.__version__}",
    )


@contextlib.contextmanager
def _equal_priority_writer():
    """Background writers that keep normal priority (no SCHED_IDLE), for the side-by-side figure."""
    lower = background._IdleWhileUnwaited.lower_until_waited_for
    background._IdleWhileUnwaited.lower_until_waited_for = lambda self: None
    try:
        yield
    finally:
        background._IdleWhileUnwaited.lower_until_waited_for = lower


def _figures(whole, steady, blocked, args, model) -> list[dict]:
    what = (f"fit of {args.epochs} epochs with a checkpoint_callback(keep=1) saving every epoch / the same fit "
            f"without, {model.count_params() / 1e6:.2f}M-parameter MLP with Adam, per interleaved round")
    saving = [name for name in whole if name != "none"]
    fit_ratio = {name: [plain / other for plain, other in zip(whole["none"], whole[name], strict=True)]
                 for name in saving}
    steady_ratio = {name: [plain / other for plain, other in zip(steady["none"], steady[name], strict=True)]
                    for name in saving}
    blocked_ratio = [statistics.median(bg) / statistics.median(sync)
                     for bg, sync in zip(blocked["background"], blocked["sync"], strict=True)]

    def fit_figure(name: str, target: str | None, saves: str) -> dict:
        return figure(f"{name}_vs_none_fit_time", fit_ratio[name], target,
                      f"seconds of the whole call, {saves}: {what}",
                      steady=round(statistics.median(steady_ratio[name]), 4),
                      steady_runs=[round(r, 4) for r in steady_ratio[name]])

    target = "<= 1.05" if _on_object_store(args.dest) else "<= 1.02"
    if not _training_leaves_a_core_free():
        # Training on the CPU uses every core, so any write costs about its own CPU seconds: the
        # floor of this ratio is 1 + (a save's CPU seconds / an epoch's), informational here; the
        # target holds where training leaves the CPU free (a GPU: bench/gpu_check.py measures it).
        target = None
    return [
        fit_figure("background", target, "background saves (async_save=True)"),
        fit_figure("sync", None, "synchronous saves (async_save=False)"),
        figure("background_blocked_vs_sync_save", blocked_ratio, "<= 0.10",
               "seconds the training thread spends in the save call per checkpoint (median of a fit's saves), "
               "background / synchronous, per round"),
        *([fit_figure("background_equal", None, "background saves whose writer keeps normal priority")]
          if "background_equal" in fit_ratio else []),
    ]


def _training_leaves_a_core_free() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def _on_object_store(dest: str | None) -> bool:
    return dest is not None and "://" in dest and not dest.startswith("file://")


def _size_of_one_checkpoint(dest: Path) -> int:
    for checkpoint_dir in sorted(dest.glob("sync-*")):
        latest = kerasdist.latest_checkpoint(checkpoint_dir)
        if latest is not None:
            return sum(f.stat().st_size for f in Path(latest.path).iterdir())
    return 0


if __name__ == "__main__":
    main()
