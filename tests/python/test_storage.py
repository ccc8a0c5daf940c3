"""Checkpoints on object storage: URLs, memory:// unit tests, and real S3 and GCS servers
(SeaweedFS, fake-gcs-server).

One server of each kind serves the whole module (`s3` fixture, ~5 s to start; `gcs`, under 1 s)
and is always stopped; tests that run on both take the `store` fixture. Object-store damage rows
come from tests/cases/checkpoint.json (`object_damage`), read by the R suite too.
"""

from __future__ import annotations

import errno
import functools
import gc
import hashlib
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
import zlib
from pathlib import Path

import fsspec
import keras
import numpy as np
import pytest

import kerasdist
from conftest import CASES_DIR
from kerasdist import compat
from kerasdist.checkpoint import checksums, layout
from kerasdist.checkpoint import manager as checkpoint_manager
from kerasdist.checkpoint import store as stores
from kerasdist.checkpoint.background import wait_for_all
from kerasdist.checkpoint.checksums import PendingCrc
from kerasdist.checkpoint.pieces import Pieces
from kerasdist.checkpoint.store import direct_io
from kerasdist.checkpoint.store import object as object_store
from kerasdist_cli import main
from kerasdist_testing.gcs_test_server import start_gcs_server
from kerasdist_testing.s3_test_server import start_s3_server
from kerasdist_testing.server_process import SilentEndpoint

CASES = json.loads((CASES_DIR / "checkpoint.json").read_text())
ROOT = Path(__file__).resolve().parents[2]
TRAIN_SCRIPT = ROOT / "tests" / "python" / "scripts" / "train_resumable.py"
BATCHES_PER_EPOCH = 4
X = np.linspace(0, 1, 48, dtype="float32").reshape(16, 3)


def build_model(units: int = 4) -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def fit(checkpoint_dir: str, epochs: int, keep: int = 5, **args) -> keras.callbacks.History:
    keras.utils.set_random_seed(7)
    return kerasdist.distributed_fit(build_model, X, X.sum(1), epochs=epochs, checkpoint_dir=checkpoint_dir,
                                     strategy="default", batch_size=4, keep=keep, verbose=0, **args)


def serve(start):
    server = start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3():
    yield from serve(start_s3_server)


@pytest.fixture(scope="module")
def gcs():
    yield from serve(start_gcs_server)


@pytest.fixture(params=["s3", "gcs"])
def store(request):
    """The S3 or the GCS test server (both have `scheme`, `storage_options()`, `environment()`,
    `filesystem()`, `make_bucket()`, `stop(remove=False)` and `start()`)."""
    return request.getfixturevalue(request.param)


def new_url(server) -> str:
    return f"{server.scheme}://{server.make_bucket()}/run"


def root_of(url: str) -> str:
    return url.split("://", 1)[1]


def objects(fs, root: str) -> dict[str, tuple[int, str]]:
    """Every object under `root` with its size and content digest."""
    fs.invalidate_cache()
    return {path: (len(data), str(hash(data))) for path, data in sorted(fs.cat(fs.find(root)).items())}


# --------------------------------------------------------------------------------------------
# URLs and arguments (no server)


def test_a_url_is_never_a_local_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"checkpoint_dir 's3://kerasdist-no-such/run' cannot be reached"):
        fit("s3://kerasdist-no-such/run", 1, storage_options={
            "key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
            "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}})
    url = f"memory://kerasdist-{uuid.uuid4().hex[:8]}/run"
    fit(url, 1)
    assert list(tmp_path.iterdir()) == []  # nothing named s3: or memory: in the working directory
    assert [c.path for c in kerasdist.list_checkpoints(url)] == [f"{url}/ckpt-{BATCHES_PER_EPOCH}"]


def test_a_missing_plugin_is_named_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if gcsfs were not installed
    with pytest.raises(ImportError, match=re.escape("needs the gcsfs package, which is not installed: "
                                                    "pip install 'kerasdist[gcs]' (or gcsfs); from R: "
                                                    'kerasdist::kerasdist_py_require(storage = "gcs")')):
        kerasdist.make_or_restore_model("gs://bucket/run", build_model)
    with pytest.raises(ImportError, match="gcsfs"):
        fit("gs://bucket/run", 1)


def test_both_stores_offer_the_whole_store_protocol(tmp_path):
    for checkpoint_dir in (tmp_path, "memory://kerasdist-protocol/run"):
        assert isinstance(stores.open_store(checkpoint_dir), stores.Store), checkpoint_dir


@pytest.mark.parametrize("where", ["local", "memory"])
def test_verified_files_checks_a_checkpoint_on_either_store(where, tmp_path):
    """`record.verified_files` (an object-store restore's check) holds for a local store too, whose
    `summed_files` keeps the Store protocol whole: an intact checkpoint passes, a byte changed in
    place (its size intact) is refused by its checksum."""
    from kerasdist.checkpoint.record import read_candidate, verified_files

    url = str(tmp_path / "run") if where == "local" else memory_url()
    fit(url, 1)
    store = stores.open_store(url)
    entry = f"ckpt-{BATCHES_PER_EPOCH}"
    _, _, record = read_candidate(store, entry)
    with verified_files(store, entry, record) as (problem, local):
        assert problem is None and (local / "model.keras").read_bytes() == store.read(entry, "model.keras")
    data = bytearray(store.read(entry, "model.keras"))
    data[len(data) // 2] ^= 0xFF
    if where == "local":
        (tmp_path / "run" / entry / "model.keras").write_bytes(bytes(data))
    else:
        fsspec.filesystem("memory").pipe_file(f"{root_of(url)}/{entry}/model.keras", bytes(data))
    with verified_files(store, entry, record) as (problem, _):
        assert problem == f"{store.path_of(entry)}/model.keras does not match its recorded checksum (corrupted)"


def test_file_urls_are_local_directories_with_the_local_layout(tmp_path):
    fit(f"file://{tmp_path}/run", 1)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [f"ckpt-{BATCHES_PER_EPOCH}", "runs"]
    assert kerasdist.latest_checkpoint(tmp_path / "run").path == str(tmp_path / "run" / f"ckpt-{BATCHES_PER_EPOCH}")
    with pytest.raises(ValueError, match="is not a local file:// URL"):
        kerasdist.list_checkpoints("file://otherhost/run")


@pytest.mark.parametrize("size", [(4 << 20) + 123, 3 * (8 << 20), (4 << 20) - 1])
def test_local_files_are_written_whole_with_or_without_the_page_cache(tmp_path, size):
    """Large files go through O_DIRECT (in aligned chunks of a reused buffer, the unaligned tail
    appended), small ones through the page cache; either way the file holds exactly the bytes."""
    data = os.urandom(size)
    store = stores.LocalStore(tmp_path)
    entry = store.commit(7, {layout.MODEL_FILE: data}, lambda: b"{}")
    assert (tmp_path / entry / layout.MODEL_FILE).read_bytes() == data
    if size >= direct_io._DIRECT_MIN_BYTES:
        assert direct_io._write_direct(tmp_path / "direct", data) is True  # not refused here
        assert (tmp_path / "direct").read_bytes() == data


def test_a_page_aligned_file_is_written_from_where_it_is(tmp_path, monkeypatch):
    """O_DIRECT writes of bytes that start on a page boundary (a save's file buffer) go from them,
    without the copy through the reused buffer; unaligned bytes still go through it. Either way the
    file holds exactly the bytes."""
    from kerasdist.checkpoint.snapshot import _page_aligned

    data = os.urandom((8 << 20) + 4096 + 77)
    aligned = _page_aligned(len(data))
    aligned[:] = np.frombuffer(data, np.uint8)
    monkeypatch.setattr(direct_io, "_direct_buffer", None)
    assert direct_io._write_direct(tmp_path / "aligned", memoryview(aligned)) is True
    assert direct_io._direct_buffer is None  # never needed
    assert (tmp_path / "aligned").read_bytes() == data
    assert direct_io._write_direct(tmp_path / "unaligned", memoryview(aligned)[1:]) is True
    assert direct_io._direct_buffer is not None
    assert (tmp_path / "unaligned").read_bytes() == data[1:]


def test_a_filesystem_refusing_o_direct_gets_the_buffered_write(tmp_path, monkeypatch):
    """Where O_DIRECT is refused (EINVAL: some network and FUSE filesystems, older tmpfs) at open
    or at the first aligned write, the file is written through the page cache instead. The
    refusal is injected: every filesystem here takes O_DIRECT."""
    data = os.urandom((4 << 20) + 5)
    real_open, real_write = os.open, os.write
    for refuse in ("open", "write"):
        def refusing_open(path, flags, *args, _refuse=refuse):
            if _refuse == "open" and flags & os.O_DIRECT:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_open(path, flags, *args)

        def refusing_write(fd, view, _refuse=refuse):
            if _refuse == "write":
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_write(fd, view)

        monkeypatch.setattr(os, "open", refusing_open)
        monkeypatch.setattr(os, "write", refusing_write)
        assert direct_io._write_direct(tmp_path / refuse, data) is False
        assert not (tmp_path / refuse).exists()
        direct_io.write_durably(tmp_path / refuse, data)
        monkeypatch.undo()
        assert (tmp_path / refuse).read_bytes() == data


@pytest.mark.parametrize("refuse", [None, "open"], ids=["o-direct", "refused"])
def test_pieces_are_written_whole_with_their_crc_and_never_joined(tmp_path, monkeypatch, refuse):
    """A synchronous save's file as `Pieces` (views of lent arrays between bytes of its own, #47),
    its CRC-32 fields filled in as it is written: the file is the bytes, whether O_DIRECT takes it
    (copied through the reused buffer) or refuses it (the page cache, a view at a time). Neither
    joins the pieces into a buffer of the file's size."""
    lent = np.frombuffer(os.urandom((5 << 20) + 11), np.uint8)
    pieces = Pieces([lent])
    pieces.write_at(0, b"head" + bytes(8))  # the CRC-32's field: bytes 4-8
    pieces.write_at(12, memoryview(lent))
    pieces.write_at(12 + lent.size, b"tail")
    assert pieces.lent_bytes == lent.size
    monkeypatch.setattr(Pieces, "joined", lambda self: pytest.fail("the pieces were joined"))
    if refuse:
        real_open = os.open
        monkeypatch.setattr(os, "open", lambda path, flags, *args: (_ for _ in ()).throw(
            OSError(errno.EINVAL, "Invalid argument")) if flags & os.O_DIRECT else real_open(path, flags, *args))
    pending = PendingCrc(pieces, 12, 12 + lent.size, fields=(4,))
    direct_io.write_durably(tmp_path / "file", pending)
    expected = b"head" + struct.pack("<I", zlib.crc32(lent)) + bytes(4) + lent.tobytes() + b"tail"
    assert (tmp_path / "file").read_bytes() == expected
    assert pending.finish() == zlib.crc32(expected)


@pytest.mark.parametrize("first, second", [(0, 0), (0, 9), (9, 0), (1, 1), (300, 7), (5, (1 << 20) + 3)])
def test_crc32_combine_is_the_crc32_of_the_joined_bytes(first, second):
    a, b = os.urandom(first), os.urandom(second)
    assert checksums.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


class _Trickling:
    """A stream with only read(), handing out at most `most` bytes per call."""

    def __init__(self, data: bytes, most: int):
        self._data, self._position, self._most = data, 0, most

    def read(self, size: int) -> bytes:
        chunk = self._data[self._position:self._position + min(size, self._most)]
        self._position += len(chunk)
        return chunk


class _TricklingInto(_Trickling):
    """The same through readinto(): short reads."""

    def readinto(self, buffer: bytearray) -> int:
        chunk = self.read(len(buffer))
        buffer[:len(chunk)] = chunk
        return len(chunk)


@pytest.mark.parametrize("size", [0, 1, checksums._CHUNK - 1, checksums._CHUNK, 2 * checksums._CHUNK + 17])
def test_checksums_read_ahead_of_the_summing_are_those_of_the_bytes(tmp_path, size):
    """The verification's checksum (the next chunk read in a thread while this one is summed) is
    the CRC-32 and SHA-256 of the file's bytes, whatever the chunks the stream hands out: a file,
    a stream of short reads into the buffer, a stream with only read()."""
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    expected = {"crc32": f"{zlib.crc32(data):08x}", "sha256": hashlib.sha256(data).hexdigest()}
    for algorithm, checksum in expected.items():
        with open(tmp_path / "f", "rb", buffering=0) as raw:
            assert checksums.checksum_of_stream(raw, algorithm) == checksum
        for stream in (_Trickling(data, (1 << 20) + 3), _TricklingInto(data, (1 << 20) + 3)):
            assert checksums.checksum_of_stream(stream, algorithm) == checksum


def test_keras_public_save_still_refuses_file_objects(tmp_path):
    """compat.keras_model_bytes calls Keras's saving library because the public save_model refuses
    a file object; when this fails, upstream takes them and the shim can go."""
    model = build_model()
    with pytest.raises(ValueError, match="Invalid filepath extension"):
        keras.saving.save_model(model, io.BytesIO())
    (tmp_path / "m.keras").write_bytes(compat.keras_model_bytes(model))
    restored = keras.saving.load_model(tmp_path / "m.keras")
    for a, b in zip(restored.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------------------
# The object-store protocol, on memory:// and on the S3 and GCS servers


def memory_url() -> str:
    return f"memory://kerasdist-{uuid.uuid4().hex[:8]}/run"


def place_on(where: str, request) -> tuple[str, dict | None, fsspec.AbstractFileSystem, str]:
    """A fresh checkpoint_dir on `where` ("memory", "s3" or "gcs"): its URL, its storage_options,
    a filesystem of the test's own on that store, and the URL's path there."""
    if where == "memory":
        url, memory = memory_url(), fsspec.filesystem("memory")
        return url, None, memory, memory._strip_protocol(url)
    server = request.getfixturevalue(where)
    url = new_url(server)
    return url, server.storage_options(), server.filesystem(), root_of(url)


class _Crash(BaseException):
    """A crash at a chosen point of an upload."""


@pytest.mark.parametrize("where", ["memory", "s3", "gcs"])
def test_a_resave_of_a_step_never_destroys_its_only_checkpoint_before_its_record(where, request, monkeypatch):
    url, options, fs, root = place_on(where, request)
    fit(url, 1, storage_options=options)
    manager = kerasdist.CheckpointManager(url, storage_options=options)
    model = build_model()
    manager.restore(model)
    before = [c.path for c in manager.checkpoints()]
    pipe = manager.store.fs.pipe_file

    def crash_at_the_record(path, data, **kwargs):
        if path.endswith("/state.json"):
            raise _Crash
        return pipe(path, data, **kwargs)

    monkeypatch.setattr(manager.store.fs, "pipe_file", crash_at_the_record)
    with pytest.raises(_Crash):
        manager.save(model, epoch=1)  # the same step again, keep=1 in effect: crashed mid-upload
    monkeypatch.undo()
    assert [c.path for c in kerasdist.list_checkpoints(url, storage_options=options)] == before  # intact, listed
    manager.save(model, epoch=1, metrics={"again": 1.0})
    (only,) = kerasdist.list_checkpoints(url, storage_options=options)
    assert only.metrics == {"again": 1.0} and re.search(r"/ckpt-4\.s\d{20}$", only.path)
    fs.invalidate_cache()
    assert entries_in(fs, root) == [only.path.rsplit("/", 1)[-1]]


def test_pruning_deletes_the_record_first():
    url = memory_url()
    fit(url, 3)
    manager = kerasdist.CheckpointManager(url)
    calls = []
    fs = manager.store.fs
    rm_file, rm = fs.rm_file, fs.rm
    fs.rm_file = lambda path, **kw: calls.append(("rm_file", path.rsplit("/", 2)[-2:])) or rm_file(path, **kw)
    fs.rm = lambda path, **kw: calls.append(("rm", path.rsplit("/", 1)[-1:])) or rm(path, **kw)
    try:
        removed = manager.prune(keep=1)
    finally:
        del fs.rm_file, fs.rm
    assert [r.rsplit("/", 1)[-1] for r in removed] == ["ckpt-4", "ckpt-8"]
    assert calls[:2] == [("rm_file", ["ckpt-4", "state.json"]), ("rm", ["ckpt-4"])]
    assert [c.epoch for c in kerasdist.list_checkpoints(url)] == [3]


# --------------------------------------------------------------------------------------------
# Damage on object stores (tests/cases/checkpoint.json object_damage), on memory://, S3 and GCS


@pytest.fixture(scope="module")
def two_epochs() -> tuple[str, list[np.ndarray]]:
    """fit(url, 2) on memory://, once: its URL and the weights it ended with."""
    url = memory_url()
    return url, fit(url, 2).model.get_weights()


@pytest.fixture(scope="module")
def object_template(two_epochs):
    """Two epoch-end checkpoints (epochs 1 and 2) on memory://, copied per test."""
    return two_epochs[0]


def copy_objects(source_fs, source_root: str, target_fs, target_root: str) -> None:
    for path, data in source_fs.cat(source_fs.find(source_root)).items():
        target_fs.pipe_file(target_root + path[len(source_root):], data)


def damage(fs, path: str, row: dict) -> None:
    how, data = row["how"], fs.cat_file(path)
    if how == "truncate":
        fs.pipe_file(path, data[: len(data) // 2])
    elif how == "garble":
        garbled = bytearray(data)
        garbled[len(data) // 2: len(data) // 2 + 16] = bytes(16)
        garbled[0:1] = b"\xff"
        fs.pipe_file(path, bytes(garbled))
    elif how == "delete":
        fs.rm_file(path)
    elif how == "edit":
        record = json.loads(data)
        record[row["key"]] = row["value"]
        fs.pipe_file(path, json.dumps(record).encode())
    else:
        raise AssertionError(how)


def test_a_download_matching_its_record_is_loaded_in_place(object_template, tmp_path, monkeypatch):
    """An object store's checkpoint is loaded in place (compat.load_keras_weights, no zip CRC)
    from the download checked against its record, the values load_weights loads."""
    memory = fsspec.filesystem("memory")
    url = memory_url()
    copy_objects(memory, memory._strip_protocol(object_template), memory, memory._strip_protocol(url))
    in_place, real = [], compat.load_keras_weights
    monkeypatch.setattr(compat, "load_keras_weights", lambda model, path: in_place.append(path) or real(model, path))
    model = kerasdist.make_or_restore_model(url, build_model)
    assert len(in_place) == 1
    newest = kerasdist.latest_checkpoint(url)
    (tmp_path / "model.keras").write_bytes(memory.cat_file(f"{newest.path}/model.keras"))
    expected = build_model()
    expected.optimizer.build(expected.trainable_variables)
    expected.load_weights(tmp_path / "model.keras")
    for got, want in zip([*model.weights, *model.optimizer.variables],
                         [*expected.weights, *expected.optimizer.variables], strict=True):
        assert got.numpy().tobytes() == want.numpy().tobytes()


def s3_gets(monkeypatch) -> list[tuple[str, str, int]]:
    """(entry, file, bytes) of every GET s3fs makes from now until the test's monkeypatch undoes it."""
    import s3fs

    fetched, call = [], s3fs.S3FileSystem._call_s3

    async def counting(self, method, *args, **kwargs):
        response = await call(self, method, *args, **kwargs)
        if method == "get_object":
            fetched.append((kwargs["Key"].rsplit("/", 2)[-2], kwargs["Key"].rsplit("/", 1)[-1],
                            int(response["ContentLength"])))
        return response

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counting)
    return fetched


@pytest.mark.parametrize("how", ["make_or_restore_model", "distributed_fit"])
def test_a_restore_from_s3_downloads_the_checkpoint_it_loads_once_and_no_other(s3, object_template, monkeypatch,
                                                                              how):
    """A fresh process's restore (a manager that verified nothing yet) GETs the newest
    checkpoint's files once each, whole: the check against the record is made on that download as
    it arrives, not on a read of its own. make_or_restore_model reads no older checkpoint (a
    listing verifies them when one is asked for); distributed_fit's resume, whose settings are
    checked against the checkpoint it restores before the model is built, reads it once too
    (reading only the records for that check), and after its save its pruning lists the rest."""
    url, options = new_url(s3), s3.storage_options()
    memory = fsspec.filesystem("memory")
    copy_objects(memory, memory._strip_protocol(object_template), s3.filesystem(), root_of(url))  # fit(url, 2)'s
    entry = kerasdist.latest_checkpoint(url, storage_options=options).path.rsplit("/", 1)[-1]
    gc.collect()  # the listing's manager, which verified the checkpoints, is gone: as in a new process
    fetched = s3_gets(monkeypatch)
    if how == "make_or_restore_model":
        model = kerasdist.make_or_restore_model(url, build_model, storage_options=options)
        assert int(model.optimizer.iterations.numpy()) == 2 * BATCHES_PER_EPOCH
    else:
        history = fit(url, 3, storage_options=options)
        assert history.epoch == [0, 1, 2] and int(history.model.optimizer.iterations.numpy()) == 3 * BATCHES_PER_EPOCH
    monkeypatch.undo()
    sizes = {name: item["size"] for name, item in
             json.loads(s3.filesystem().cat_file(f"{root_of(url)}/{entry}/state.json"))["files"].items()}
    got = {}
    for where, name, size in fetched:
        if name != "state.json":  # records: read by the listing, small
            got[where, name] = got.get((where, name), 0) + size
    restored = {key: size for key, size in got.items() if key[0] == entry}
    assert restored == {(entry, name): size for name, size in sizes.items()}
    if how == "make_or_restore_model":
        assert got == restored


@pytest.mark.parametrize("case", ["newest differs", "newest differs, damaged", "newest damaged, older differs"])
def test_a_settings_refusal_names_the_checkpoint_the_restore_would_load(case):
    """distributed_fit refuses a checkpoint trained with other settings before it builds the model
    or writes anything, naming the checkpoint its restore would load: a damaged newest one, which
    the restore skips, is neither named nor a reason to refuse (its size intact: only its
    checksum, read in full, tells)."""
    url = memory_url()
    memory = fsspec.filesystem("memory")
    root = memory._strip_protocol(url)
    older_differs = case == "newest damaged, older differs"
    fit(url, 1, gradient_accumulation_steps=2 if older_differs else None)
    model = build_model()
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(2 * BATCHES_PER_EPOCH)
    run = kerasdist.checkpoint.RunRecord({"gradient_accumulation_steps": None if older_differs else 2})
    newest = kerasdist.checkpoint.save_checkpoint(model, url, epoch=2, run=run)
    if "damaged" in case:
        damage(memory, f"{root}/ckpt-8/model.keras", {"how": "garble"})
    del model
    gc.collect()
    before, built = objects(memory, root), []

    def build():
        built.append(1)
        return build_model()

    def run():
        return kerasdist.distributed_fit(build, X, X.sum(1), epochs=2, checkpoint_dir=url, strategy="default",
                                         batch_size=4, verbose=0)

    if case == "newest differs, damaged":
        with pytest.warns(kerasdist.CheckpointWarning, match="ckpt-8/model.keras does not match"):
            history = run()
        assert history.epoch == [0, 1]  # resumed from the older checkpoint, whose settings agree
        return
    refused = newest.path if case == "newest differs" else url + "/ckpt-4"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kerasdist.CheckpointWarning)
        with pytest.raises(ValueError, match=f"differs from the checkpoint {re.escape(refused)},"):
            run()
    assert built == [] and objects(memory, root) == before


@pytest.mark.parametrize("where", ["memory", "s3", "gcs"])
@pytest.mark.parametrize("how", ["garble", "truncate"])
def test_an_object_damaged_after_the_listing_is_refused_for_the_previous_checkpoint(object_template, where, how,
                                                                                  request, monkeypatch, tmp_path):
    """The newest checkpoint, valid when listed, is damaged just before its files are read for
    the restore (another writer, a bad disk): the restore refuses what it downloads, as a listing
    would have, and restores the checkpoint before it."""
    memory = fsspec.filesystem("memory")
    url, options, fs, root = place_on(where, request)
    copy_objects(memory, memory._strip_protocol(object_template), fs, root)
    newest = kerasdist.latest_checkpoint(url, storage_options=options)
    checked = checkpoint_manager.check_signature

    def damage_then_check(model, signature, path):
        if path == newest.path:
            damage(fs, f"{root}/{newest.path.rsplit('/', 1)[-1]}/model.keras", {"how": how})
        return checked(model, signature, path)

    monkeypatch.setattr(checkpoint_manager, "check_signature", damage_then_check)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    warning = "does not match its recorded checksum" if how == "garble" else "truncated or replaced"
    with pytest.warns(kerasdist.CheckpointWarning, match=re.escape(warning)):
        model = kerasdist.make_or_restore_model(url, build_model, storage_options=options)
    assert int(model.optimizer.iterations.numpy()) == BATCHES_PER_EPOCH
    assert kerasdist.checkpoint.manager_of(model).resume_point(model).epoch == 1
    assert list(tmp_path.iterdir()) == []  # both downloads removed, the refused one too


@pytest.mark.parametrize("where", ["memory", "s3", "gcs"])
@pytest.mark.parametrize("row", CASES["object_damage"], ids=[row["id"] for row in CASES["object_damage"]])
def test_damaged_object_falls_back_to_the_previous_checkpoint(object_template, row, where, request):
    memory = fsspec.filesystem("memory")
    url, options, fs, root = place_on(where, request)
    copy_objects(memory, memory._strip_protocol(object_template), fs, root)
    newest = kerasdist.latest_checkpoint(url, storage_options=options)
    damage(fs, f"{root}/{newest.path.rsplit('/', 1)[-1]}/{row['file']}", row)
    before = objects(fs, root)
    with pytest.warns(kerasdist.CheckpointWarning, match=re.escape(row["warning"])) as caught:
        model = kerasdist.make_or_restore_model(url, build_model, storage_options=options)
    assert row["file"] in str(caught[0].message) and url in str(caught[0].message)
    assert int(model.optimizer.iterations.numpy()) == BATCHES_PER_EPOCH
    assert objects(fs, root) == before  # skipped, not deleted or repaired
    if row.get("cleaned_at_start"):
        del model, caught  # a later run: its own manager warns of the damaged checkpoint again (once per run)
        gc.collect()
        with pytest.warns(kerasdist.CheckpointWarning):
            fit(url, 2, storage_options=options)  # the chief removes the unfinished upload, then trains
        assert [c.epoch for c in kerasdist.list_checkpoints(url, storage_options=options)] == [1, 2]
        assert all(p.rsplit("/", 1)[-1] in ("model.keras", "rng.npz", "state.json") for p in fs.find(root)
                   if "/runs/" not in p)  # the run log aside


# --------------------------------------------------------------------------------------------
# Real S3 and GCS servers


def test_a_missing_bucket_or_a_dead_endpoint_is_named_before_training(store, monkeypatch):
    """An endpoint that never answers is given up after REACHABLE_WITHIN_SECONDS (10 s; 2 s here),
    whatever the client's own timeouts (botocore reads for 60 s, gcsfs retries for about a
    minute). Only the reachability check is timed: the rest of fit (building, tracing) is not the
    claim and takes longer on a loaded machine."""
    missing = f"{store.scheme}://kerasdist-missing-bucket/run"
    with pytest.raises(ValueError, match=rf"checkpoint_dir '{missing}': the bucket 'kerasdist-missing-bucket' "
                                         r"does not exist; kerasdist does not create buckets"):
        fit(missing, 1, storage_options=store.storage_options())
    monkeypatch.setattr(object_store, "REACHABLE_WITHIN_SECONDS", 2.0)
    waits = timed_calls(monkeypatch, object_store.ObjectStore, "_bucket_info")
    url = f"{store.scheme}://kerasdist-any-bucket/run"
    with SilentEndpoint() as silent, pytest.raises(
        ValueError, match=rf"checkpoint_dir '{url}' cannot be reached: no answer within 2 s\.$"
    ):
        fit(url, 1, storage_options=store.storage_options(endpoint=silent.url))
    assert len(waits) == 1 and 2.0 <= waits[0] < 5, waits  # the 2 s, not the client's retries


def timed_calls(monkeypatch, owner, name: str) -> list[float]:
    """The seconds each call of `owner.name` takes from now until the test's monkeypatch undoes it."""
    seconds, call = [], getattr(owner, name)

    @functools.wraps(call)
    def timed(*args, **kwargs):
        started = time.monotonic()
        try:
            return call(*args, **kwargs)
        finally:
            seconds.append(time.monotonic() - started)

    monkeypatch.setattr(owner, name, timed)
    return seconds


def test_wrong_s3_credentials_are_named_before_training(s3):
    """(fake-gcs-server takes any credentials: this is S3's alone.)"""
    bucket = s3.make_bucket()
    wrong = {**s3.storage_options(), "secret": "wrong"}
    with pytest.raises(ValueError, match=rf"checkpoint_dir 's3://{bucket}/run': access denied"):
        fit(f"s3://{bucket}/run", 1, storage_options=wrong)
    assert s3.filesystem().find(bucket) == []  # nothing was written


def test_pruning_leaves_only_the_kept_checkpoint_and_warns_of_nothing(store):
    url, options = new_url(store), store.storage_options()
    with warnings.catch_warnings():
        warnings.simplefilter("error", kerasdist.CheckpointWarning)
        fit(url, 3, storage_options=options, keep=1)
    assert entries_in(store.filesystem(), root_of(url)) == ["ckpt-12"]


def test_a_folder_left_on_s3_is_no_checkpoint_and_is_swept_at_the_start(s3):
    """SeaweedFS keeps the folder of a deleted prefix (listed, with a `ckpt-N/` marker object):
    pruning deletes it too (above), and one left by a crash is neither a checkpoint nor an
    interrupted save to warn about; the chief deletes it at the start."""
    url, options = new_url(s3), s3.storage_options()
    fit(url, 1, storage_options=options)
    fs, root = s3.filesystem(), root_of(url)
    fs.pipe_file(f"{root}/ckpt-1/model.keras", b"x")
    fs.rm(f"{root}/ckpt-1", recursive=True)  # crashed between deleting the files and the folder
    fs.invalidate_cache()
    assert fs.exists(f"{root}/ckpt-1")  # the store keeps the empty folder
    manager = kerasdist.CheckpointManager(url, storage_options=options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kerasdist.CheckpointWarning)
        assert manager.store.entries() == ["ckpt-4"]
        assert [c.epoch for c in manager.checkpoints()] == [1]
    assert manager.remove_temporary() == [f"{url}/ckpt-1"]
    fs.invalidate_cache()
    assert entries_in(fs, root) == ["ckpt-4"]


def start_trainer(url: str, out: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(TRAIN_SCRIPT), url, str(out), "--epochs", "2", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})


def finished(trainer: subprocess.Popen) -> tuple[int, str]:
    output, _ = trainer.communicate(timeout=300)
    return trainer.returncode, output


@pytest.fixture(scope="module")
def uninterrupted_weights(tmp_path_factory):
    """The final weights of an uninterrupted local run of the trainer: started once, beside the
    first test that asks (call the fixture's value to wait for them)."""
    out = tmp_path_factory.mktemp("uninterrupted")
    trainer = start_trainer(str(out / "ckpt"), out / "weights.npz", {})

    @functools.cache
    def weights() -> dict[str, np.ndarray]:
        code, output = finished(trainer)
        assert code == 0, output
        return dict(np.load(out / "weights.npz"))

    yield weights
    if trainer.poll() is None:
        trainer.kill()
        trainer.communicate()


def test_a_trainer_killed_mid_upload_resumes_bitwise(store, tmp_path, uninterrupted_weights):
    """The trainer is configured the ecosystem's way (AWS_* or STORAGE_EMULATOR_HOST environment
    variables) and SIGKILLs itself between uploading a checkpoint's files and its record."""
    env = store.environment()
    url = new_url(store)
    killed = start_trainer(url, tmp_path / "killed.npz", env, "--kill-during-upload", "9")
    code, output = finished(killed)
    assert code == -signal.SIGKILL, output
    fs, root = store.filesystem(), root_of(url)
    assert fs.exists(f"{root}/ckpt-9/model.keras") and not fs.exists(f"{root}/ckpt-9/state.json")  # torn upload
    with kerasdist_env(env), pytest.warns(kerasdist.CheckpointWarning, match=r"ckpt-9/state.json is missing"):
        assert [c.global_step for c in kerasdist.list_checkpoints(url)] == [3, 6]  # ckpt-9 is not listed
    code, output = finished(start_trainer(url, tmp_path / "resumed.npz", env))
    assert code == 0, output
    assert [line for line in output.split("\n") if line.startswith("step ")][0] == "step 7"  # after ckpt-6
    assert "ckpt-9/state.json is missing (the save never completed)" in output
    expected, got = uninterrupted_weights(), np.load(tmp_path / "resumed.npz")
    assert all(np.array_equal(expected[name], got[name]) for name in expected)
    fs.invalidate_cache()
    assert not fs.exists(f"{root}/ckpt-9") or fs.exists(f"{root}/ckpt-9/state.json")  # cleaned, or saved anew


def test_the_checkpoints_command_reads_a_bucket_configured_the_ecosystems_way(store, capsys):
    url = new_url(store)
    fit(url, 2, storage_options=store.storage_options())
    fs, root = store.filesystem(), root_of(url)
    fs.rm(f"{root}/ckpt-{2 * BATCHES_PER_EPOCH}/{layout.RECORD_FILE}")  # an upload cut before its record
    with kerasdist_env(store.environment()):
        assert main(["checkpoints", url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(row["path"], row["valid"], row["restart"]) for row in rows] == [
        (f"{url}/ckpt-{BATCHES_PER_EPOCH}", True, True), (f"{url}/ckpt-{2 * BATCHES_PER_EPOCH}", False, False)]
    assert rows[1]["problem"].endswith("state.json is missing (the save never completed)")
    with kerasdist_env(store.environment()):  # the run log is in the bucket, beside the checkpoints
        assert main(["goodput", url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [a["status"] for a in report["attempts"]] == ["completed"]
    assert report["attempts"][0]["saves"] == 2 and report["seconds"]["productive"] > 0
    assert sorted(name.rsplit(".", 1)[-1] for name in fs.ls(f"{root}/runs")) == ["jsonl", "step"]  # not a checkpoint


def test_a_sigkill_right_after_a_step_counts_the_steps_redone_exactly_in_a_bucket(s3, tmp_path):
    """#43 on S3: SIGKILLed right after step 27, its step-25 checkpoint saved: the killed process
    never uploaded its last step record (uploads go once a second), but its local spool has it,
    and the restart on this host uploads it before training: 2 steps redone, as on a disk."""
    from test_goodput import kill_at_27_and_resume

    env = {**os.environ, **s3.environment(), "KERASDIST_RUN_SPOOL": str(tmp_path / "spool")}
    url = new_url(s3)
    with kerasdist_env(s3.environment()):
        kill_at_27_and_resume(url, tmp_path / "out.npz", env)
    assert not list((tmp_path / "spool").rglob("*.step"))  # uploaded, then dropped


def entries_in(fs, root: str) -> list[str]:
    """The names under `root` but the run log's folder (runs/, never a checkpoint)."""
    return [name.rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(root, detail=False)
            if name.rstrip("/").rsplit("/", 1)[-1] != "runs"]


class kerasdist_env:  # noqa: N801 (a context manager used like a function)
    """The environment variables of a server, set for this process while inside."""

    def __init__(self, env: dict[str, str]):
        self.env, self.saved = env, {}

    def __enter__(self):
        self.saved = {name: os.environ.get(name) for name in self.env}
        os.environ.update(self.env)

    def __exit__(self, *exc):
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class StopServerAtEpoch(keras.callbacks.Callback):
    def __init__(self, server, epoch: int):
        super().__init__()
        self.server, self.epoch = server, epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            wait_for_all()  # the previous epoch's checkpoint, saved in the background, is up
            self.server.stop(remove=False)


# botocore gives up on a dead endpoint after one attempt; gcsfs retries for about 35 s and has no
# option to try fewer times.
FAIL_FAST = {"s3": {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}}, "gs": {}}


def test_server_stopped_mid_run_fails_loudly_keeps_what_was_saved_and_a_rerun_resumes(store, two_epochs):
    options = store.storage_options()  # FAIL_FAST only where the server stops: one try is few for a busy one
    _, reference = two_epochs  # an uninterrupted fit(url, 2)
    url = new_url(store)
    try:
        # the save runs in the background: its OSError comes out of fit as a BackgroundSaveError
        with pytest.raises(kerasdist.BackgroundSaveError, match=rf"Saving checkpoint {re.escape(url)}/ckpt-8 failed") \
                as raised:
            fit(url, 2, storage_options={**options, **FAIL_FAST[store.scheme]}, callbacks=[StopServerAtEpoch(store, 1)])
        assert isinstance(raised.value.error, OSError)
    finally:
        store.start()
    assert [c.epoch for c in kerasdist.list_checkpoints(url, storage_options=options)] == [1]  # nothing lost
    resumed = fit(url, 2, storage_options=options)
    assert resumed.epoch == [0, 1]
    for a, b in zip(reference, resumed.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert [c.epoch for c in kerasdist.list_checkpoints(url, storage_options=options)] == [1, 2]


def test_a_model_remembers_its_store_with_its_options(store):
    """resume_fit(model, data, epochs, url) without storage_options uses the options the model
    was restored with (make_or_restore_model remembers its manager)."""
    url, options = new_url(store), store.storage_options()
    model = kerasdist.make_or_restore_model(url, build_model, storage_options=options)
    data = kerasdist.make_dataset(X, X.sum(1), batch_size=4, seed=1)
    kerasdist.resume_fit(model, data, 1, url, verbose=0)
    assert [c.epoch for c in kerasdist.list_checkpoints(url, storage_options=options)] == [1]


def test_gs_urls_never_wait_on_gcsfs_bucket_type_probe(gcs, monkeypatch):
    """gcsfs's default filesystem probes each bucket's type over gRPC first; against this server
    (no gRPC) every call waited about a minute for it. kerasdist opens gcsfs's JSON-API filesystem
    unless the user set gcsfs's switch for that probe."""
    import gcsfs.core

    monkeypatch.delenv(object_store.GCS_BUCKET_TYPE_PROBE, raising=False)
    url, options = new_url(gcs), gcs.storage_options()
    assert type(stores.open_store(url, options).fs) is gcsfs.core.GCSFileSystem
    started = time.monotonic()
    fit(url, 1, storage_options=options)
    assert [c.epoch for c in kerasdist.list_checkpoints(url, storage_options=options)] == [1]
    assert time.monotonic() - started < 40  # one probe alone waits about a minute; a loaded machine's fit, seconds
    monkeypatch.setenv(object_store.GCS_BUCKET_TYPE_PROBE, "true")  # the user's choice (zonal buckets need it)
    assert type(stores.open_store(url, options).fs) is fsspec.get_filesystem_class("gs")
