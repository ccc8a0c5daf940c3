"""A checkpoint's state taken cheaply on the training thread, its files written later (elsewhere).

`take_snapshot(model)` is what a background save blocks training for: it records everything
`model.save` would write and `rng.npz` holds, while the model does not change. `StateSnapshot.files()`
then makes the checkpoint's files (`{"model.keras": bytes, "rng.npz": bytes}`) from the snapshot
alone, in any thread, while training goes on: the same `.keras` zip `model.save` writes (the same
members and layout; the weights file holds the same groups, datasets and attributes, in the same
order), which `keras.models.load_model` and `CheckpointManager.restore` read as usual.

How it stays cheap. `model.save` (Keras 3.15's `saving_lib._save_model_to_fileobj`) serializes the
config, then walks the model (`saving_lib._save_state`), handing each saveable an `H5IOStore` to
put its variables in, and writes each value into an HDF5 file as it comes. The snapshot runs the
same walk with a store that only records what it is given (`_RecordingStore`): every path,
metadata and key, in order, and each value, frozen:
- a Keras variable as a tensor read of it: TensorFlow's variable reads are snapshots (an update
  of a variable whose value is still referenced copies it first), so the read costs no copy and
  later training steps cannot change it. Reads that land elsewhere than this host's CPU (GPU
  memory, a parameter server) are copied to host memory at once, so a snapshot never holds
  accelerator memory or remote values.
- anything else (the NumPy arrays optimizers hand over, a layer's own arrays) as a NumPy copy.
Assets (lookup-layer vocabularies) are written by their layers into a temporary directory, as
`model.save` does, and read back into memory. `files()` replays the recorded calls into a real
`H5IOStore` inside a new zip, so the weights file is built by Keras's own writer.

The walk and the stores are Keras internals: `keras_snapshot_supported` gates them on the Keras
versions checked (`compat.KERAS_SNAPSHOT_VERSIONS`); on others `take_snapshot` makes the files at
once with `model.save` (correct, not cheap), and tests/python/test_background_save.py fails so
that the shim is checked again.
"""

from __future__ import annotations

import functools
import io
import os
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kerasdist import compat
from kerasdist.checkpoint.model_state import seed_states

MODEL_FILE = "model.keras"
RNG_FILE = "rng.npz"


@dataclass
class _Entry:
    """One `store.make(path, metadata)` of the walk and the values set after it."""

    path: str
    metadata: dict[str, Any] | None
    values: list[tuple[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class StateSnapshot:
    """Everything a checkpoint's files hold, frozen; `files()` makes them."""

    make_files: Callable[[], dict[str, bytes]]

    def files(self) -> dict[str, bytes]:
        """The checkpoint's files by name: `model.keras` and `rng.npz`."""
        return self.make_files()


def take_snapshot(model: Any) -> StateSnapshot:
    """Record `model`'s state for a checkpoint; call it on the training thread, between steps."""
    rng = [np.array(state) for state in seed_states(model)]
    if compat.keras_snapshot_supported():
        recorded = _record_model(model)
        return StateSnapshot(lambda: {MODEL_FILE: recorded.keras_bytes(), RNG_FILE: npz_bytes(rng)})
    files = {MODEL_FILE: keras_bytes_now(model), RNG_FILE: npz_bytes(rng)}
    return StateSnapshot(lambda: files)


def npz_bytes(arrays: list[np.ndarray]) -> bytes:
    """`np.savez` of `arrays` (named arr_0, arr_1, ...) as bytes."""
    buffer = io.BytesIO()
    np.savez(buffer, *arrays)
    return buffer.getvalue()


def keras_bytes_now(model: Any) -> bytes:
    """`model.save`'s `.keras` file as bytes, written now."""
    return compat.keras_model_bytes(model)


# --------------------------------------------------------------------------------------------
# The recorded walk (Keras 3.15 internals: saving_lib)


@dataclass(frozen=True)
class _RecordedModel:
    config_json: str
    metadata_json: str
    entries: list[_Entry]
    assets: list[tuple[str, bytes]]  # (path in the zip, content), in the order Keras writes them

    def keras_bytes(self) -> bytes:
        """The `.keras` zip `saving_lib._save_model_to_fileobj` writes for the recorded state."""
        from keras.src.saving import saving_lib

        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr(saving_lib._METADATA_FILENAME, self.metadata_json)
            archive.writestr(saving_lib._CONFIG_FILENAME, self.config_json)
            store = saving_lib.H5IOStore(saving_lib._VARS_FNAME_H5, archive=archive, mode="w")
            try:
                for entry in self.entries:
                    store.make(entry.path, metadata=entry.metadata)
                    for key, value in entry.values:
                        store[key] = value.numpy() if isinstance(value, tf.Tensor) else value
            finally:
                store.close()
            for name, content in self.assets:
                archive.writestr(name, content)
        return buffer.getvalue()


def _record_model(model: Any) -> _RecordedModel:
    from keras.src.saving import saving_lib

    compat.warm_saving_skipsets()  # outside any strategy scope: callbacks run outside it
    config_json, metadata_json = saving_lib._serialize_model_as_json(model)
    weights = _RecordingStore()
    assets_archive = _AssetRecorder()
    assets = saving_lib.DiskIOStore(saving_lib._ASSETS_DIRNAME, archive=assets_archive, mode="w")
    try:
        saving_lib._save_state(model, weights_store=weights, assets_store=assets, inner_path="",
                               visited_saveables=set())
    finally:
        assets.close()  # hands each asset file to the recorder, then removes the temporary directory
    return _RecordedModel(config_json, metadata_json, weights.entries, assets_archive.files)


def _host_cpu() -> tf.DeviceSpec:
    with tf.device("CPU:0"):
        return tf.DeviceSpec.from_string(tf.constant(0).device)


def _frozen(value: Any, host: tf.DeviceSpec) -> Any:
    """`value` as it is now, unaffected by later training steps (see the module docstring)."""
    if isinstance(value, keras.Variable):
        read = tf.convert_to_tensor(value.value)
        device = tf.DeviceSpec.from_string(read.device)
        if device.device_type == "CPU" and (device.job, device.replica, device.task) == (
                host.job, host.replica, host.task):
            return read
        return read.numpy()
    if isinstance(value, tf.Tensor):  # immutable
        return value
    if isinstance(value, np.ndarray) and _unshared(value):
        return value
    return np.array(keras.ops.convert_to_numpy(value), copy=True)


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
        store = _RecordingStore()
        store.make("")
        store["fresh"] = np.zeros(1)
        held = np.zeros(1)
        store["held"] = held
        fresh, held_count = _calibration
    finally:
        _calibration = None
    return fresh if fresh < held_count else 0


@functools.cache
def _store_class() -> type:
    from keras.src.saving import saving_lib

    class RecordingStore(saving_lib.H5IOStore):  # `_save_state` accepts only Keras's stores
        """Records the walk's `make` and `__setitem__` calls instead of writing HDF5."""

        def __init__(self) -> None:  # no HDF5 file: nothing of H5IOStore's own state is used
            self.mode = "w"
            self.entries: list[_Entry] = []
            self._host = _host_cpu()

        def __bool__(self) -> bool:
            return True

        def make(self, path: str, metadata: dict[str, Any] | None = None) -> RecordingStore:
            self.entries.append(_Entry(path, dict(metadata) if metadata else None))
            return self

        def __setitem__(self, key: str, value: Any) -> None:
            self.entries[-1].values.append((key, _frozen(value, self._host)))

        def __getitem__(self, key: str) -> Any:
            return dict(self.entries[-1].values)[key]

        def __contains__(self, key: object) -> bool:
            return any(name == key for name, _ in self.entries[-1].values)

        def __len__(self) -> int:
            return len(self.entries[-1].values) if self.entries else 0

        def keys(self) -> list[str]:
            return [name for name, _ in self.entries[-1].values]

        def close(self) -> None:
            pass

    return RecordingStore


def _RecordingStore() -> Any:  # noqa: N802  (a class made on first use: saving_lib loads late)
    return _store_class()()


class _AssetRecorder:
    """Stands in for the zip archive `DiskIOStore.close` writes the asset files into."""

    def __init__(self) -> None:
        self.files: list[tuple[str, bytes]] = []

    def __bool__(self) -> bool:
        return True

    def write(self, filename: str | os.PathLike[str], arcname: str) -> None:
        self.files.append((arcname, Path(filename).read_bytes()))
