"""Background checkpoint saves (issue #22 item 5): the snapshot's files are model.save's, background
checkpoints equal synchronous ones, errors surface, one save in flight, kill -9 and SIGTERM in the
middle of a background write."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import zipfile
import zlib
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasdist
from kerasdist import compat
from kerasdist.checkpoint import RunRecord, background, layout, save_checkpoint
from kerasdist.checkpoint.manager import CheckpointManager
from kerasdist.checkpoint.pieces import Pieces, address_of
from kerasdist.checkpoint.snapshot import (
    SaveMemory,
    _FileBuffer,
    _keras_bytes,
    _record_model,
    keras_bytes_now,
    take_snapshot,
)
from kerasdist.checkpoint.store import direct_io
from kerasdist.checkpoint.store.local import LocalStore

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import kill_resume  # noqa: E402


def build_model() -> keras.Model:
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer="adam", loss="mse")
    return model


def data() -> tf.data.Dataset:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 6)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).batch(16)


def lookup_model() -> keras.Model:
    """A model with assets (the lookup layer's vocabulary) and an optimizer state."""
    inputs = keras.Input((1,), dtype="string")
    lookup = keras.layers.StringLookup()
    lookup.adapt(["a", "b", "c"])  # an adapted vocabulary is saved as an asset, not in the config
    ids = lookup(inputs)
    outputs = keras.layers.Dense(1)(keras.layers.Flatten()(keras.layers.Embedding(5, 3)(ids)))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="mse")
    return model


def zip_members(content: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


# ---------------------------------------------------------------------------------------------
# The snapshot


def test_keras_version_is_one_the_snapshot_was_checked_on():
    """Fails on a Keras the snapshot's use of saving internals was not checked on: check
    checkpoint/snapshot.py against its saving_lib, then widen keras_saving.KERAS_SNAPSHOT_VERSIONS."""
    assert compat.keras_snapshot_supported(), keras.__version__
    assert not compat.keras_snapshot_supported("3.16.0")


def inputs_for(make) -> tuple:
    if make is lookup_model:
        return tf.constant([["a"], ["b"], ["c"], ["z"]]), tf.ones((4, 1))
    return np.ones((8, 6), "float32"), np.ones((8, 1), "float32")


@pytest.mark.parametrize("make", [build_model, lookup_model], ids=["dense-dropout", "lookup-assets"])
def test_snapshot_files_are_model_saves_files_even_after_more_training(make):
    model, (x, y) = make(), inputs_for(make)
    model.fit(x, y, epochs=1, verbose=0)
    expected = zip_members(keras_bytes_now(model))
    rng_before = [g.state.numpy() for g in _seed_generators(model)]
    snapshot = take_snapshot(model)
    model.fit(x, y, epochs=2, verbose=0)  # the snapshot must not see these steps
    files = snapshot.files()
    assert sorted(files) == ["model.keras", "rng.npz"]
    got = zip_members(files["model.keras"])
    assert list(got) == list(expected)  # the same members in the same order
    if make is lookup_model:
        assert any(name.startswith("assets/") for name in got), list(got)
    for name in expected:
        if name != "metadata.json":  # holds the time of saving, to the second
            assert got[name] == expected[name], name
    with np.load(io.BytesIO(files["rng.npz"])) as saved:
        assert [saved[k].tolist() for k in saved.files] == [s.tolist() for s in rng_before]


def _seed_generators(model):
    from kerasdist.checkpoint.model_state import _seed_generators

    return _seed_generators(model)


def test_snapshot_loads_with_keras_load_model(tmp_path):
    model = build_model()
    model.fit(data(), epochs=1, verbose=0)
    expected = [v.numpy() for v in model.weights + model.optimizer.variables]  # load_model leaves seed states
    files = take_snapshot(model).files()
    (tmp_path / "model.keras").write_bytes(files["model.keras"])
    loaded = keras.models.load_model(tmp_path / "model.keras")
    got = [v.numpy() for v in loaded.weights + loaded.optimizer.variables]
    assert len(got) == len(expected)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize("make", [build_model, lookup_model], ids=["dense-dropout", "lookup-assets"])
def test_synchronous_saves_write_model_saves_files_through_the_snapshot(tmp_path, make, monkeypatch):
    """A synchronous save (`save_checkpoint`) makes its model.keras through the recorded walk, as
    pieces (no buffer of the file's size: #47): the same members and bytes as model.save, a record
    whose CRC-32 holds; on a Keras outside the snapshot's gate, model.save's own bytes, the same."""
    from kerasdist.checkpoint import snapshot as snapshot_module
    from kerasdist.compat import keras_saving

    model, (x, y) = make(), inputs_for(make)
    model.fit(x, y, epochs=1, verbose=0)
    expected = zip_members(keras_bytes_now(model))
    writes = []  # per write into a file buffer: whether it had to grow it (none is made)
    monkeypatch.setattr(snapshot_module._FileBuffer, "ensure", lambda buffer, end, _real=_FileBuffer.ensure: (
        writes.append(end > buffer.array.size), _real(buffer, end))[1])
    for gated_off in (False, True):
        if gated_off:
            assert writes == []  # pieces, no file buffer
            monkeypatch.setattr(keras_saving, "KERAS_SNAPSHOT_VERSIONS", ((3, 0), (3, 1)))
        directory = tmp_path / f"gated-off-{gated_off}"
        info = save_checkpoint(model, directory, epoch=1)
        assert kerasdist.latest_checkpoint(directory) == info  # its CRC-32s verified
        got = zip_members((Path(info.path) / "model.keras").read_bytes())
        assert list(got) == list(expected)
        for name in expected:
            if name != "metadata.json":  # holds the time of saving, to the second
                assert got[name] == expected[name], name
    assert writes == []  # model.save's own bytes


@pytest.mark.parametrize("over", [True, False], ids=["over-the-zip64-size", "near-it"])
def test_weights_members_over_and_near_the_zip64_size_are_model_saves(tmp_path, monkeypatch, over):
    """zipfile gives a member over about 2 GiB a ZIP64 field in its header; the weights member,
    built where the zip will hold it, gets room for that field, so the header never overwrites the
    weights' first bytes (a 2.4 GB checkpoint was unreadable: h5py's 'file signature not found').
    Near that size (1.84-2.04 GB), where zipfile would not write the field, the zip is made to
    write it into the room left, so the weights are not moved back (an overlapping copy of the
    whole member). Both checked with zipfile's limit lowered to this small model's size: the
    snapshot's files (fresh and reused memory) are model.save's members, and a synchronous
    checkpoint restores bit for bit."""
    model, (x, y) = build_model(), inputs_for(build_model)
    model.fit(x, y, epochs=1, verbose=0)
    members = zipfile.ZipFile(io.BytesIO(keras_bytes_now(model))).infolist()
    size = next(m.file_size for m in members if m.filename == "model.weights.h5")
    others = max(m.file_size for m in members if m.filename != "model.weights.h5")  # Keras streams them: no ZIP64
    assert size > 3 * others, (size, others)
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 2 * others if over else int(size * 1.05) + 1)
    expected = zip_members(keras_bytes_now(model))  # model.save, under the same limit
    from kerasdist.checkpoint import snapshot as snapshot_module

    moved, write = [], snapshot_module._Window.write

    def noting_moves(window, data):
        source, here = np.frombuffer(data, np.uint8), address_of(window._buffer.array) + window._base + window.tell()
        if source.size >= size and source.ctypes.data != here:
            moved.append(source.size)
        return write(window, data)

    monkeypatch.setattr(snapshot_module._Window, "write", noting_moves)
    piece_write = Pieces.write_at
    monkeypatch.setattr(Pieces, "write_at", lambda pieces, offset, data: (
        moved.append(len(memoryview(data))) if len(memoryview(data)) >= size else None,
        piece_write(pieces, offset, data))[1])
    for files in (take_snapshot(model).files(), take_snapshot(model, SaveMemory()).files()):
        content = bytes(files["model.keras"])
        header = zipfile.ZipFile(io.BytesIO(content)).getinfo("model.weights.h5").header_offset
        assert struct.unpack_from("<H", content, header + 28)[0] == 20  # the ZIP64 field, in the room left
        got = zip_members(content)
        assert list(got) == list(expected)
        assert all(got[name] == expected[name] for name in expected if name != "metadata.json")
    assert moved == []  # the zip's write of the weights was onto themselves, every time (pieces too)
    save_checkpoint(model, tmp_path / "c", epoch=1)
    restored = kerasdist.make_or_restore_model(tmp_path / "c", build_model)
    for got, want in zip([*restored.weights, *restored.optimizer.variables],
                         [*model.weights, *model.optimizer.variables], strict=True):
        assert got.numpy().tobytes() == want.numpy().tobytes()


@pytest.mark.parametrize("make", [build_model, lookup_model], ids=["dense-dropout", "lookup-assets"])
def test_snapshots_make_a_temporary_directory_only_for_models_with_assets(make, monkeypatch):
    """Keras's walk writes assets (lookup vocabularies) into a temporary directory; a snapshot of a
    model without any makes none (a directory made and removed on the training thread at every
    background save), and one with assets still holds them: its files are model.save's."""
    from keras.src.saving import saving_lib

    model, (x, y) = make(), inputs_for(make)
    model.fit(x, y, epochs=1, verbose=0)
    expected = zip_members(keras_bytes_now(model))
    made, real = [], saving_lib.get_temp_dir
    monkeypatch.setattr(saving_lib, "get_temp_dir", lambda: made.append(real()) or made[-1])
    files = take_snapshot(model, SaveMemory()).files()
    assert len(made) == (1 if make is lookup_model else 0)
    assert not any(os.path.exists(directory) for directory in made)
    got = zip_members(bytes(files["model.keras"]))
    assert list(got) == list(expected)
    assert all(got[name] == expected[name] for name in expected if name != "metadata.json")


@pytest.mark.parametrize("make", [build_model, lookup_model], ids=["dense-dropout", "lookup-assets"])
def test_snapshots_in_reused_memory_are_model_saves_files_save_after_save(make):
    model, (x, y) = make(), inputs_for(make)
    memory, addresses = SaveMemory(), []
    for _ in range(3):  # the first save sizes the memory, the later ones reuse it
        model.fit(x, y, epochs=1, verbose=0)
        expected = zip_members(keras_bytes_now(model))
        snapshot = take_snapshot(model, memory)
        model.fit(x, y, epochs=1, verbose=0)  # the snapshot must not see these steps
        pending = snapshot.files_to_write()["model.keras"]
        crc32 = pending.finish()
        content = pending.finished()
        assert crc32 == zlib.crc32(content)  # made from the weights' and the rest's, not a second pass
        got = zip_members(content)
        assert list(got) == list(expected)
        for name in expected:
            if name != "metadata.json":  # holds the time of saving, to the second
                assert got[name] == expected[name], name
        kept = memory._space.values.buffer  # the file's pieces are views of the kept copies
        assert all(np.shares_memory(np.frombuffer(piece, np.uint8), kept)
                   for piece in pending.data._pieces if isinstance(piece, memoryview))
        addresses.append(address_of(kept))
    assert addresses[1] == addresses[2]
    assert "save_own_variables" not in vars(model.optimizer)  # the walk's hand-over is undone


def wide_model() -> keras.Model:
    """About 10 MB of weights and 20 MB of Adam slots: the local store writes it through O_DIRECT,
    in several chunks."""
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1600), keras.layers.Dense(1600),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((4, 8), "float32"), np.ones((4, 1), "float32"), epochs=1, verbose=0)
    return model


def zip_times(content) -> list[bytes]:
    """The DOS time and date of every local header (zipfile stamps them to the second)."""
    content = content.joined() if isinstance(content, Pieces) else content
    with zipfile.ZipFile(io.BytesIO(bytes(content))) as archive:
        return [bytes(content[i.header_offset + 10:i.header_offset + 14]) for i in archive.infolist()]


@pytest.mark.parametrize("values", ["reads", "kept-copies"])
def test_a_model_file_whose_crc_is_computed_while_written_is_the_zip_model_save_writes(tmp_path, values):
    """#47: the local store computes the weights member's CRC-32 while it writes the file (O_DIRECT)
    and fills in the header and central-directory fields last. The file is byte for byte the one
    written with the zip's own CRC (as before), the record's CRC-32 is the file's, and
    `keras.models.load_model` reads it. It is built as pieces, its large values lent, not copied:
    the variables' reads (a synchronous save) or the copies a background save keeps in its
    `SaveMemory`. (Old code: no `crc_later`, no `files_to_write`.)"""
    model = wide_model()
    space = None
    if values == "kept-copies":  # the first snapshot sizes the memory, the next copies into it
        memory = SaveMemory()
        _record_model(model, memory.next_save())
        space = memory.next_save()
    recorded = _record_model(model, space)
    for _ in range(3):  # both zips stamped in the same second
        old = bytes(_keras_bytes(recorded, crc_later=False).finished())
        pending = _keras_bytes(recorded, space, crc_later=True)
        if zip_times(pending.data) == zip_times(old):
            break
    assert compat.zip_crc_later_supported() and pending.span_crc is None  # really left to the writer
    assert len(old) > 2 * direct_io._DIRECT_CHUNK
    large = sum(v.numpy().nbytes for v in model.weights + model.optimizer.variables if v.numpy().nbytes >= 64 << 10)
    assert isinstance(pending.data, Pieces) and pending.data.lent_bytes == large > len(old) * 0.99
    if space is not None:  # lent from the kept copies
        kept = space.values.buffer
        lent = [piece for piece in pending.data._pieces if isinstance(piece, memoryview)]
        assert lent and all(np.shares_memory(np.frombuffer(view, np.uint8), kept) for view in lent)
    entry = LocalStore(tmp_path).commit(3, {layout.MODEL_FILE: pending}, lambda: f"{pending.finish():08x}".encode())
    written = (tmp_path / entry / layout.MODEL_FILE).read_bytes()
    assert written == old
    assert (tmp_path / entry / layout.RECORD_FILE).read_bytes() == f"{zlib.crc32(old):08x}".encode()
    loaded = keras.models.load_model(tmp_path / entry / layout.MODEL_FILE)
    for got, want in zip(loaded.weights, model.weights, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("fields", [(), (5,), (4094,), (4096 * 3 - 2, 4096 * 3 + 9000), ((8 << 20) + 1, 4095)])
def test_blocks_holding_pending_fields_are_written_last_and_all_blocks_once(fields):
    aligned = (8 << 20) * 2 + 4096 * 5
    body, last = direct_io._blocks_in_order(aligned, fields)
    covered = sorted(body + last)
    assert covered[0][0] == 0 and covered[-1][1] == aligned
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:], strict=False))  # no gap, no overlap
    assert all(end - start <= direct_io._DIRECT_CHUNK and start % 4096 == 0 for start, end in covered)
    assert all(any(start <= f + k < end for start, end in last) for f in fields for k in (0, 3))


def test_a_snapshot_whose_memory_a_later_snapshot_took_refuses_to_make_files():
    model, memory = build_model(), SaveMemory()
    model.fit(data(), epochs=1, verbose=0)
    first = take_snapshot(model, memory)
    second = take_snapshot(model, memory)
    with pytest.raises(RuntimeError, match="reused by a later snapshot"):
        first.files()
    assert zip_members(second.files()["model.keras"])


def test_the_file_buffer_reads_back_as_a_file_with_gaps_of_zeros():
    window = _FileBuffer().window(5)
    window.write(b"abc")
    window.seek(6)
    window.write(b"xy")  # a gap after a seek past the end: zeros, as in a real file
    assert bytes(window.view()) == b"abc\0\0\0xy"
    window.truncate(10)
    assert bytes(window.view()) == b"abc\0\0\0xy\0\0"
    window.seek(1)
    assert window.read(3) == b"bc\0"
    target = bytearray(4)
    assert window.readinto(target) == 4 and bytes(target) == b"\0\0xy"


def test_pieces_read_back_as_the_file_written_with_lent_memory_kept_as_views():
    """`Pieces` (a synchronous save's file, #47) against a real file written the same way: writes
    from a lent array's memory are kept as views, others copied; overwrites split pieces, a seek
    past the end leaves zeros, truncate cuts and grows; every read and the CRC-32 agree."""
    lent = np.random.default_rng(0).integers(0, 256, 1 << 18, dtype=np.uint8)
    pieces = Pieces([lent, lent[1000:], lent])  # lent twice or in part (a weight shared by two layers)
    window, real = pieces.window(3), io.BytesIO()
    real.write(bytes(3))

    def both(action):
        action(window)
        action(_Shifted(real, 3))

    both(lambda f: f.write(b"head"))
    count = len(pieces._pieces)
    both(lambda f: (f.seek(1), f.write(b"E"), f.seek(4)))  # inside bytes of its own: in place
    assert len(pieces._pieces) == count
    both(lambda f: f.write(memoryview(lent)[1000:100000]))  # lent: a view
    both(lambda f: f.write(np.arange(70000, dtype=np.uint32).view(np.uint8)))  # not lent: copied
    assert pieces.lent_bytes == 99000
    both(lambda f: (f.seek(600000), f.write(b"xy")))  # a gap of zeros
    both(lambda f: (f.seek(2), f.write(b"ZZZ")))  # across the first piece's end
    both(lambda f: (f.seek(50000), f.write(b"abc")))  # inside the view: split
    both(lambda f: (f.seek(20000), f.write(memoryview(lent)[:70000])))  # a view over a view and copies
    both(lambda f: f.truncate(550000))
    both(lambda f: f.truncate(560000))
    want = real.getvalue()
    assert len(pieces) == len(want) and bytes(pieces.joined()) == want
    assert pieces.lent_bytes == (20000 - 5) + 70000 + (99004 - 90000) and pieces.crc32() == zlib.crc32(want)
    assert pieces.read_at(49990, 20) == want[49990:50010] and pieces.crc32(7, 99999) == zlib.crc32(want[7:99999])
    window.seek(1)
    assert window.read(6) == want[4:10]


class _Shifted:
    """A file object on `stream` whose byte 0 is `stream`'s byte `base` (a window's twin)."""

    def __init__(self, stream, base):
        self.stream, self.base = stream, base

    def write(self, data):
        return self.stream.write(data)

    def seek(self, offset):
        return self.stream.seek(self.base + offset)

    def truncate(self, size):
        self.stream.truncate(self.base + size)
        if self.stream.seek(0, os.SEEK_END) < self.base + size:
            self.stream.write(bytes(self.base + size - self.stream.tell()))


# ---------------------------------------------------------------------------------------------
# Background checkpoints in fit


class SyncCopy(keras.callbacks.Callback):
    """After the checkpoint callback's epoch-end save: a synchronous checkpoint of the same state."""

    def __init__(self, directory: Path, checkpoint) -> None:
        super().__init__()
        self.directory, self.checkpoint = directory, checkpoint

    def on_epoch_end(self, epoch, logs=None):
        # the callback knows the batch size from the batched data it was given; the copy is told it
        save_checkpoint(self.model, self.directory, epoch=epoch + 1, history=self.checkpoint._history,
                        metrics=logs, run=RunRecord(global_batch_size=16))


def test_background_checkpoints_equal_synchronous_ones(tmp_path):
    keras.utils.set_random_seed(0)
    model = build_model()
    checkpoint = kerasdist.checkpoint_callback(tmp_path / "bg", keep=10)
    assert checkpoint.async_save
    model.fit(data(), epochs=3, verbose=0, callbacks=[checkpoint, SyncCopy(tmp_path / "sync", checkpoint)])
    background_ones = kerasdist.list_checkpoints(tmp_path / "bg")
    sync_ones = kerasdist.list_checkpoints(tmp_path / "sync")
    assert [c.global_step for c in background_ones] == [c.global_step for c in sync_ones] == [4, 8, 12]
    for bg, sync in zip(background_ones, sync_ones, strict=True):
        bg_dir, sync_dir = Path(bg.path), Path(sync.path)
        # the callback's checkpoints also keep the data's position, which a plain save has no data for
        assert sorted(p.name for p in bg_dir.iterdir()) == sorted([*(p.name for p in sync_dir.iterdir()), "input.bin"])
        bg_zip, sync_zip = (zip_members((d / "model.keras").read_bytes()) for d in (bg_dir, sync_dir))
        assert list(bg_zip) == list(sync_zip)
        assert bg_zip["model.weights.h5"] == sync_zip["model.weights.h5"]
        assert bg_zip["config.json"] == sync_zip["config.json"]
        assert (bg_dir / "rng.npz").read_bytes() == (sync_dir / "rng.npz").read_bytes()
        bg_record, sync_record = (json.loads((d / "state.json").read_text()) for d in (bg_dir, sync_dir))
        assert bg_record["files"]["model.keras"]["crc32"] == f"{zlib.crc32((bg_dir / 'model.keras').read_bytes()):08x}"
        for record in (bg_record, sync_record):
            record.pop("saved_at")
            record["files"]["model.keras"].pop("crc32")  # the zip's member times differ
        bg_record["files"].pop("input.bin")
        assert bg_record == sync_record
    restored = kerasdist.make_or_restore_model(tmp_path / "bg", build_model)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(
        restored.variables + restored.optimizer.variables, model.variables + model.optimizer.variables, strict=True))
    assert len(checkpoint.blocked_seconds) == 3 and not checkpoint.saver.busy


def test_a_callbacks_synchronous_saves_build_no_buffer_of_the_files_size(tmp_path, monkeypatch):
    """Memory this VM has taken back after a save freed it costs seconds a GB to touch again
    (bench/README.md, checkpoints at scale): a callback's synchronous saves build their files as
    pieces, views of the variables' reads (#47), and allocate no buffer of the file's size (they
    used to keep one from save to save); the checkpoints are the ones a plain synchronous save
    writes."""
    from kerasdist.checkpoint import snapshot as snapshot_module

    made = []  # every page-aligned file buffer allocated, by size
    monkeypatch.setattr(snapshot_module, "_page_aligned",
                        lambda size, _real=snapshot_module._page_aligned: (made.append(size), _real(size))[1])
    built = []  # every model.keras a save made
    monkeypatch.setattr(snapshot_module, "_keras_bytes",
                        lambda *a, _real=snapshot_module._keras_bytes, **k: built.append(_real(*a, **k)) or built[-1])
    keras.utils.set_random_seed(0)
    model = build_model()
    checkpoint = kerasdist.checkpoint_callback(tmp_path / "kept", keep=10, async_save=False)
    model.fit(data(), epochs=3, verbose=0, callbacks=[checkpoint, SyncCopy(tmp_path / "plain", checkpoint)])
    kept, plain = kerasdist.list_checkpoints(tmp_path / "kept"), kerasdist.list_checkpoints(tmp_path / "plain")
    assert [c.global_step for c in kept] == [c.global_step for c in plain] == [4, 8, 12]  # CRC-32s verified
    for ours, theirs in zip(kept, plain, strict=True):
        ours_zip, theirs_zip = (zip_members((Path(c.path) / "model.keras").read_bytes()) for c in (ours, theirs))
        assert ours_zip["model.weights.h5"] == theirs_zip["model.weights.h5"]
    assert len(built) == 6 and all(isinstance(b.data, Pieces) for b in built)
    assert made == []


@pytest.mark.parametrize("async_save", [False, True], ids=["synchronous", "background"])
def test_a_fits_save_memory_is_sized_and_touched_before_its_first_save(tmp_path, monkeypatch, async_save):
    """A fit's first save paid the first touch of a state-sized buffer on the training thread
    (seconds a GB here: bench/README.md, checkpoints at scale). The callback sizes the memory its
    background saves copy the values into from the model's state after the fit's first step, when
    a fresh model's optimizer has made its slots (Adam's two: twice the weights, more than the
    sizing's margins here), and touches it in a thread: no save of the fit allocates another. The
    files are built as pieces: no save allocates a file buffer."""
    from kerasdist.checkpoint import snapshot as snapshot_module

    made = []  # every page-aligned file buffer allocated, by size
    monkeypatch.setattr(snapshot_module, "_page_aligned",
                        lambda size, _real=snapshot_module._page_aligned: (made.append(size), _real(size))[1])
    held_at_end = {}
    release = snapshot_module.SaveMemory.release

    def noting_release(memory):
        held_at_end.update(file=memory._space.file.array, values=memory._space.values.buffer, made=len(made))
        release(memory)

    monkeypatch.setattr(snapshot_module.SaveMemory, "release", noting_release)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(1024), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")  # 4 MB of weights, 8 MB of slots once built
    x = np.random.default_rng(0).normal(size=(32, 1024)).astype("float32")
    checkpoint = kerasdist.checkpoint_callback(tmp_path, keep=10, async_save=async_save)
    memory, second = checkpoint.saver._memory, {}

    def at_second_step(batch, logs):
        if batch == 1:
            second.update(file=memory._space.file.array, values=memory._space.values.buffer, made=len(made))

    model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0, shuffle=False,
              callbacks=[checkpoint, keras.callbacks.LambdaCallback(on_train_batch_begin=at_second_step)])
    assert [c.global_step for c in kerasdist.list_checkpoints(tmp_path)] == [4, 8]
    assert made == [] and held_at_end["file"].size == 0
    if not async_save:
        assert held_at_end["values"].size == 0
        return
    assert second["values"].size > 12e6
    assert held_at_end["values"] is second["values"]


def test_a_second_prepare_waits_for_the_first_touching_thread(monkeypatch):
    """A fit that raised leaves its SaveMemory's touching thread running (no end of fit released
    it); the next fit's `prepare` reuses the same memory, so it waits for that thread, which would
    otherwise write into the values the next saves copy there."""
    from kerasdist.checkpoint import snapshot as snapshot_module

    active, most, lock = [0], [0], threading.Lock()

    def slow_touch(arrays):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.3)
        with lock:
            active[0] -= 1

    monkeypatch.setattr(snapshot_module, "_touch", slow_touch)
    model = build_model()
    model.fit(data(), epochs=1, verbose=0)
    memory = SaveMemory()
    memory.prepare(model, values=True)
    memory.prepare(model, values=True)
    memory.release()
    assert most[0] == 1


def failing_save_files(monkeypatch, fail_on: int) -> list[int]:
    """Fault injection: the `fail_on`-th commit (1-based) fails as a full disk would."""
    calls: list[int] = []
    original = CheckpointManager.commit

    def commit(self, taken, progress):
        calls.append(taken.global_step)
        if len(calls) == fail_on:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, taken, progress)

    monkeypatch.setattr(CheckpointManager, "commit", commit)
    return calls


@pytest.mark.parametrize("fail_on, raised_at_step", [(1, 8), (3, 12)], ids=["next-save", "end-of-fit"])
def test_an_error_in_a_background_save_is_raised_at_the_next_save_or_the_end_of_fit(
        tmp_path, monkeypatch, fail_on, raised_at_step):
    calls = failing_save_files(monkeypatch, fail_on)
    model = build_model()
    checkpoint = kerasdist.checkpoint_callback(tmp_path, keep=10)
    with pytest.raises(background.BackgroundSaveError, match=r"ckpt-\d+ .*failed: OSError.*No space left") as raised:
        model.fit(data(), epochs=3, verbose=0, callbacks=[checkpoint])
    assert isinstance(raised.value.error, OSError) and raised.value.error.errno == errno.ENOSPC
    assert len(calls) == fail_on  # raised before any later save was started
    assert int(model.optimizer.iterations.numpy()) == raised_at_step  # the next save's step, or the end
    kept = [c.global_step for c in kerasdist.list_checkpoints(tmp_path)]
    assert kept == [step for i, step in enumerate(calls, start=1) if i != fail_on]
    assert not list(tmp_path.glob(".tmp-*"))
    checkpoint.wait()  # raised once, not again
    if fail_on == 3:  # raised by on_train_end: the run log does not call this fit completed
        log = next((tmp_path / "runs").glob("*.jsonl")).read_text()
        events = [json.loads(line)["event"] for line in log.splitlines()]
        assert "train_end" not in events, events


def test_at_most_one_save_in_flight_and_training_goes_on_meanwhile(tmp_path, monkeypatch):
    # seconds per commit: a save that waits for one stands well apart from one that does not (the first
    # save, which waits for none, blocked 0.40 s under load: 1.5 s commits left it half of that to spare)
    slow = 3.0
    active, most, steps_after_write = [0], [0], []
    original = CheckpointManager.commit
    model = build_model()

    def slow_commit(self, taken, progress):
        active[0] += 1
        most[0] = max(most[0], active[0])
        time.sleep(slow)
        steps_after_write.append(int(model.optimizer.iterations.numpy()))
        active[0] -= 1
        return original(self, taken, progress)

    monkeypatch.setattr(CheckpointManager, "commit", slow_commit)
    checkpoint = kerasdist.checkpoint_callback(tmp_path, every_steps=2, keep=10)
    model.fit(data(), epochs=2, verbose=0, callbacks=[checkpoint])
    assert most[0] == 1
    assert [c.global_step for c in kerasdist.list_checkpoints(tmp_path)] == [2, 4, 6, 8]
    assert steps_after_write[0] == 4  # training went on to the next save while ckpt-2 was written
    assert checkpoint.blocked_seconds[0] < slow / 2 <= checkpoint.blocked_seconds[1]  # the second waited


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_writer_takes_only_idle_cpu_until_somebody_waits_for_it():
    writer, release, running = background.BackgroundWriter(), threading.Event(), threading.Event()
    writer._last_submit -= 600  # the next save is 10 minutes away: the timer stays out of this test

    def job():
        running.set()
        release.wait(30)

    writer.submit(job, "a test job")
    assert running.wait(30)
    writer_id = writer._thread.native_id
    assert os.sched_getscheduler(writer_id) == os.SCHED_IDLE
    waiter = threading.Thread(target=writer.wait)
    waiter.start()
    deadline = time.monotonic() + 30
    while os.sched_getscheduler(writer_id) != os.SCHED_OTHER and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.sched_getscheduler(writer_id) == os.SCHED_OTHER  # raised while the waiter waits
    release.set()
    waiter.join(30)
    assert not writer.busy


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_an_unwaited_writer_is_raised_halfway_to_the_next_save():
    """Where training leaves no core idle, a writer kept idle would barely run and the next save
    would wait for the whole write: after half the time between saves it competes as an equal."""
    writer, release, policies = background.BackgroundWriter(), threading.Event(), []
    writer._last_submit -= 3.0  # the last save was 3 s ago: idle for 1.5 s

    def job():
        policies.append(os.sched_getscheduler(0))
        deadline = time.monotonic() + 30
        while os.sched_getscheduler(0) != os.SCHED_OTHER and time.monotonic() < deadline:
            time.sleep(0.01)
        policies.append((os.sched_getscheduler(0), time.monotonic() - started))
        release.wait(30)

    started = time.monotonic()
    writer.submit(job, "a test job")
    deadline = time.monotonic() + 30
    while len(policies) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    writer.wait()
    assert policies[0] == os.SCHED_IDLE
    assert policies[1][0] == os.SCHED_OTHER and 1.4 < policies[1][1] < 20  # raised with nobody waiting


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_a_wait_before_the_writer_lowers_itself_keeps_it_at_normal_priority():
    priority, policies = background._IdleWhileUnwaited(), []

    def writer_start():
        priority.lower_until_waited_for()
        policies.append(os.sched_getscheduler(0))

    priority.waited_for()
    thread = threading.Thread(target=writer_start)
    thread.start()
    thread.join(30)
    assert policies == [os.SCHED_OTHER]


# ---------------------------------------------------------------------------------------------
# Killed in the middle of a background write (real processes)


def run_until_writing(command: list[str], writes: int, sig: int) -> tuple[int, str]:
    """Run `command`, send `sig` once it has printed its `writes`-th "writing ckpt-"; (exit code, output)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output, seen = [], 0
    for line in process.stdout:
        output.append(line)
        if "writing ckpt-" in line:
            seen += 1
            if seen == writes:
                process.send_signal(sig)
                break
    output.extend(process.stdout)
    return process.wait(timeout=300), "".join(output)


@pytest.fixture(scope="module")
def reference(made_once) -> Path:
    """An uninterrupted run that saves synchronously: the background runs must end bitwise equal."""

    def make(workdir: Path) -> Path:
        code, _, tail = kill_resume.run(script(workdir / "ckpt", workdir / "reference.npz", "--sync-save"))
        assert code == 0, tail
        return workdir / "reference.npz"

    return made_once("background-save-reference", make)


def script(ckpt: Path, out: Path, *extra: str) -> list[str]:
    return [*kill_resume.VARIANTS["default"].command(ckpt, out), "--every-steps", "6", *extra]


def test_kill_9_during_a_background_write_keeps_the_previous_checkpoint_and_resumes_bitwise(tmp_path, reference):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.npz"
    code, output = run_until_writing(script(ckpt, out, "--slow-write", "3"), writes=2, sig=signal.SIGKILL)
    assert code == -signal.SIGKILL, output[-2000:]
    assert [c.global_step for c in kerasdist.list_checkpoints(ckpt)] == [6]
    assert [p.name.split("-")[2] for p in ckpt.glob(".tmp-ckpt-*")] == ["12"]  # the write it was in
    code, _ = kill_resume.train(ckpt, out)
    assert code == 0
    assert kill_resume.compare(reference, out) == (True, 0.0)
    assert not list(ckpt.glob(".tmp-ckpt-*"))


def test_sigterm_during_a_background_write_waits_for_it_then_saves_and_exits_75(tmp_path, reference):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.npz"
    command = script(ckpt, out, "--slow-write", "1", "--keep", "100")
    code, output = run_until_writing(command, writes=2, sig=signal.SIGTERM)
    assert code == kerasdist.PREEMPTED_EXIT_CODE, output[-2000:]
    steps = [c.global_step for c in kerasdist.list_checkpoints(ckpt)]
    last = max(int(line.split()[1]) for line in output.splitlines() if line.startswith("step "))
    # The write in flight was committed, then the stop saved where training stopped. On a loaded
    # machine the signal may be handled a save or two later (the test reads the child's output late).
    assert steps[:2] == [6, 12] and steps[-1] == last > 12, (steps, last)
    assert all(step % 6 == 0 for step in steps[:-1]), steps
    assert not list(ckpt.glob(".tmp-ckpt-*"))
    code, _ = kill_resume.train(ckpt, out)
    assert code == 0
    assert kill_resume.compare(reference, out) == (True, 0.0)


def test_custom_fit_refuses_an_async_save_that_is_not_logical_before_touching_anything(tmp_path):
    with pytest.raises(ValueError, match="async_save must be True or False"):
        kerasdist.custom_fit(build_model, data(), epochs=1, checkpoint_dir=tmp_path / "ckpt", async_save="yes")
    assert not (tmp_path / "ckpt").exists()
