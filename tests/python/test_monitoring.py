"""Monitoring from several workers, written once (monitoring.py), in this process: run_context()
outside any scope, chief_path, and the file-writing callbacks redirected on other workers. The
2-worker run is in test_multi_worker.py (test_only_the_chief_writes_...)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasdist
from kerasdist.monitoring import chief_writes_only

WORKER_1 = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 1}})


def test_run_context_outside_any_scope_is_this_process_place_in_its_cluster(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    alone = kerasdist.run_context()
    assert (alone.is_chief, alone.num_workers, alone.task) == (True, 1, None)
    monkeypatch.setenv("TF_CONFIG", WORKER_1)
    worker = kerasdist.run_context()
    assert (worker.kind, worker.num_replicas, worker.num_workers, worker.task, worker.is_chief) == (
        "default", 1, 2, "worker:1", False)
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():  # inside a scope: that strategy's
        inside = kerasdist.run_context()
    assert (inside.kind, inside.num_workers, inside.is_chief) == ("one_device", 1, True)


def test_chief_path_is_the_path_on_the_chief_and_a_temporary_one_elsewhere(monkeypatch, tmp_path):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert kerasdist.chief_path(tmp_path / "logs") == str(tmp_path / "logs")
    monkeypatch.setenv("TF_CONFIG", WORKER_1)
    elsewhere = Path(kerasdist.chief_path(tmp_path / "model-{epoch}.keras"))
    assert elsewhere.name == "model-{epoch}.keras" and elsewhere.parent.is_dir()
    assert elsewhere.parent.name.startswith("kerasdist-worker-1-") and tmp_path not in elsewhere.parents
    for bad in ("", None, 3):
        with pytest.raises(ValueError, match="path must be a file or directory path"):
            kerasdist.chief_path(bad)


def test_file_writing_callbacks_write_the_users_paths_on_the_chief_only(monkeypatch, tmp_path):
    made = lambda: [keras.callbacks.TensorBoard(str(tmp_path / "tb")),  # noqa: E731
                    keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
                    keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras")), keras.callbacks.History()]
    monkeypatch.setenv("TF_CONFIG", WORKER_1)
    chief, other = kerasdist.run_context(), kerasdist.run_context()
    chief = type(chief)(**{**chief.__dict__, "is_chief": True})
    kept = chief_writes_only(made(), chief)
    assert [kept[0].log_dir, kept[1].filename, kept[2].filepath] == [
        str(tmp_path / "tb"), str(tmp_path / "log.csv"), str(tmp_path / "m.keras")]
    moved = chief_writes_only(made(), other)
    paths = [Path(moved[0].log_dir), Path(moved[1].filename), Path(moved[2].filepath)]
    assert [p.name for p in paths] == ["tb", "log.csv", "m.keras"] and all(tmp_path not in p.parents for p in paths)


def test_backup_and_restore_is_refused_by_the_trainers_before_anything_is_written(tmp_path):
    x = np.ones((32, 4), "float32")
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    build = lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])  # noqa: E731
    with pytest.raises(ValueError, match=r"callbacks\[0\] is a Keras BackupAndRestore"):
        kerasdist.distributed_fit(build, x, x[:, 0], epochs=1, checkpoint_dir=tmp_path / "c", callbacks=[backup])
    assert not (tmp_path / "c").exists()
    assert os.listdir(tmp_path) == []
