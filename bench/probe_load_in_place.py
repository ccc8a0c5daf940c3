"""Where a restore's load_weights goes (issue #47 item 2): Keras's `model.load_weights(model.keras)`,
which streams the weights member through `zipfile` (a CRC-32 of every byte, rewinding seeks, buffer
copies), against Keras's own `H5IOStore` / `_load_state` reading the stored member in place (an
object standing in for the ZipFile whose `open` returns a file object over the member's bytes,
read with `os.preadv`). Also a cold read of the file and `zlib.crc32` of its bytes, for scale.
Checks that both load the same values, bit for bit. Not part of `make bench` (bench/README.md,
"Checkpoints at the size people train").

usage: python bench/probe_load_in_place.py [SIZE, default 600M] (as bench_checkpoint_scale.py's --sizes)
"""

from __future__ import annotations

import json
import os
import struct
import sys
import tempfile
import time
import zipfile
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from keras.src.saving import saving_lib  # noqa: E402

import bench_checkpoint_scale as scale  # noqa: E402
from kerasdist.checkpoint import save_checkpoint  # noqa: E402


class _Member:
    """A read-only file object over bytes [start, start + size) of a file."""

    def __init__(self, path: Path, start: int, size: int) -> None:
        self.fd, self.start, self.size, self.position = os.open(path, os.O_RDONLY), start, size, 0

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.position = {os.SEEK_SET: 0, os.SEEK_CUR: self.position, os.SEEK_END: self.size}[whence] + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, target) -> int:
        view = memoryview(target).cast("B")
        count = os.preadv(self.fd, [view[:max(0, min(len(view), self.size - self.position))]],
                          self.start + self.position)
        self.position += count
        return count

    def read(self, size: int = -1) -> bytes:
        buffer = bytearray(self.size - self.position if size < 0 else size)
        return bytes(buffer[:self.readinto(buffer)])

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        os.close(self.fd)


class _InPlace:
    """Stands in for the ZipFile `H5IOStore` opens the weights member of."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with zipfile.ZipFile(path) as archive:
            info = archive.getinfo(saving_lib._VARS_FNAME_H5)
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"{path}: the weights member is compressed")
        with open(path, "rb") as stream:
            stream.seek(info.header_offset + 26)
            name_length, extra_length = struct.unpack("<HH", stream.read(4))  # APPNOTE 4.3.7
        self.start, self.size = info.header_offset + 30 + name_length + extra_length, info.file_size

    def open(self, name: str, mode: str = "r") -> _Member:
        return _Member(self.path, self.start, self.size)


def load_in_place(model, path: Path) -> None:
    store = saving_lib.H5IOStore(saving_lib._VARS_FNAME_H5, archive=_InPlace(path), mode="r")
    try:
        saving_lib._load_state(model, weights_store=store, assets_store=None, inner_path="",
                               visited_saveables=set(), failed_saveables=set(), error_msgs={})
    finally:
        store.close()


def state_of(model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in [*model.weights, *model.optimizer.variables]]


def main() -> None:
    width = scale.width_for(scale.parse_size(sys.argv[1] if len(sys.argv) > 1 else "600M"))
    out: dict[str, list[float]] = {}

    def timed(name: str, action) -> None:
        started = time.perf_counter()
        action()
        out.setdefault(name, []).append(round(time.perf_counter() - started, 3))

    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent / "results") as scratch:
        path = Path(save_checkpoint(scale.prepared_model(width), Path(scratch) / "c", epoch=1).path) / "model.keras"
        model = scale.build_model(width)
        model.optimizer.build(model.trainable_variables)
        buffer = memoryview(bytearray(64 << 20))
        for _ in range(2):
            scale.drop_page_cache()
            timed("read_cold", lambda: scale.read_file(path, buffer))
            data = path.read_bytes()
            timed("crc32_in_memory", lambda d=data: zlib.crc32(d))
            del data
            for name, load in (("keras_load_weights", lambda: model.load_weights(path)),
                               ("in_place", lambda: load_in_place(model, path))):
                scale.drop_page_cache()
                timed(name + "_cold", load)
                timed(name + "_warm", load)
        model.load_weights(path)
        by_keras = state_of(model)
        for variable in [*model.weights, *model.optimizer.variables]:
            variable.assign(np.zeros(variable.shape, variable.dtype))
        load_in_place(model, path)
        same = all(a.tobytes() == b.tobytes() for a, b in zip(by_keras, state_of(model), strict=True))
        print(json.dumps({"state_megabytes": round(path.stat().st_size / 1e6), "same_values": same, **out}))


if __name__ == "__main__":
    main()
