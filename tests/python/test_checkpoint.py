"""Checkpoints: restore order, fallback past damage, bad input, resume, keep, kill -9 and SIGTERM."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import random
import re
import shutil
import signal
import sys
import warnings
import weakref
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasdist
from conftest import CASES_DIR
from kerasdist.checkpoint import manager as checkpoint_manager
from kerasdist.checkpoint import store as checkpoint_store
from kerasdist.checkpoint.store import local as local_store

CASES = json.loads((CASES_DIR / "checkpoint.json").read_text())
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import kill_resume  # noqa: E402  (tools/kill_resume.py: the same fault injection, 50 trials on demand)

BATCHES_PER_EPOCH = 4


def build_model(units: int = 4) -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def dataset() -> tf.data.Dataset:
    x = np.linspace(0, 1, 48, dtype="float32").reshape(16, 3)
    return tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).batch(4)


@pytest.fixture(scope="module")
def template_dir(tmp_path_factory) -> Path:
    """Two epoch-end checkpoints (epochs 1 and 2) of build_model."""
    directory = tmp_path_factory.mktemp("template") / "ckpt"
    model = kerasdist.make_or_restore_model(directory, build_model)
    kerasdist.resume_fit(model, dataset(), 2, kerasdist.checkpoint_callback(directory, keep=5), verbose=0)
    return directory


@pytest.fixture
def ckpt_dir(template_dir, tmp_path) -> Path:
    directory = tmp_path / "ckpt"
    shutil.copytree(template_dir, directory)
    return directory


def weights_of_checkpoint(path: str) -> list[np.ndarray]:
    model = build_model()
    model.optimizer.build(model.trainable_variables)
    model.load_weights(Path(path) / "model.keras")
    return model.get_weights()


def snapshot(directory: Path) -> dict[str, tuple[int, float]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime) for p in sorted(directory.rglob("*"))}


def test_restore_takes_newest_checkpoint_with_optimizer_state(ckpt_dir):
    latest = kerasdist.latest_checkpoint(ckpt_dir)
    assert (latest.epoch, latest.step_in_epoch, latest.global_step) == (2, 0, 2 * BATCHES_PER_EPOCH)
    assert len(latest.history) == 2 and "loss" in latest.history[0]
    model = kerasdist.make_or_restore_model(ckpt_dir, build_model)
    assert int(model.optimizer.iterations.numpy()) == 2 * BATCHES_PER_EPOCH
    for restored, saved in zip(model.get_weights(), weights_of_checkpoint(latest.path), strict=True):
        np.testing.assert_array_equal(restored, saved)


def test_a_build_restored_at_once_draws_no_random_numbers_and_a_fresh_start_its_usual_ones(ckpt_dir, tmp_path):
    """make_or_restore_model's build skips the random initializers only when a checkpoint is
    restored into it at once (compat.initializers_deferred): the restored values are the
    checkpoint's bit for bit, and a fresh start gets the seed-driven values a plain build gets."""
    kernels = []

    def seeded_build() -> keras.Model:
        keras.utils.set_random_seed(5)
        model = build_model()
        kernels.append(model.layers[0].kernel.numpy().copy())  # as build_fn leaves it
        return model

    fresh = kerasdist.make_or_restore_model(tmp_path / "fresh", seeded_build)
    keras.utils.set_random_seed(5)
    plain = build_model().get_weights()
    assert kernels[0].any()
    for made, expected in zip(fresh.get_weights(), plain, strict=True):
        assert made.tobytes() == expected.tobytes()
    restored = kerasdist.make_or_restore_model(ckpt_dir, seeded_build)
    assert not kernels[1].any()  # no random numbers drawn for weights the checkpoint overwrites
    for made, saved in zip(restored.get_weights(), weights_of_checkpoint(kerasdist.latest_checkpoint(ckpt_dir).path),
                           strict=True):
        assert made.tobytes() == saved.tobytes()


def large_model(optimizer: str | None = "adam", trained: bool = True) -> keras.Model:
    """Kernels of 1 MiB and more (their slots too: started unfilled by a restore's build), batch
    normalization, a float16 layer; `optimizer` None: not compiled."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((600,)), keras.layers.Dense(600), keras.layers.BatchNormalization(),
                              keras.layers.Dense(600, kernel_initializer="ones"),
                              keras.layers.Dense(2, dtype="float16")])
    if optimizer is not None:
        model.compile(optimizer=optimizer, loss="mse")
        if trained:
            x = np.random.default_rng(0).normal(size=(8, 600)).astype("float32")
            model.fit(x, np.ones((8, 2), "float32"), verbose=0)
    return model


def state_of(model: keras.Model) -> list[bytes]:
    return [np.asarray(v.numpy()).tobytes() for v in [*model.weights, *model.optimizer.variables]]


@pytest.mark.parametrize("saved_with", ["adam", "sgd", "untrained", "uncompiled"])
def test_a_restore_gives_what_load_weights_gives_bit_for_bit_also_where_the_optimizer_state_is_missing(
        tmp_path, saved_with):
    """A restore into build_fn's model (values read into the tensors the variables take over,
    large variables started unfilled) holds exactly what `model.load_weights` gives a plainly built
    model: the weights and the optimizer's variables; where the checkpoint has no state for the
    optimizer (saved uncompiled, untrained, with another optimizer), its slots end as zeros and
    its step as 0, as a plain build's."""
    saved = {"adam": lambda: large_model(), "sgd": lambda: large_model("sgd"),
             "untrained": lambda: large_model(trained=False), "uncompiled": lambda: large_model(None)}[saved_with]()
    info = checkpoint_manager.save_checkpoint(saved, tmp_path / "ckpt", epoch=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras: "Skipping variable loading for optimizer ..."
        restored = kerasdist.make_or_restore_model(tmp_path / "ckpt", lambda: large_model(trained=False))
        plain = large_model(trained=False)
        plain.optimizer.build(plain.trainable_variables)
        plain.load_weights(Path(info.path) / "model.keras")
    assert state_of(restored) == state_of(plain)
    assert int(restored.optimizer.iterations.numpy()) == (1 if saved_with == "adam" else 0)
    if saved_with != "adam":
        assert not any(np.asarray(v.numpy()).any() for v in restored.optimizer.variables[2:])  # past step, rate


def test_the_public_manager_restores_saves_and_prunes(ckpt_dir):
    manager = kerasdist.CheckpointManager(ckpt_dir)
    assert [c.epoch for c in manager.checkpoints()] == [1, 2]
    model = build_model()
    restored = manager.restore(model)
    assert restored == manager.latest() == manager.resume_point(model)
    assert int(model.optimizer.iterations.numpy()) == 2 * BATCHES_PER_EPOCH
    manager.save(model, epoch=3, step_in_epoch=0)
    assert manager.prune(keep=1) and [c.epoch for c in manager.checkpoints()] == [3]
    assert [c.epoch for c in kerasdist.list_checkpoints(ckpt_dir)] == [3]


@pytest.mark.parametrize("row", CASES["damage"], ids=[row["id"] for row in CASES["damage"]])
def test_damaged_newest_checkpoint_falls_back_to_previous(ckpt_dir, row):
    newest = kerasdist.latest_checkpoint(ckpt_dir)
    damage(Path(newest.path) / row["file"], row)
    before = snapshot(ckpt_dir)
    with pytest.warns(kerasdist.CheckpointWarning, match=re.escape(row["warning"])) as caught:
        model = kerasdist.make_or_restore_model(ckpt_dir, build_model)
    assert row["file"] in str(caught[0].message)
    assert int(model.optimizer.iterations.numpy()) == BATCHES_PER_EPOCH
    with pytest.warns(kerasdist.CheckpointWarning):
        assert kerasdist.latest_checkpoint(ckpt_dir).epoch == 1
    assert snapshot(ckpt_dir) == before  # the damaged checkpoint is skipped, not deleted or repaired


def test_records_of_format_1_with_sha256_checksums_are_still_read_and_checked(ckpt_dir):
    for record_path in ckpt_dir.glob("ckpt-*/state.json"):  # as kerasdist wrote them before CRC-32s
        record = json.loads(record_path.read_text())
        for name, entry in record["files"].items():
            del entry["crc32"]
            entry["sha256"] = hashlib.sha256((record_path.parent / name).read_bytes()).hexdigest()
        record["format"] = 1
        record_path.write_text(json.dumps(record))
    assert [c.epoch for c in kerasdist.list_checkpoints(ckpt_dir)] == [1, 2]
    newest = Path(kerasdist.latest_checkpoint(ckpt_dir).path) / "model.keras"
    garbled = bytearray(newest.read_bytes())
    garbled[len(garbled) // 2] ^= 0xFF
    newest.write_bytes(bytes(garbled))
    with pytest.warns(kerasdist.CheckpointWarning, match="does not match its recorded checksum"):
        assert kerasdist.latest_checkpoint(ckpt_dir).epoch == 1


def damage(path: Path, row: dict) -> None:
    how = row["how"]
    if how == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "garble":
        data = bytearray(path.read_bytes())
        data[len(data) // 2 : len(data) // 2 + 16] = bytes(16)
        data[0:1] = b"\xff"
        path.write_bytes(bytes(data))
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "delete":
        path.unlink()
    elif how == "write":
        path.write_text(row["content"])
    elif how == "edit":
        record = json.loads(path.read_text())
        record[row["key"]] = row["value"]
        path.write_text(json.dumps(record))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("row", CASES["errors"], ids=[row["id"] for row in CASES["errors"]])
def test_bad_input_is_refused_and_nothing_is_touched(ckpt_dir, tmp_path, row):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    x = np.linspace(0, 1, 48, dtype="float32").reshape(16, 3)
    fixtures = {
        "<dir>": lambda: ckpt_dir, "<file>": lambda: a_file, "<unwritable>": lambda: "/proc/kerasdist-test/ckpt",
        "<build>": lambda: build_model, "<other_build>": lambda: lambda: build_model(units=5),
        "<not_a_model>": lambda: lambda: 42, "<not_a_function>": lambda: "build_model",
        "<model>": lambda: kerasdist.make_or_restore_model(ckpt_dir, build_model), "<data>": dataset,
        "<x>": lambda: x, "<y>": lambda: x.sum(1),
    }

    def resolve(value):
        if isinstance(value, list):
            return [resolve(v) for v in value]
        return fixtures[value]() if isinstance(value, str) and value in fixtures else value

    args = {k: resolve(v) for k, v in row["args"].items()}
    before = snapshot(ckpt_dir)
    with pytest.raises(ValueError, match=re.escape(row["error"])):
        getattr(kerasdist, row["function"])(**args)
    assert snapshot(ckpt_dir) == before


def test_order_is_by_recorded_epoch_not_name_or_time(tmp_path):
    model = build_model()
    model.optimizer.build(model.trainable_variables)
    for epoch in (10, 2):  # ckpt-10 written first, so ckpt-2 is newer by time and sorts later by name
        model.optimizer.iterations.assign(epoch)
        kerasdist.checkpoint.save_checkpoint(model, tmp_path, epoch=epoch)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-10", "ckpt-2"]
    assert [c.epoch for c in kerasdist.list_checkpoints(tmp_path)] == [2, 10]
    assert kerasdist.latest_checkpoint(tmp_path).epoch == 10


def test_resumed_fit_reaches_total_and_keeps_earlier_checkpoints(ckpt_dir):
    earlier = {p.name: (ckpt_dir / p.name / "state.json").read_text() for p in ckpt_dir.glob("ckpt-*")}
    model = kerasdist.make_or_restore_model(ckpt_dir, build_model)
    history = kerasdist.resume_fit(model, dataset(), 4, kerasdist.checkpoint_callback(ckpt_dir, keep=10), verbose=0)
    assert history.epoch == [0, 1, 2, 3]
    assert len(history.history["loss"]) == 4
    assert int(model.optimizer.iterations.numpy()) == 4 * BATCHES_PER_EPOCH
    for name, record in earlier.items():
        assert (ckpt_dir / name / "state.json").read_text() == record
    again = kerasdist.resume_fit(model, dataset(), 4, ckpt_dir, verbose=0)  # already done
    assert again.epoch == [0, 1, 2, 3]
    assert int(model.optimizer.iterations.numpy()) == 4 * BATCHES_PER_EPOCH


def test_keep_last_k_and_best(tmp_path):
    keras.utils.set_random_seed(3)  # an unseeded init sometimes made epoch 2's loss the highest
    model = kerasdist.make_or_restore_model(tmp_path, build_model)
    callback = kerasdist.checkpoint_callback(tmp_path, keep=2, keep_best=True, monitor="loss", mode="max")
    history = kerasdist.resume_fit(model, dataset(), 5, callback, verbose=0)
    best_epoch = int(np.argmax(history.history["loss"])) + 1
    assert best_epoch < 4, "the best epoch must not be one of the newest two, or keep_best is not tested"
    assert [c.epoch for c in kerasdist.list_checkpoints(tmp_path)] == [best_epoch, 4, 5]


def test_resume_fit_with_a_model_built_elsewhere_goes_on_from_the_stores_newest_checkpoint(template_dir, tmp_path):
    """A model not made by make_or_restore_model(dir) takes dir's newest checkpoint first: it ends
    where the restored model ends, bit for bit, not with its own weights trained from the
    checkpoint's position."""
    for name in ("restored", "built"):
        shutil.copytree(template_dir, tmp_path / name)
    restored = kerasdist.make_or_restore_model(tmp_path / "restored", build_model)
    kerasdist.resume_fit(restored, dataset(), 3, tmp_path / "restored", verbose=0)
    built = build_model()
    history = kerasdist.resume_fit(built, dataset(), 3, tmp_path / "built", verbose=0)
    assert history.epoch == [0, 1, 2] and int(built.optimizer.iterations.numpy()) == 3 * BATCHES_PER_EPOCH
    for ours, reference in zip(built.get_weights(), restored.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, reference)


def test_make_dataset_checkpoints_record_the_global_batch_and_the_epoch_order(tmp_path):
    x = np.linspace(0, 1, 48, dtype="float32").reshape(16, 3)
    for shuffle, order in ((True, kerasdist.data.order.EPOCH_ORDER), (False, "in order")):
        directory = tmp_path / str(shuffle)
        data = kerasdist.make_dataset(x, x.sum(1, keepdims=True), batch_size=4, seed=1, shuffle=shuffle)
        model = kerasdist.make_or_restore_model(directory, build_model)
        kerasdist.resume_fit(model, data, 1, directory, verbose=0)
        latest = kerasdist.latest_checkpoint(directory)
        assert (latest.global_batch_size, latest.epoch_order) == (4, order)


def test_resume_inside_an_epoch_another_order_drew_warns_and_goes_on(tmp_path, monkeypatch):
    x = np.linspace(0, 1, 48, dtype="float32").reshape(16, 3)
    y = x.sum(1, keepdims=True)
    callback = kerasdist.checkpoint_callback(tmp_path, every_steps=2, keep=10)
    model = kerasdist.make_or_restore_model(tmp_path, build_model)
    kerasdist.resume_fit(model, kerasdist.make_dataset(x, y, batch_size=4, seed=1), 1, callback, verbose=0)
    shutil.rmtree(tmp_path / "ckpt-4")  # back to ckpt-2: 2 of epoch 0's 4 batches done
    monkeypatch.setattr(kerasdist.data.order, "EPOCH_ORDER", "another_order/2")  # a later kerasdist
    model = kerasdist.make_or_restore_model(tmp_path, build_model)
    with pytest.warns(kerasdist.CheckpointWarning, match=r"stopped 2 batches into epoch 0, whose order came from "
                      r"'stateless_shuffle/1'; this run orders epochs with 'another_order/2'"):
        history = kerasdist.resume_fit(model, kerasdist.make_dataset(x, y, batch_size=4, seed=1), 2,
                                       kerasdist.checkpoint_callback(tmp_path, keep=10), verbose=0)
    assert history.epoch == [0, 1] and int(model.optimizer.iterations.numpy()) == 2 * BATCHES_PER_EPOCH
    assert kerasdist.latest_checkpoint(tmp_path).epoch_order == "another_order/2"


def test_step_checkpoints_resume_mid_epoch(tmp_path):
    model = kerasdist.make_or_restore_model(tmp_path, build_model)
    callback = kerasdist.checkpoint_callback(tmp_path, every_steps=3, every_epoch=False, keep=10)
    kerasdist.resume_fit(model, dataset(), 1, callback, verbose=0)
    steps = [(c.epoch, c.step_in_epoch) for c in kerasdist.list_checkpoints(tmp_path)]
    assert steps == [(0, 3)]  # step 4 is the epoch end, which every_epoch=False leaves alone
    model = kerasdist.make_or_restore_model(tmp_path, build_model)
    history = kerasdist.resume_fit(model, dataset(), 2, callback, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2 * BATCHES_PER_EPOCH
    assert history.epoch == [0, 1]


def test_whole_model_loads_without_build_fn(ckpt_dir):
    model = kerasdist.make_or_restore_model(ckpt_dir)
    latest = kerasdist.latest_checkpoint(ckpt_dir)
    for restored, saved in zip(model.get_weights(), weights_of_checkpoint(latest.path), strict=True):
        np.testing.assert_array_equal(restored, saved)


def test_interrupted_save_leaves_only_an_ignored_temporary(ckpt_dir):
    partial = ckpt_dir / ".tmp-ckpt-99-1-deadbeef"
    partial.mkdir()
    (partial / "model.keras").write_bytes(b"PK\x03\x04 torn")
    assert kerasdist.latest_checkpoint(ckpt_dir).epoch == 2
    model = kerasdist.make_or_restore_model(ckpt_dir, build_model)
    kerasdist.resume_fit(model, dataset(), 3, kerasdist.checkpoint_callback(ckpt_dir, keep=5), verbose=0)
    assert not partial.exists()  # the chief cleans temporaries when training starts


def counting(calls: list, fn):
    def counted(*args, **kwargs):
        calls.append(args[0])
        return fn(*args, **kwargs)
    return counted


def test_distributed_fit_checks_the_directory_once_and_checksums_each_checkpoint_once(tmp_path, monkeypatch):
    """distributed_fit makes one manager per call and hands it down: the second run opens the store
    once and probes it once (the restore, the callback and the trainer share that manager), and
    checksums no checkpoint the first run verified (what managers of one store share is the
    verification, redone only when a checkpoint's files change)."""
    x = np.linspace(0, 1, 48, dtype="float32").reshape(16, 3)
    args = dict(checkpoint_dir=tmp_path / "ckpt", strategy="default", batch_size=4, keep=5, verbose=0)
    first = kerasdist.distributed_fit(build_model, x, x.sum(1), epochs=2, **args)
    existing = sorted(str(c.path) for c in kerasdist.list_checkpoints(tmp_path / "ckpt"))
    assert len(existing) == 2
    checked, probed, verified = [], [], []
    monkeypatch.setattr(checkpoint_manager, "open_store", counting(checked, checkpoint_manager.open_store))
    local = checkpoint_store.LocalStore
    monkeypatch.setattr(local, "prepare", counting(probed, local.prepare))
    read = checkpoint_manager.read_checkpoint
    monkeypatch.setattr(checkpoint_manager, "read_checkpoint",
                        lambda store, entry: verified.append(store.path_of(entry)) or read(store, entry))
    history = kerasdist.distributed_fit(build_model, x, x.sum(1), epochs=4, **args)
    assert history.epoch == [0, 1, 2, 3] and int(history.model.optimizer.iterations.numpy()) == 4 * BATCHES_PER_EPOCH
    assert kerasdist.checkpoint.manager_of(history.model) is not kerasdist.checkpoint.manager_of(first.model)
    assert len(checked) == 1 and len(probed) == 1  # checkpoint_dir checked once and probed once by this run
    assert verified == []  # no checksum pass over the checkpoints the first run verified
    assert len(kerasdist.list_checkpoints(tmp_path / "ckpt")) == 4


def test_resume_point_is_the_checkpoint_restored_even_if_a_newer_one_appears(ckpt_dir):
    model = kerasdist.make_or_restore_model(ckpt_dir, build_model)
    newer = build_model()
    newer.optimizer.build(newer.trainable_variables)
    newer.optimizer.iterations.assign(5 * BATCHES_PER_EPOCH)
    kerasdist.checkpoint.save_checkpoint(newer, ckpt_dir, epoch=5)  # e.g. written by another process
    history = kerasdist.resume_fit(model, dataset(), 3, verbose=0)
    assert history.epoch == [0, 1, 2]  # continued from epoch 2, the one restored, not from epoch 5
    assert int(model.optimizer.iterations.numpy()) == 3 * BATCHES_PER_EPOCH


def test_each_checkpoint_is_verified_once_whatever_asks_and_other_writers_are_still_seen(ckpt_dir, monkeypatch):
    model = kerasdist.make_or_restore_model(ckpt_dir, build_model)
    manager = kerasdist.checkpoint.manager_of(model)
    callback = kerasdist.checkpoint_callback(ckpt_dir)
    assert callback.manager is not manager  # no registry of managers: the callback has its own
    assert not [name for name in vars(model) if "kerasdist" in name]  # nothing set on the user's model
    verified = []
    read = checkpoint_manager.read_checkpoint
    monkeypatch.setattr(checkpoint_manager, "read_checkpoint",
                        lambda store, entry: verified.append(entry) or read(store, entry))
    assert kerasdist.latest_checkpoint(ckpt_dir).epoch == 2 and len(kerasdist.list_checkpoints(ckpt_dir)) == 2
    assert callback.manager.latest().epoch == 2
    assert verified == []  # the restore verified both; no other manager of the store reads either again
    elsewhere = kerasdist.CheckpointManager(ckpt_dir.parent / "elsewhere", create=False)
    assert elsewhere.latest() is None and verified == []
    newest = Path(kerasdist.latest_checkpoint(ckpt_dir).path)
    (newest / "model.keras").write_bytes(b"torn by another process")
    with pytest.warns(kerasdist.CheckpointWarning, match="Skipping checkpoint"):
        assert kerasdist.latest_checkpoint(ckpt_dir).epoch == 1  # seen at the next call
    with pytest.warns(kerasdist.CheckpointWarning, match="Skipping checkpoint"):  # and said at every one
        assert [c.epoch for c in kerasdist.list_checkpoints(ckpt_dir)] == [1]
    assert verified == [newest.name]  # verified again once, when it changed
    shutil.rmtree(newest)  # deleted by another process
    assert [c.epoch for c in kerasdist.list_checkpoints(ckpt_dir)] == [1]
    assert newest.name not in manager._verified  # the shared table drops what the store no longer holds
    gone = weakref.ref(manager)
    del model, manager, callback
    gc.collect()
    assert gone() is None  # what the model was restored with goes with it: no registry keeps the manager
    assert not [shared for shared in checkpoint_manager._VERIFICATIONS if shared.store.location == str(ckpt_dir)]


class _Crash(BaseException):
    """A crash at a chosen point of a save."""


def test_crash_between_the_two_renames_of_a_resave_keeps_the_only_checkpoint(tmp_path, monkeypatch):
    """#15: with keep=1, re-saving a step renames the old checkpoint aside, then the new one into
    place. A crash between the two must not leave only temporary folders, which the next start
    deletes."""
    model = kerasdist.make_or_restore_model(tmp_path, build_model)
    kerasdist.resume_fit(model, dataset(), 1, kerasdist.checkpoint_callback(tmp_path, keep=1), verbose=0)
    renames = []

    def crash_on_second_rename(src, dst):
        renames.append(dst)
        if len(renames) == 2:
            raise _Crash
        os.replace(src, dst)

    monkeypatch.setattr(local_store.os, "rename", crash_on_second_rename)
    with pytest.raises(_Crash):
        kerasdist.checkpoint.save_checkpoint(model, tmp_path, epoch=1)
    monkeypatch.undo()
    assert [(c.epoch, c.global_step) for c in kerasdist.list_checkpoints(tmp_path)] == [(1, BATCHES_PER_EPOCH)]
    model = kerasdist.make_or_restore_model(tmp_path, build_model)  # the next start
    assert int(model.optimizer.iterations.numpy()) == BATCHES_PER_EPOCH
    kerasdist.resume_fit(model, dataset(), 2, kerasdist.checkpoint_callback(tmp_path, keep=1), verbose=0)
    assert [(c.epoch, c.global_step) for c in kerasdist.list_checkpoints(tmp_path)] == [(2, 2 * BATCHES_PER_EPOCH)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"ckpt-{2 * BATCHES_PER_EPOCH}", "runs"]  # runs: the run log


def test_a_completed_resave_replaces_the_checkpoint_of_that_step(tmp_path):
    model = kerasdist.make_or_restore_model(tmp_path, build_model)
    model.optimizer.build(model.trainable_variables)
    kerasdist.checkpoint.save_checkpoint(model, tmp_path, epoch=0, step_in_epoch=0)
    kerasdist.checkpoint.save_checkpoint(model, tmp_path, epoch=1, step_in_epoch=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0"]
    assert [c.epoch for c in kerasdist.list_checkpoints(tmp_path)] == [1]


# ---------------------------------------------------------------------------------------------
# Fault injection: real processes, killed for real.


def test_sigkill_at_random_steps_then_resume_is_bitwise_identical(tmp_path):
    rng = random.Random(2026)
    kill_steps = sorted(rng.sample(range(1, kill_resume.TOTAL_STEPS), 5))
    reference = kill_resume.reference_run(tmp_path)
    result = kill_resume.kill_and_resume(tmp_path / "killed", reference, kill_steps, rng)
    assert result["exit_codes"] == [-signal.SIGKILL] * 5
    assert result["final_exit_code"] == 0
    assert result["bitwise_identical"], f"weights differ after kills at {kill_steps}"


def test_sigterm_saves_the_next_step_and_exits_75(tmp_path):
    code, last_step = kill_resume.train(tmp_path / "ckpt", tmp_path / "out.npz", kill_at_step=14, sig=signal.SIGTERM)
    assert code == kerasdist.PREEMPTED_EXIT_CODE == 75
    latest = kerasdist.latest_checkpoint(tmp_path / "ckpt")
    assert 14 <= latest.global_step == last_step  # saved at the step where it stopped: none lost
    assert (latest.epoch, latest.step_in_epoch) == divmod(latest.global_step, 12)
    code, _ = kill_resume.train(tmp_path / "ckpt", tmp_path / "out.npz")
    assert code == 0 and kerasdist.latest_checkpoint(tmp_path / "ckpt").global_step == 36


def test_upstream_fit_on_unknown_cardinality_counts_an_extra_iteration():
    """Why resume_fit always passes steps_per_epoch. Fails once Keras counts right; then
    resume_fit could leave unknown-cardinality datasets to Keras."""
    model = build_model()
    unknown = dataset().filter(lambda x, y: True)  # 4 batches, cardinality unknown to tf.data
    model.fit(unknown, epochs=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == BATCHES_PER_EPOCH + 1


def test_whole_model_load_is_safe_mode_by_default_and_takes_custom_objects(tmp_path):
    @keras.saving.register_keras_serializable(package="kerasdist_test")
    class Doubled(keras.layers.Layer):
        def call(self, x):
            return 2 * x

    def build_with_lambda():
        model = keras.Sequential([keras.Input((3,)), Doubled(), keras.layers.Lambda(lambda x: x + 1),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = kerasdist.make_or_restore_model(tmp_path, build_with_lambda)
    kerasdist.resume_fit(model, dataset(), 1, tmp_path, verbose=0)
    with pytest.raises(ValueError, match="unsafe|Lambda"):
        kerasdist.make_or_restore_model(tmp_path)
    model = kerasdist.make_or_restore_model(tmp_path, safe_mode=False, custom_objects={"Doubled": Doubled})
    assert int(model.optimizer.iterations.numpy()) == BATCHES_PER_EPOCH


def test_resume_fit_refuses_a_steps_per_execution_that_does_not_divide_the_epoch(tmp_path):
    model = build_model()
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=3)
    with pytest.raises(ValueError, match="steps_per_execution=3 does not divide the 4 steps of an epoch"):
        kerasdist.resume_fit(model, dataset(), 2, kerasdist.checkpoint_callback(tmp_path / "ckpt"), verbose=0)
    assert kerasdist.latest_checkpoint(tmp_path / "ckpt") is None
