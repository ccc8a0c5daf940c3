"""A model's checkpoint as of one step, not yet written: a `Snapshot`, the one type synchronous
and background saves hand to `record.commit`.

`snapshot_now(model)` is a synchronous save's: the same recorded walk, its files made at once by
`commit` from reads of the variables (no copy), as `Pieces`: views of those reads and the headers
between them, which the local store copies through a small buffer as it writes (`model.save` on a
Keras outside the snapshot's gate).
`take_snapshot(model)` is what a background save blocks training for: it records everything
`model.save` would write and `rng.npz` holds, while the model does not change. `Snapshot.files()`
then makes the checkpoint's files (`{"model.keras": ..., "rng.npz": ...}`, bytes-like) from the snapshot
alone, in any thread, while training goes on: the same `.keras` zip `model.save` writes (the same
members and layout; the weights file holds the same groups, datasets and attributes, in the same
order), which `keras.models.load_model` and `CheckpointManager.restore` read as usual.

How it stays cheap. `model.save` (Keras 3.15's `saving_lib._save_model_to_fileobj`) serializes the
config, then walks the model, handing each saveable a store to put its variables in, and writes
each value into an HDF5 file as it comes. The snapshot runs the same walk with a store that only
records what it is given (`compat.record_save`, where the Keras internals live), each value frozen
here (`_frozen`):
- With a `SaveMemory` (background saves), every value is copied into memory the saves reuse: one
  copy, into memory already mapped, and nothing of the model's held afterwards.
- Without one, a Keras variable is kept as a tensor read of it: TensorFlow's variable reads are
  snapshots (an update of a variable whose value is still referenced copies it first), so later
  training steps cannot change it. Reads that land elsewhere than this host's CPU (GPU memory, a
  parameter server) are copied to host memory at once, so a snapshot never holds accelerator
  memory or remote values. Anything else is copied, unless it is a fresh array nothing else holds.
`files()` replays the recorded calls into Keras's own store (`compat.write_keras_zip`), writing into
the zip's own buffer, where the zip keeps the weights file (so building the zip does not copy it
again); where the writer computes the zip's CRC-32 (`builds_in_pieces`), the zip is `Pieces`
instead, its large values views of the recorded ones (`pieces.py`): no buffer of the file's size.

The walk and the stores are Keras internals: `compat.keras_snapshot_supported` gates them on the
Keras versions checked (`compat.keras_saving.KERAS_SNAPSHOT_VERSIONS`); on others `take_snapshot` makes the
files at once with `model.save` (correct, not cheap), and tests/python/test_compat.py and
test_background_save.py fail so that the shim is checked again.
"""

from __future__ import annotations

import functools
import io
import mmap
import struct
import sys
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kerasdist import compat
from kerasdist.checkpoint.checksums import Content, FileContent, PendingCrc, finished
from kerasdist.checkpoint.layout import MODEL_FILE, RNG_FILE
from kerasdist.checkpoint.model_state import optimizer_step, seed_states, signature
from kerasdist.checkpoint.pieces import Pieces, PiecesWindow, Window


@dataclass(frozen=True)
class Snapshot:
    """A model's checkpoint at one training step, frozen; `files()` makes its files.

    Attributes:
        global_step: the model's training steps when it was taken.
        signature: shape and dtype of every weight (checked before a restore).
        make_files: returns the files (`model.keras`, `rng.npz`), `model.keras` as a `PendingCrc`
            where its checksum comes from the zip's (its weights' CRC-32 maybe still to compute).
    """

    global_step: int
    signature: list[list[Any]]
    make_files: Callable[[], dict[str, FileContent]]

    def files(self) -> dict[str, Content]:
        """The checkpoint's files by name: `model.keras` and `rng.npz`, complete."""
        return {name: finished(content) for name, content in self.make_files().items()}

    def files_to_write(self) -> dict[str, FileContent]:
        """The files as a store writes them: `model.keras`'s weights CRC-32 maybe still to compute
        (`PendingCrc`), which a local store does while it writes the file."""
        return self.make_files()


def snapshot_now(model: Any, memory: SaveMemory | None = None) -> Snapshot:
    """The model's checkpoint as of now, for a synchronous save (its files made by `commit` at
    once). Through the recorded walk where this Keras supports it: no copy of the values (reads of
    the variables), the file built as `Pieces` (views of those reads, no buffer of the file's size)
    where `builds_in_pieces`, else once in memory sized for it (`memory`'s file buffer, kept from
    one save to the next, else fresh); else with `model.save`."""
    if compat.keras_snapshot_supported():
        return take_snapshot(model, memory, copy_values=False)
    files: dict[str, FileContent] = {MODEL_FILE: keras_bytes_now(model), RNG_FILE: npz_bytes(seed_states(model))}
    return Snapshot(optimizer_step(model), signature(model), lambda: dict(files))


def builds_in_pieces() -> bool:
    """Whether saves build their files as `Pieces`, with no file buffer (then a synchronous save
    needs no `SaveMemory`, a background one only its copies of the values): the recorded walk, and
    a zip whose CRC-32 the writer computes (the local store never joins the pieces)."""
    return compat.keras_snapshot_supported() and compat.zip_crc_later_supported()


def take_snapshot(model: Any, memory: SaveMemory | None = None, *, copy_values: bool = True) -> Snapshot:
    """Record `model`'s state for a checkpoint; call it on the training thread, between steps.

    With `memory`, the recorded values live in it (see `SaveMemory`), and the files are made as
    pieces of them (or in its file buffer where `builds_in_pieces` says no): the snapshot, and the
    files its `files()` returns, stay valid until `memory` takes the next one. `copy_values=False`
    (a synchronous save, its files made before training goes on) keeps reads of the variables
    instead of copies."""
    rng = [np.array(state) for state in seed_states(model)]
    step, weights = optimizer_step(model), signature(model)
    if compat.keras_snapshot_supported():
        taken = memory.next_save() if memory is not None else None
        recorded = _record_model(model, taken if copy_values else None)

        def make_files() -> dict[str, FileContent]:
            if memory is not None:
                memory.check_current(taken)
            return {MODEL_FILE: _keras_bytes(recorded, taken), RNG_FILE: npz_bytes(rng)}

        return Snapshot(step, weights, make_files)
    files: dict[str, FileContent] = {MODEL_FILE: keras_bytes_now(model), RNG_FILE: npz_bytes(rng)}
    return Snapshot(step, weights, lambda: dict(files))


def npz_bytes(arrays: list[np.ndarray]) -> bytes:
    """`np.savez` of `arrays` (named arr_0, arr_1, ...) as bytes."""
    buffer = io.BytesIO()
    np.savez(buffer, *arrays)
    return buffer.getvalue()


def keras_bytes_now(model: Any) -> bytes:
    """`model.save`'s `.keras` file as bytes, written now."""
    return compat.keras_model_bytes(model)


# --------------------------------------------------------------------------------------------
# The recorded walk (Keras's saving internals: compat.record_save, compat.write_keras_zip)


def _record_model(model: Any, space: _SaveSpace | None = None) -> compat.RecordedSave:
    return compat.record_save(model, _freezer(space.values if space is not None else None))


def _keras_bytes(recorded: compat.RecordedSave, space: _SaveSpace | None = None,
                 crc_later: bool = True) -> PendingCrc:
    """The `.keras` zip `model.save` writes for the recorded state: as `Pieces` (views of the
    recorded values, no buffer of the file's size) with its weights member's CRC-32 left for the
    writer to compute (`crc_later`, where compat supports it); else with the zip's own CRC-32,
    built in `space`'s file buffer (valid until its next save) or in fresh memory."""
    about = _file_bytes_about(recorded)
    crc_later = crc_later and builds_in_pieces()
    file: _FileBuffer | Pieces
    if crc_later:
        file = Pieces()  # the values lent as h5py is handed each (`compat.WeightsFile.lend`)
    else:
        file = space.file if space is not None else _FileBuffer()
        file.reserve(about)
    archive_file = file.window(0)
    weights_start = 0

    # A member zipfile may give a ZIP64 field in its header (over about 2 GiB: its test, with the
    # estimate and a margin) gets room for it, and the zip is told to write it, so that the header
    # fills exactly the room left and the weights never move.
    zip64 = about * 1.05 > 0.9 * zipfile.ZIP64_LIMIT

    def weights_file_for(name: str) -> _Window | PiecesWindow:
        # The weights file is built where the zip will hold it, after its member header: the zip's
        # write of it is then a copy onto itself, which the window skips.
        nonlocal weights_start
        header = _ZIP_LOCAL_HEADER_BYTES + len(name.encode()) + (_ZIP64_FIELD_BYTES if zip64 else 0)
        weights_start = archive_file.tell() + header
        return file.window(weights_start)

    member, crc_left = compat.write_keras_zip(recorded, archive_file, weights_file_for, weights_zip64=zip64,
                                              crc_later=crc_later)
    content = archive_file.pieces if isinstance(archive_file, PiecesWindow) else archive_file.view()
    start = _data_start(content, member)
    if start > weights_start:  # cannot happen with the room above; never commit it
        raise RuntimeError(f"The checkpoint's weights member was written over (its header is longer than the "
                           f"{weights_start - member.header_offset} bytes left for it): not saved.")
    if not crc_left:
        return PendingCrc(content, start, start + member.file_size, span_crc=member.CRC)
    fields = (member.header_offset + _LOCAL_HEADER_CRC, _central_entry(content, member.filename) + _CENTRAL_CRC)
    return PendingCrc(content, start, start + member.file_size, fields)


def _read(content: memoryview | Pieces, offset: int, count: int) -> bytes:
    return content.read_at(offset, count) if isinstance(content, Pieces) else bytes(content[offset:offset + count])


def _data_start(content: memoryview | Pieces, member: zipfile.ZipInfo) -> int:
    """Where `member`'s data starts in the zip `content`, by its local header (APPNOTE 4.3.7)."""
    name_length, extra_length = struct.unpack("<HH", _read(content, member.header_offset + 26, 4))
    return member.header_offset + _ZIP_LOCAL_HEADER_BYTES + name_length + extra_length


_LOCAL_HEADER_CRC, _CENTRAL_CRC = 14, 16  # the CRC-32's offset in a local header, a central entry
_END_RECORD_BYTES, _ZIP64_LOCATOR_BYTES = 22, 20  # APPNOTE 4.3.16, 4.3.15


def _central_entry(content: memoryview | Pieces, name: str) -> int:
    """Where the central-directory entry of the member `name` starts in the zip `content` (one
    without an archive comment, as zipfile writes it), by APPNOTE 4.3.12-4.3.16."""
    end = len(content) - _END_RECORD_BYTES
    if _read(content, end, 4) != b"PK\x05\x06":
        raise ValueError("not a zip without a comment")
    position = struct.unpack("<I", _read(content, end + 16, 4))[0]
    if position == 0xFFFFFFFF:  # ZIP64: the offset is in the ZIP64 end record the locator points to
        zip64_end = struct.unpack("<Q", _read(content, end - _ZIP64_LOCATOR_BYTES + 8, 8))[0]
        position = struct.unpack("<Q", _read(content, zip64_end + 48, 8))[0]
    encoded = name.encode()
    while _read(content, position, 4) == b"PK\x01\x02":
        name_length, extra_length, comment_length = struct.unpack("<HHH", _read(content, position + 28, 6))
        if _read(content, position + 46, name_length) == encoded:
            return position
        position += 46 + name_length + extra_length + comment_length
    raise ValueError(f"no central-directory entry for {name!r}")


def _file_bytes_about(recorded: compat.RecordedSave) -> int:
    """A little more than the `.keras` file of `recorded` takes: its values, the config and assets,
    and room for the HDF5 and zip headers, so that its buffer is allocated once, not grown."""
    values = sum(np.asarray(value).nbytes for entry in recorded.entries for _, value in entry.values)
    others = len(recorded.config_json) + len(recorded.metadata_json) + sum(len(c) for _, c in recorded.assets)
    headers = sum(4096 + 1024 * len(entry.values) for entry in recorded.entries)
    return values + others + headers + (1 << 20)


def _host_cpu() -> tf.DeviceSpec:
    with tf.device("CPU:0"):
        return tf.DeviceSpec.from_string(tf.constant(0).device)


def _freezer(arena: _Arena | None) -> Callable[[Any], Any]:
    """What the recording store passes each value through: `_frozen` on this host, into `arena`."""
    host = _host_cpu()

    def freeze(value: Any) -> Any:
        return _frozen(value, host, arena)

    return freeze


def _frozen(value: Any, host: tf.DeviceSpec, arena: _Arena | None) -> Any:
    """`value` as it is now, unaffected by later training steps (see the module docstring): a copy
    in `arena` where there is one."""
    if isinstance(value, keras.Variable):
        read = tf.convert_to_tensor(value.value)
        if arena is not None:
            return arena.copy_of(np.asarray(read))  # the read's own memory, or its copy to this host
        device = tf.DeviceSpec.from_string(read.device)
        if device.device_type == "CPU" and (device.job, device.replica, device.task) == (
                host.job, host.replica, host.task):
            return read
        return read.numpy()
    if isinstance(value, tf.Tensor):  # immutable
        return value
    if isinstance(value, np.ndarray) and _unshared(value):
        return value
    value = keras.ops.convert_to_numpy(value)
    return arena.copy_of(value) if arena is not None else np.array(value, copy=True)


def _unshared(array: np.ndarray) -> bool:
    """Whether nothing but the walk's own call refers to `array`, which owns its memory: a fresh
    array made for the store (an optimizer's `store[str(i)] = variable.numpy()`), which nothing
    can change later, so it needs no copy. An array anything else holds (a layer's attribute, a
    local variable) has a higher reference count and is copied."""
    if array.base is not None or not array.flags.owndata:
        return False
    count = sys.getrefcount(array)
    if _calibration is not None:
        _calibration.append(count)
        return False
    return count <= _fresh_references()


_calibration: list[int] | None = None


@functools.cache
def _fresh_references() -> int:
    """The reference count `_unshared` sees for a fresh array set into a recording store, measured
    once on this Python through the same calls; 0 (copy every array) unless an array that a
    variable also holds counts higher."""
    global _calibration
    _calibration = []
    try:
        store = compat.recording_store(_freezer(None))
        store.make("")
        store["fresh"] = np.zeros(1)
        held = np.zeros(1)
        store["held"] = held
        fresh, held_count = _calibration
    finally:
        _calibration = None
    return fresh if fresh < held_count else 0


# --------------------------------------------------------------------------------------------
# Memory reused from one save to the next


class SaveMemory:
    """Host memory that one save after another reuses: the snapshot's copies of the model's
    values (about the checkpoint's size, held until `release`), and where saves cannot build their
    files as `Pieces` of those copies (`builds_in_pieces`), the checkpoint file too.

    Why: memory a process frees goes back to the kernel, and on VMs that reclaim it (virtio
    balloon) touching it again costs many times the CPU of touching memory in use, which a save
    into fresh memory would pay on every copy (figures: bench/history/2026-11-25-checkpoints.md,
    "Memory the VM has handed back").

    A checkpoint callback that saves in the background (or where synchronous saves cannot build
    their files as `Pieces`) `prepare`s it after a fit's first step, so that its first save finds
    the memory sized and touched too. One save at a time: a snapshot taken with it, and the files its
    `files()` returns, are valid until the next snapshot is taken with it (a stale snapshot's
    `files()` raises), so a caller writes those files before it takes the next snapshot (the
    `Saver` waits for its background writer first)."""

    def __init__(self) -> None:
        self._space = _SaveSpace(_Arena(), _FileBuffer(), 0)
        self._touching: threading.Thread | None = None

    def prepare(self, model: Any, values: bool) -> None:
        """Size the copies' memory (with `values`: background saves) and the file's buffer (where
        files are not built as pieces) for `model`'s state now and touch them in a thread, so that
        the first save does not pay that first touch on the training thread (seconds a GB on this
        VM: bench/README.md, checkpoints at scale). A save that comes before the touching is done
        waits for it."""
        self._touched()  # a touching thread left by a fit that raised must not write into what comes next
        values_bytes, count = _state_bytes(model)
        margin = values_bytes // 100 + (1 << 20)  # what else a save holds: config, counters, seeds
        arrays = []
        if not builds_in_pieces():
            self._space.file.reserve(values_bytes + margin + 8192 * count + (4 << 20))
            arrays.append(self._space.file.array)
        if values:
            self._space.values.reserve(values_bytes + margin + _Arena._ALIGN * count)
            arrays.append(self._space.values.buffer)
        if not arrays:
            return
        self._touching = threading.Thread(target=_touch, args=(arrays,), name="kerasdist-save-memory", daemon=True)
        self._touching.start()

    def next_save(self) -> _SaveSpace:
        """The memory for the next snapshot; every earlier snapshot's is given up."""
        self._touched()
        self._space.values.reset()
        self._space.file.used = 0  # what it holds is the last save's, which is done
        self._space = _SaveSpace(self._space.values, self._space.file, self._space.generation + 1)
        return self._space

    def check_current(self, space: _SaveSpace) -> None:
        if space.generation != self._space.generation:
            raise RuntimeError("This snapshot's memory was reused by a later snapshot: make its files before "
                               "taking the next one.")

    def release(self) -> None:
        """Give the memory back (the next save allocates it again)."""
        self._touched()
        self._space.values.release()
        self._space.file.release()
        self.next_save()

    def _touched(self) -> None:
        if self._touching is not None:
            self._touching.join()
            self._touching = None


def _state_bytes(model: Any) -> tuple[int, int]:
    """The bytes of `model`'s variables and its optimizer's, and how many there are."""
    optimizer = getattr(model, "optimizer", None)
    variables = {id(v): v for v in [*model.variables, *(getattr(optimizer, "variables", None) or [])]}
    return sum(compat.variable_bytes(v) for v in variables.values()), len(variables)


def _touch(arrays: list[np.ndarray]) -> None:
    """Write one byte a page: the kernel maps each page (and the VM backs it) now."""
    for array in arrays:
        array.reshape(-1)[::mmap.PAGESIZE] = 0


@dataclass(frozen=True)
class _SaveSpace:
    values: _Arena
    file: _FileBuffer
    generation: int


class _Arena:
    """Copies of arrays, one after another in one reused buffer. What does not fit this time is
    copied into fresh memory; the next `reset` makes the buffer big enough for all of it."""

    _ALIGN = 64

    def __init__(self) -> None:
        self._buffer = np.empty(0, np.uint8)
        self._end = 0

    @property
    def buffer(self) -> np.ndarray:
        return self._buffer

    def reserve(self, size: int) -> None:
        if size > self._buffer.size:
            self._buffer = np.empty(size, np.uint8)

    def reset(self) -> None:
        self.reserve(self._end)
        self._end = 0

    def release(self) -> None:
        self._buffer, self._end = np.empty(0, np.uint8), 0

    def copy_of(self, value: np.ndarray) -> np.ndarray:
        if value.dtype.hasobject:
            return np.array(value, copy=True)
        start = -(-self._end // self._ALIGN) * self._ALIGN
        self._end = start + value.nbytes
        if self._end > self._buffer.size:
            return np.array(value, copy=True)
        held = self._buffer[start:self._end].view(value.dtype).reshape(value.shape)
        np.copyto(held, value)
        return held


_ZIP_LOCAL_HEADER_BYTES = 30  # before the member's name, without extra fields (ZIP APPNOTE 4.3.7)
_ZIP64_FIELD_BYTES = 20  # the ZIP64 extra field zipfile puts in a large member's local header (4.5.3)


class _FileBuffer:
    """The bytes of one file, written through `_Window`s into one buffer grown as needed and kept."""

    def __init__(self) -> None:  # empty: `reserve` sizes it before a file is written
        self.array, self.used = np.empty(0, np.uint8), 0

    def release(self) -> None:
        self.array, self.used = np.empty(0, np.uint8), 0

    def window(self, base: int) -> _Window:
        """A file object whose byte 0 is byte `base` of the buffer."""
        return _Window(self, base)

    def reserve(self, size: int) -> None:
        """Room for a file of `size` bytes before it is written (at its start: nothing is kept)."""
        if size > self.array.size:
            self.array, self.used = _page_aligned(size), 0

    def ensure(self, end: int) -> None:
        if end > self.array.size:
            grown = _page_aligned(max(end, self.array.size * 3 // 2))
            grown[:self.used] = self.array[:self.used]
            self.array = grown
        self.used = max(self.used, end)


def _page_aligned(size: int) -> np.ndarray:
    """`size` bytes starting on a page boundary, so that the local store's O_DIRECT writes go
    from them without a copy through their own buffer (NumPy's memory, not a mapping of our own:
    NumPy asks for huge pages, and a first write of it costs half the time here)."""
    raw = np.empty(size + mmap.PAGESIZE, np.uint8)
    start = -raw.ctypes.data % mmap.PAGESIZE
    return raw[start:start + size]


class _Window(Window):
    """A file on part of a `_FileBuffer`, from its byte `base`."""

    def __init__(self, buffer: _FileBuffer, base: int) -> None:
        super().__init__()
        self._buffer, self._base = buffer, base

    def lend(self, array: np.ndarray) -> None:
        pass  # every write is copied into the buffer

    def view(self) -> memoryview:
        """The file's bytes (valid until the buffer's next file)."""
        return memoryview(self._buffer.array[self._base:self._base + self._size])

    def _write_here(self, data: Any) -> int:
        if self._position > self._size:  # a gap left by a seek past the end reads as zeros
            self.truncate(self._position)
        source = np.frombuffer(data, np.uint8)
        start = self._base + self._position
        self._buffer.ensure(start + source.size)
        target = self._buffer.array[start:start + source.size]
        if source.size and source.ctypes.data != target.ctypes.data:  # else already in place
            np.copyto(target, source)
        return source.size

    def _read_here(self, out: memoryview) -> None:
        start = self._base + self._position
        out[:] = self._buffer.array[start:start + len(out)]

    def _resize(self, size: int) -> None:
        if size > self._size:  # a file grown by truncate reads as zeros there
            self._buffer.ensure(self._base + size)
            self._buffer.array[self._base + self._size:self._base + size] = 0
