"""Checkpoints at the size people train (issue #47): save and restore of a model whose state (weights
and Adam's two slots) is about 60 MB and 600 MB (`make bench`), 2.4 GB or 6 GB (`--sizes 2.4G`),
side by side with Keras, `tf.train.Checkpoint` and the disk's own limits, in one run.

Prints one JSON line and writes bench/results/checkpoint_scale.json (checkpoint_scale_<sizes>.json
for other --sizes) and bench/results/checkpoint_scale.png (seconds against size, every
checkpoint_scale*.json found). The model: a stack of 4 Dense layers of one width with Adam, one
training step taken (so every slot holds values), sized so its state is the size asked for.

Per size, --repeats rounds, each measuring, in this order, on the same disk (a temporary directory
next to the results, or --dir):
- `dd_write`: the limit of writing: the bytes of kerasdist's model.keras written from memory and
  fsynced (what `dd conv=fsync` does); `memcopy`: one in-memory copy of the state into memory
  already touched (what a background save's blocking should cost at most).
- Keras `save_weights` (.weights.h5) and `model.save` (.keras), and `tf.train.Checkpoint.write`
  (what tf_keras's BackupAndRestore wrote), each followed by an fsync of what it wrote.
- kerasdist: a synchronous save (`save_checkpoint`: files fsynced and committed) and a background
  save (`take_snapshot` into a `SaveMemory` kept from round to round, as the callback keeps it,
  then the job on a `BackgroundWriter`: `bg_blocked` is what the training thread waits for,
  `bg_whole` until the checkpoint is committed). The first two background saves of each size are
  made before the rounds (their blocked seconds are in the JSON): the first sizes the SaveMemory,
  the second first touches it.
- Reads, each after the page cache is dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`, which
  needs root: without it the "cold" figures are warm and the JSON says so): `dd_read_cold` and
  `dd_read_warm` (the same file again), the limits of reading; Keras `load_model`; `tf_ckpt_read`
  into the model.
- A fresh process per restore (`restore_cold`, `restore_warm`): `make_or_restore_model` (build
  with Keras's initializers + verify the checksums + load), then, in the same process, its first
  synchronous save and a second (`first_save`, `later_save`), and the floors a restore cannot go
  under here: building the model (`build`) and building it with zeros for initializers
  (`build_no_init`). In the warm one, then, 10 s later (the VM takes back what the process freed),
  a fit of 6 batches saving synchronously at the 5th: the seconds its first save blocks training
  (`fit_first_save`; the callback's memory is prepared after the first step).
Peak extra memory of each: the process's peak RSS during it (VmHWM, reset before through
/proc/self/clear_refs) over its RSS before; for a restore or load_model, also over the new model's
own state. Figures are ratios of the same round (targets of issue #47 at the sizes >= 600 MB,
informational below); the JSON keeps every second.

`--profile-restore SIZE` instead times the steps of a restore in a fresh process at that size
(verification, build, signature, optimizer build, the load split by cProfile) and prints them.

`--s3 SIZE` instead saves and restores on kerasdist's S3 test server (SeaweedFS on 127.0.0.1, the
same cores), each beside a plain upload and download of the same bytes with the same client
(s3fs), and writes checkpoint_scale_s3.json.

usage: python bench/bench_checkpoint_scale.py [--sizes 60M,600M] [--repeats 2] [--dir DIR]
                                              [--profile-restore 600M] [--s3 600M]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

LAYERS = 4
TARGET_SIZES = 600e6  # the targets hold at 600 MB and above


def parse_size(text: str) -> int:
    units = {"K": 1e3, "M": 1e6, "G": 1e9}
    text = text.strip().upper().rstrip("B")
    if not text or text[-1] not in units:
        raise argparse.ArgumentTypeError(f"a size like 60M or 2.4G, got {text!r}")
    return int(float(text[:-1]) * units[text[-1]])


def width_for(state_bytes: int) -> int:
    """The Dense width whose LAYERS x width^2 float32 weights, with Adam's 2 slots, make the state."""
    return max(64, round(math.sqrt(state_bytes / (LAYERS * 12)) / 64) * 64)


def build_model(width: int, initializer: str = "glorot_uniform") -> Any:
    import keras

    model = keras.Sequential([keras.Input((width,))] + [
        keras.layers.Dense(width, kernel_initializer=initializer) for _ in range(LAYERS)])
    model.compile(optimizer="adam", loss="mse")
    return model


# -- memory and the page cache ------------------------------------------------------------------

def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measured(action: Callable[[], Any]) -> tuple[float, int, Any]:
    """(seconds, peak RSS over the RSS before, result) of `action()`."""
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    started = time.perf_counter()
    result = action()
    seconds = time.perf_counter() - started
    return seconds, _status("VmHWM") - before, result


def give_back_memory() -> None:
    """Return freed heap to the system (glibc's malloc_trim), so a later peak is not hidden by it."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def drop_page_cache() -> bool:
    """Drop the page cache (root only); False when it cannot."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3")
    except OSError:
        return False
    return True


def fsync_tree(path: Path) -> None:
    for file in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_file(path: Path, buffer: memoryview) -> int:
    total = 0
    with open(path, "rb", buffering=0) as stream:
        while count := stream.readinto(buffer):
            total += count
    return total


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# -- the restore's fresh process ----------------------------------------------------------------

def restore_child(directory: str, width: int, cold: bool, scratch: str) -> dict:
    import kerasdist
    from kerasdist.checkpoint import save_checkpoint

    if cold:
        cold = drop_page_cache()
    else:
        buffer = memoryview(bytearray(64 << 20))
        for file in Path(directory).rglob("*"):
            if file.is_file():
                read_file(file, buffer)
    seconds, extra, model = measured(lambda: kerasdist.make_or_restore_model(directory, lambda: build_model(width)))
    state = sum(v.numpy().nbytes for v in [*model.weights, *model.optimizer.variables])
    result = {"restore": seconds, "restore_extra": extra - state, "cold": cold, "step": int(model.optimizer.iterations)}
    for name in ("first_save", "later_save"):
        target = Path(scratch) / name
        result[name], result[name + "_extra"], _ = measured(lambda t=target: save_checkpoint(model, t, epoch=1))
        shutil.rmtree(target)
    model = None  # its memory back before the builds
    result["build"], _, _ = measured(lambda: build_model(width))
    result["build_no_init"], _, model = measured(lambda: build_model(width, "zeros"))
    if not cold:
        result["fit_first_save"] = fit_first_save(model, Path(scratch) / "fit")
    return result


def fit_first_save(model: Any, directory: Path, every: int = 5) -> float:
    """Seconds the training thread is blocked at the first save of a fit (synchronous, the
    callback's memory prepared after the first step), after memory this process freed has had
    the time to be taken back by the VM, as it has in a job that starts."""
    import kerasdist

    time.sleep(10)
    x = np.random.default_rng(2).normal(size=(8 * (every + 1), model.input_shape[-1])).astype("float32")
    callback = kerasdist.checkpoint_callback(directory, every_steps=every, every_epoch=False, async_save=False)
    model.fit(x, x, batch_size=8, epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    shutil.rmtree(directory)
    return callback.blocked_seconds[0]


def run_child(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def timed_copy(model: Any, seconds: dict) -> None:
    """`memcopy`: one copy of the state into memory already touched (as SaveMemory's is after its
    first save)."""
    state = [np.asarray(v.numpy()) for v in [*model.weights, *model.optimizer.variables]]
    copies = [np.zeros_like(a) for a in state]
    for c in copies:
        c.fill(1)
    started = time.perf_counter()
    for c, a in zip(copies, state, strict=True):
        np.copyto(c, a)
    seconds["memcopy"] = time.perf_counter() - started


def background_save(model: Any, directory: Path, memory: Any, writer: Any) -> float:
    """A background save as the callback makes one, waited for; returns the seconds it blocked."""
    from kerasdist.checkpoint import CheckpointManager
    from kerasdist.checkpoint.record import Progress
    from kerasdist.checkpoint.snapshot import take_snapshot

    manager = CheckpointManager(directory)
    started = time.perf_counter()
    taken = take_snapshot(model, memory)
    writer.submit(lambda: manager.commit(taken, Progress.of(epoch=1)), "benchmark save")
    blocked = time.perf_counter() - started
    writer.wait()
    return blocked


# -- one round at one size -----------------------------------------------------------------------

def one_round(model: Any, width: int, scratch: Path, memory: Any, writer: Any) -> tuple[dict, dict, bool]:
    """Seconds and peak extra bytes of every operation, and whether the page cache could be dropped."""
    import keras
    import tensorflow as tf

    from kerasdist.checkpoint import save_checkpoint

    seconds, extra = {}, {}

    def timed(name: str, action: Callable[[], Any]) -> Any:
        seconds[name], extra[name], result = measured(action)
        return result

    scratch.mkdir(parents=True, exist_ok=True)
    info = timed("kerasdist_sync", lambda: save_checkpoint(model, scratch / "sync", epoch=1))
    keras_file = Path(info.path) / "model.keras"
    # The fresh processes first, while this one holds least (at 2.4 GB both at once would not fit).
    give_back_memory()
    dropped = True
    for kind in ("cold", "warm"):
        child = run_child(["--restore-child", str(Path(info.path).parent), "--width", str(width),
                           "--scratch", str(scratch / f"child-{kind}")] + (["--cold"] if kind == "cold" else []))
        seconds[f"restore_{kind}"], extra[f"restore_{kind}"] = child["restore"], child["restore_extra"]
        for name in ("first_save", "later_save"):
            seconds.setdefault(name, []).append(child[name])
            extra.setdefault(name, []).append(child[name + "_extra"])
        for name in ("build", "build_no_init"):
            seconds.setdefault(name, []).append(child[name])
        if "fit_first_save" in child:
            seconds["fit_first_save"] = child["fit_first_save"]
        dropped = dropped and (kind == "warm" or child["cold"])
    for name in ("first_save", "later_save", "build", "build_no_init"):
        seconds[name] = statistics.median(seconds[name])
    for name in ("first_save", "later_save"):
        extra[name] = max(extra[name])
    payload = np.frombuffer(np.random.default_rng(0).bytes(keras_file.stat().st_size), np.uint8)

    def dd_write() -> None:
        with open(scratch / "dd.bin", "wb", buffering=0) as stream:
            view = memoryview(payload)
            for start in range(0, len(view), 64 << 20):
                stream.write(view[start:start + (64 << 20)])
            os.fsync(stream.fileno())

    timed("dd_write", dd_write)
    payload = None  # its memory back
    timed_copy(model, seconds)

    timed("keras_save_weights", lambda: (model.save_weights(scratch / "w.weights.h5"),
                                         fsync_tree(scratch / "w.weights.h5")))
    timed("keras_model_save", lambda: (model.save(scratch / "m.keras"), fsync_tree(scratch / "m.keras")))
    tf_checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    timed("tf_ckpt_write", lambda: (tf_checkpoint.write(str(scratch / "tf" / "ckpt")), fsync_tree(scratch / "tf")))

    timed("bg_whole", lambda: seconds.update(bg_blocked=background_save(model, scratch / "bg", memory, writer)))
    extra["bg_blocked"] = extra["bg_whole"]

    buffer = memoryview(bytearray(64 << 20))
    dropped = drop_page_cache() and dropped
    timed("dd_read_cold", lambda: read_file(keras_file, buffer))
    timed("dd_read_warm", lambda: read_file(keras_file, buffer))
    drop_page_cache()
    loaded = timed("keras_load_model", lambda: keras.models.load_model(scratch / "m.keras"))
    extra["keras_load_model"] -= sum(v.numpy().nbytes for v in [*loaded.weights, *loaded.optimizer.variables])
    del loaded
    give_back_memory()
    drop_page_cache()
    timed("tf_ckpt_read", lambda: tf_checkpoint.read(str(scratch / "tf" / "ckpt")).assert_consumed())

    shutil.rmtree(scratch)
    return seconds, extra, dropped


# -- figures ---------------------------------------------------------------------------------------

def size_label(state_bytes: int) -> str:
    return f"{state_bytes / 1e9:.1f}GB" if state_bytes >= 1e9 else f"{state_bytes / 1e6:.0f}MB"


def figures_of(label: str, state_bytes: int, rounds: list[dict], extras: list[dict]) -> list[dict]:
    from _common import figure

    targeted = state_bytes >= TARGET_SIZES * 0.9

    def target(text: str) -> str | None:
        return text if targeted else None

    def ratio(name: str, over: str | Callable[[dict], float]) -> list[float]:
        return [r[name] / (over(r) if callable(over) else r[over]) for r in rounds]

    def memory(name: str) -> list[float]:
        return [e[name] / state_bytes for e in extras]

    def restore_bound(r: dict) -> float:
        return 2 * r["dd_read_cold"] + r["build_no_init"]

    at = f"at {label} of state ({LAYERS} Dense layers with Adam), per round"
    rows = [
        ("kerasdist_sync_vs_dd_write", ratio("kerasdist_sync", "dd_write"), target("<= 1.1"),
         "kerasdist synchronous save (fsynced, committed) / dd of the same bytes with fsync"),
        ("fit_first_save_vs_dd_write", ratio("fit_first_save", "dd_write"), target("<= 1.1"),
         "the first synchronous save of a fit in a fresh process (training thread blocked) / dd write"),
        ("first_save_vs_dd_write", ratio("first_save", "dd_write"), target("<= 1.1"),
         "a fresh process's first save_checkpoint (after its restore; nothing kept from a save before) / dd write"),
        ("later_save_vs_dd_write", ratio("later_save", "dd_write"), None, "the same process's second save / dd write"),
        ("bg_blocked_vs_memcopy", ratio("bg_blocked", "memcopy"), target("<= 1.0"),
         "background save: seconds the training thread is blocked / one in-memory copy of the state"),
        ("bg_whole_vs_dd_write", ratio("bg_whole", "dd_write"), None, "background save, until committed / dd write"),
        ("keras_save_weights_vs_dd_write", ratio("keras_save_weights", "dd_write"), None,
         "Keras save_weights + fsync / dd write"),
        ("keras_model_save_vs_dd_write", ratio("keras_model_save", "dd_write"), None,
         "Keras model.save(.keras) + fsync / dd write"),
        ("tf_ckpt_write_vs_dd_write", ratio("tf_ckpt_write", "dd_write"), None,
         "tf.train.Checkpoint.write + fsync / dd write"),
        ("restore_cold_vs_bound", ratio("restore_cold", restore_bound), target("<= 1.0"),
         "make_or_restore_model, cold cache / (2 x cold read of the bytes + build with zeros initializers)"),
        ("restore_cold_vs_dd_read_cold", ratio("restore_cold", "dd_read_cold"), None,
         "make_or_restore_model, cold cache / cold read of the same bytes"),
        ("restore_warm_vs_dd_read_warm", ratio("restore_warm", "dd_read_warm"), None,
         "make_or_restore_model, warm cache / warm read"),
        ("keras_load_model_vs_dd_read_cold", ratio("keras_load_model", "dd_read_cold"), None,
         "Keras load_model(.keras), cold / cold read"),
        ("tf_ckpt_read_vs_dd_read_cold", ratio("tf_ckpt_read", "dd_read_cold"), None,
         "tf.train.Checkpoint.read into the model, cold / cold read"),
        ("kerasdist_sync_peak_memory_vs_state", memory("kerasdist_sync"), target("<= 1.0"),
         "peak RSS over the RSS before a synchronous save / the state's bytes"),
        ("bg_peak_memory_vs_state", memory("bg_whole"), target("<= 1.0"),
         "peak RSS over the RSS before a background save (its SaveMemory already held) / the state's bytes"),
        ("restore_peak_memory_vs_state", memory("restore_cold"), target("<= 0.25"),
         "peak RSS of a restoring process over its RSS before and the model's own state / the state's bytes"),
        ("keras_load_model_peak_memory_vs_state", memory("keras_load_model"), None,
         "the same for Keras load_model"),
    ]
    return [figure(f"{label}_{name}", values, tgt, f"{what}, {at}") for name, values, tgt, what in rows]


def plot(path: Path) -> bool:
    """Seconds against state size for every operation, from every checkpoint_scale*.json."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    points: dict[str, dict[float, float]] = {}
    for result_file in sorted(path.parent.glob("checkpoint_scale*.json")):
        for size in json.loads(result_file.read_text()).get("sizes", []):
            for name, runs in size["seconds"].items():
                points.setdefault(name, {})[size["state_bytes"] / 1e9] = statistics.median(runs)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for index, (name, by_size) in enumerate(sorted(points.items())):  # 19 lines: a colour and a marker each
        xs = sorted(by_size)
        style = "--" if name.startswith("dd_") or name == "memcopy" else "-"
        ax.plot(xs, [by_size[x] for x in xs], style, marker="osv^D"[index % 5],
                color=plt.cm.tab20.colors[index % 20], label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("model state (weights + Adam slots), GB")
    ax.set_ylabel("seconds (median over rounds)")
    ax.set_title("checkpoint save and restore against size (dashed: the limits)", fontsize=10)
    ax.legend(fontsize=7, ncols=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- the profile of one restore --------------------------------------------------------------------

def profile_restore(directory: str, width: int) -> dict:
    """The steps of `make_or_restore_model`'s restore, each timed as `CheckpointManager.restore` runs
    them, in a fresh process with a cold page cache; the load split by cProfile. A build with
    Keras's initializers first, for scale (not in the total)."""
    import cProfile
    import pstats

    from kerasdist import compat
    from kerasdist.checkpoint.layout import MODEL_FILE, RNG_FILE
    from kerasdist.checkpoint.manager import CheckpointManager, _build_optimizer
    from kerasdist.checkpoint.model_state import check_signature, restore_seed_states
    from kerasdist.checkpoint.record import read_record

    steps = {}

    def step(name: str, action: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        result = action()
        steps[name] = round(time.perf_counter() - started, 3)
        return result

    step("build with Keras's initializers (not in the total)", lambda: build_model(width))
    give_back_memory()
    drop_page_cache()
    manager = step("manager (directory probe)", lambda: CheckpointManager(directory))
    latest = step("verify (list + CRC-32 of every file)", manager.latest)
    entry = manager.store.entry_of(latest.path)
    profiler = cProfile.Profile()
    with compat.initializers_deferred() as deferred:
        model = step("build, random initializers deferred", lambda: build_model(width))
        step("signature check", lambda: check_signature(model, read_record(manager.store, entry)["signature"],
                                                         latest.path))
        step("optimizer build (slots, zeros)", lambda: _build_optimizer(model, latest.path))
        step("load (compat.load_keras_weights: h5 parse + assign)",
             lambda: profiler.runcall(compat.load_keras_weights, model, Path(latest.path) / MODEL_FILE))
        step("seed states", lambda: restore_seed_states(model, Path(latest.path) / RNG_FILE, latest.path))
        steps["initializers deferred / left for the end"] = [deferred.deferred, len(deferred.pending)]
    stats = pstats.Stats(profiler)
    top = sorted(((key, value[3], value[2]) for key, value in stats.stats.items()), key=lambda t: -t[2])[:15]
    steps["load by function (tottime s)"] = {f"{k[0].rsplit('/', 2)[-1]}:{k[1]}({k[2]})": round(tt, 3)
                                             for k, _, tt in top}
    steps["total"] = round(sum(v for k, v in steps.items() if isinstance(v, float) and "not in" not in k), 3)
    return steps


# -- the S3 path (--s3 SIZE) ----------------------------------------------------------------------

def s3_rounds(state_bytes: int, repeats: int) -> dict:
    """kerasdist's save and restore on an S3 store (the tests' SeaweedFS server on 127.0.0.1,
    on the same cores), each beside a plain upload and download of the same bytes (the checkpoint's
    model.keras) with the same client (s3fs, as the object store uses it)."""
    import kerasdist
    from _common import start_s3_test_server
    from kerasdist.checkpoint import save_checkpoint

    width = width_for(state_bytes)
    model = prepared_model(width)
    actual = sum(v.numpy().nbytes for v in [*model.weights, *model.optimizer.variables])
    server = start_s3_test_server()
    seconds: dict[str, list[float]] = {}
    load = [os.getloadavg()]

    def timed(name: str, action: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        result = action()
        seconds.setdefault(name, []).append(round(time.perf_counter() - started, 3))
        return result

    try:
        options = server.storage_options()
        fs = server.filesystem()
        for index in range(repeats):
            url = f"s3://{server.make_bucket()}/run"
            info = timed("s3_save", lambda u=url: save_checkpoint(model, u, storage_options=options, epoch=1))
            payload = fs.cat_file(f"{info.path}/model.keras")
            key = f"{url.removeprefix('s3://').split('/')[0]}/plain/model.keras"
            timed("s3_upload", lambda k=key, p=payload: fs.pipe_file(k, p))
            timed("s3_download", lambda k=key: fs.cat_file(k))
            payload = None
            give_back_memory()
            restored = timed("s3_restore", lambda u=url: kerasdist.make_or_restore_model(
                u, lambda: build_model(width), storage_options=options))
            assert int(restored.optimizer.iterations.numpy()) == 1
            restored = None
            give_back_memory()
            timed("build_no_init", lambda: build_model(width, "zeros"))
            load.append(os.getloadavg())
            figures = ", ".join(f"{k} {v[-1]:.2f}" for k, v in seconds.items())
            print(f"s3 {size_label(actual)} round {index}: {figures}", file=sys.stderr, flush=True)
    finally:
        server.stop()
    return {"label": size_label(actual), "state_bytes": actual, "width": width, "seconds": seconds,
            "load_average": [[round(v, 2) for v in triple] for triple in load]}


def s3_figures(size: dict) -> list[dict]:
    from _common import figure

    s, label = size["seconds"], size["label"]
    at = f"at {label} of state, on kerasdist's S3 test server (SeaweedFS, 127.0.0.1), per round"
    ratios = [
        ("s3_save_vs_upload", [a / b for a, b in zip(s["s3_save"], s["s3_upload"], strict=True)],
         "kerasdist synchronous save to S3 / a plain upload of the same bytes (s3fs pipe_file)"),
        ("s3_restore_vs_download", [a / b for a, b in zip(s["s3_restore"], s["s3_download"], strict=True)],
         "make_or_restore_model from S3 (build + verify + download + load) / a plain download (s3fs cat_file)"),
    ]
    return [figure(f"{label}_{name}", values, None, f"{what}, {at}") for name, values, what in ratios]


# -- main ------------------------------------------------------------------------------------------

def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="60M,600M", help="model state sizes, e.g. 60M,600M or 2.4G,6G")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary directory "
                                                                "under bench/results, on the results' disk)")
    parser.add_argument("--profile-restore", type=parse_size, default=None, metavar="SIZE")
    parser.add_argument("--s3", type=parse_size, default=None, metavar="SIZE",
                        help="instead: save and restore on kerasdist's S3 test server at SIZE, beside plain "
                             "uploads and downloads (checkpoint_scale_s3.json)")
    parser.add_argument("--restore-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        args.size_list = [parse_size(s) for s in args.sizes.split(",")]
    except argparse.ArgumentTypeError as error:
        parser.error(f"--sizes: {error}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def prepared_model(width: int) -> Any:
    model = build_model(width)
    x = np.random.default_rng(1).normal(size=(8, width)).astype("float32")
    model.train_on_batch(x, x)  # every Adam slot holds values, the step is 1
    return model


def main() -> None:
    args = parse()
    if args.restore_child:
        print(json.dumps(restore_child(args.restore_child, args.width, args.cold, args.scratch)))
        return
    if args.profile_child:
        print(json.dumps(profile_restore(args.profile_child, args.width)))
        return
    import keras
    import tensorflow as tf

    from _common import RESULTS, write_result
    from kerasdist.checkpoint import save_checkpoint
    from kerasdist.checkpoint.background import BackgroundWriter
    from kerasdist.checkpoint.snapshot import SaveMemory

    base = args.dir or RESULTS
    base.mkdir(parents=True, exist_ok=True)
    if args.profile_restore:
        width = width_for(args.profile_restore)
        with tempfile.TemporaryDirectory(dir=base) as scratch:
            save_checkpoint(prepared_model(width), Path(scratch) / "ckpt", epoch=1)
            print(json.dumps(run_child(["--profile-child", str(Path(scratch) / "ckpt"), "--width", str(width)]),
                             indent=1))
        return

    if args.s3:
        started = time.time()
        size = s3_rounds(args.s3, args.repeats)
        write_result("checkpoint_scale_s3", s3_figures(size), s3=size, repeats=args.repeats,
                     seconds_total=round(time.time() - started, 1),
                     versions=f"TF {tf.__version__}, Keras {keras.__version__}")
        return

    started = time.time()
    sizes, figures, all_dropped = [], [], True
    load = [os.getloadavg()]
    for state_bytes in args.size_list:
        width = width_for(state_bytes)
        model = prepared_model(width)
        actual = sum(v.numpy().nbytes for v in [*model.weights, *model.optimizer.variables])
        memory, writer = SaveMemory(), BackgroundWriter("bench-checkpoint-scale")
        rounds, extras = [], []
        with tempfile.TemporaryDirectory(dir=base) as scratch:
            # The callback's first two background saves: the first copies into fresh memory and
            # sizes its SaveMemory, the second first touches that memory; the rounds are the later ones.
            bg_first = [background_save(model, Path(scratch) / f"warm{i}", memory, writer) for i in range(2)]
            for index in range(args.repeats):
                seconds, extra, dropped = one_round(model, width, Path(scratch) / f"r{index}", memory, writer)
                rounds.append(seconds)
                extras.append(extra)
                all_dropped = all_dropped and dropped
                load.append(os.getloadavg())
                print(f"{size_label(actual)} round {index}: " + ", ".join(f"{k} {v:.2f}" for k, v in seconds.items()),
                      file=sys.stderr, flush=True)
        memory.release()
        del model
        label = size_label(actual)
        figures += figures_of(label, actual, rounds, extras)
        sizes.append({"label": label, "state_bytes": actual, "width": width, "layers": LAYERS,
                      "seconds": {k: [round(r[k], 3) for r in rounds] for k in rounds[0]},
                      "bg_blocked_first_two_saves": [round(b, 3) for b in bg_first],
                      "peak_extra_megabytes": {k: [round(e[k] / 1e6, 1) for e in extras] for k in extras[0]}})
    name = "checkpoint_scale" if args.sizes == "60M,600M" else "checkpoint_scale_" + args.sizes.replace(",", "_")
    results_path = write_result(
        name, figures, sizes=sizes, repeats=args.repeats,
        page_cache_dropped=all_dropped,
        load_average=[[round(v, 2) for v in triple] for triple in load],
        seconds_total=round(time.time() - started, 1),
        versions=f"TF {tf.__version__}, Keras {keras.__version__}",
    )
    plotted = plot(results_path.parent / "checkpoint_scale.png")
    print(f"checkpoint_scale: {results_path}; plot {'written' if plotted else 'skipped (no matplotlib)'}",
          file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common, also in the child processes
    main()
