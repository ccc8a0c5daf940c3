"""Where a restore's load_weights goes (issue #47 item 2): Keras's `model.load_weights(model.keras)`,
which streams the weights member through `zipfile` (a CRC-32 of every byte, rewinding seeks, buffer
copies), against `kerasdist.compat.load_keras_weights`: Keras's own `H5IOStore` / `_load_state`
reading the stored member in place (an object standing in for the ZipFile whose `open` returns a
file object over the member's bytes, read with `os.preadv`). Also a cold read of the file and
`zlib.crc32` of its bytes, for scale, and the whole kerasdist restore (`make_or_restore_model`: build
+ verify + load, each in a fresh process, its TensorFlow import not counted) with the in-place load
(`restore_in_place`), with it gated off, i.e. `model.load_weights` (`restore_load_weights`), and
with the build's random initializers deferred too (`restore_in_place_no_init`, cut 3), and with
each value read straight into the tensor its variable takes over and large variables started
unfilled (`restore_tensor_reads`, cut 5: what `make_or_restore_model` does now); each restore's
peak extra memory over the state it restored too (`..._extra_state`, a fraction of the state).
Checks that all of them load the same values, bit for bit. Not part of `make bench`
(bench/history/2026-11-27-to-29-checkpoints-at-scale.md).

usage: python bench/history/probes/probe_load_in_place.py [SIZE, default 600M] [--restores-only] [--restores=A,B]
(SIZE as bench_checkpoint_scale.py's --sizes; --restores-only: only the fresh-process restores;
--restores: which of RESTORES, default all)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

import bench_checkpoint_scale as scale  # noqa: E402
from kerasdist import compat  # noqa: E402
from kerasdist.checkpoint import save_checkpoint  # noqa: E402

# The restores compared, each with the cuts up to it: `model.load_weights` and a build with Keras's
# initializers (before cut 1), the in-place load (cut 1), and the build without random initializers
# (cut 3, compat.initializers_deferred), values read into the tensors variables take over (cut 5).
RESTORES = ("load_weights", "in_place", "in_place_no_init", "tensor_reads")


def restore_child(directory: str, width: int, cold: bool, how: str) -> dict:
    """One `make_or_restore_model` in this fresh process: seconds, and a digest of what it loaded."""
    import kerasdist
    from kerasdist.compat import keras_loading

    if how == "load_weights":  # the gate closed: `model.load_weights`, as before
        keras_loading.KERAS_LOAD_IN_PLACE_VERSIONS = ((0, 0), (0, 0))
    if how in ("load_weights", "in_place"):  # Keras's random initializers run in the build, as before cut 3
        keras_loading.KERAS_DEFERRED_INIT_VERSIONS = ((0, 0), (0, 0))
    if how != "tensor_reads":  # Keras's arrays copied into new tensors, variables started filled: before cut 5
        keras_loading.TF_TENSOR_VIEW_VERSIONS = ((0, 0), (0, 0))
    if cold:
        scale.drop_page_cache()
    else:
        buffer = memoryview(bytearray(64 << 20))
        for file in Path(directory).rglob("*"):
            if file.is_file():
                scale.read_file(file, buffer)
        del buffer
        scale.give_back_memory()
    seconds, extra, model = scale.measured(lambda: kerasdist.make_or_restore_model(
        directory, lambda: scale.build_model(width)))
    digest, state = hashlib.sha256(), 0
    for value in state_of(model):
        digest.update(value.tobytes())
        state += value.nbytes
    return {"seconds": round(seconds, 3), "extra_state": round((extra - state) / state, 3),
            "digest": digest.hexdigest()}


def run_child(directory: Path, width: int, cold: bool, how: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--restore-child", str(directory), str(width),
                           "cold" if cold else "warm", how],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_restores(directory: Path, width: int, out: dict[str, list[float]], digests: set[str]) -> None:
    chosen = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--restores=")), RESTORES)
    for how in chosen:
        for cold in (True, False):
            done = run_child(directory, width, cold, how)
            name = f"restore_{how}_{'cold' if cold else 'warm'}"
            out.setdefault(name, []).append(done["seconds"])
            out.setdefault(name + "_extra_state", []).append(done["extra_state"])
            digests.add(done["digest"])


def state_of(model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in [*model.weights, *model.optimizer.variables]]


def main() -> None:
    if sys.argv[1:2] == ["--restore-child"]:
        directory, width, cold, how = sys.argv[2:6]
        print(json.dumps(restore_child(directory, int(width), cold == "cold", how)))
        return
    sizes = [a for a in sys.argv[1:] if not a.startswith("--")]
    width = scale.width_for(scale.parse_size(sizes[0] if sizes else "600M"))
    restores_only = "--restores-only" in sys.argv
    out: dict[str, list[float]] = {}
    digests: set[str] = set()

    def timed(name: str, action) -> None:
        started = time.perf_counter()
        action()
        out.setdefault(name, []).append(round(time.perf_counter() - started, 3))

    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parents[2] / "results") as scratch:
        directory = Path(scratch) / "c"
        path = Path(save_checkpoint(scale.prepared_model(width), directory, epoch=1).path) / "model.keras"
        model = scale.build_model(width)
        model.optimizer.build(model.trainable_variables)
        buffer = memoryview(bytearray(64 << 20))
        for _ in range(2):
            if restores_only:
                run_restores(directory, width, out, digests)
                load.append(os.getloadavg()[0])
                continue
            scale.drop_page_cache()
            timed("read_cold", lambda: scale.read_file(path, buffer))
            data = path.read_bytes()
            timed("crc32_in_memory", lambda d=data: zlib.crc32(d))
            del data
            for name, load_weights in (("keras_load_weights", lambda: model.load_weights(path)),
                                       ("in_place", lambda: compat.load_keras_weights(model, path))):
                scale.drop_page_cache()
                timed(name + "_cold", load_weights)
                timed(name + "_warm", load_weights)
            run_restores(directory, width, out, digests)
            load.append(os.getloadavg()[0])
        model.load_weights(path)
        by_keras = state_of(model)
        for variable in [*model.weights, *model.optimizer.variables]:
            variable.assign(np.zeros(variable.shape, variable.dtype))
        assert compat.load_keras_weights(model, path)
        same = all(a.tobytes() == b.tobytes() for a, b in zip(by_keras, state_of(model), strict=True))
        print(json.dumps({"state_megabytes": round(path.stat().st_size / 1e6), "same_values": same,
                          "restores_same_values": len(digests) == 1, "load_average": load, **out}))


if __name__ == "__main__":
    main()
