"""Keras's saving library where its public API falls short, each use gated on the Keras versions
checked (why and the canaries: docs/upstream.md):
- `warm_saving_skipsets`: saving_lib caches its attribute skip-sets under a key it never reads;
- `keras_model_bytes`: the public `save_model` refuses file objects;
- `record_save` and `write_keras_zip`: `model.save` in two halves, for background checkpoint
  saves (`checkpoint/snapshot.py`): Keras's own walk of the model, recorded on the training thread
  (`record_save`), then replayed into Keras's own HDF5 store and `.keras` zip later, in any thread
  (`write_keras_zip`). `keras_snapshot_supported` says whether this Keras is one they were checked
  on. `write_keras_zip` can leave the weights member's CRC-32 out of the zip (zeros), for the
  writer to compute while it writes the file: zipfile has no way to store a member whose
  checksum the caller fills in, so the member's writer is told its data without the checksum
  pass (zipfile internals, `zip_crc_later_supported`: the Pythons checked).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import h5py
import keras
import numpy as np

from kerasdist.compat.versions import version_within

# Keras releases whose saving_lib caches its attribute skip-sets under a key it never reads
# (3.15.1 checked).
SAVING_SKIPSET_FIX_VERSIONS = ((3, 0), (3, 16))
_SKIPSET_TYPES = ("Operation", "Layer", "Functional", "Sequential", "Metric", "Optimizer", "Loss",
                  "Cross", "Feature")


def keras_needs_skipset_fix(version: str = keras.__version__) -> bool:
    return version_within(version, SAVING_SKIPSET_FIX_VERSIONS)


def warm_saving_skipsets() -> None:
    """Fill the cache Keras's saving_lib reads its attribute skip-sets from. Must run outside
    any strategy scope (it makes reference objects, an Optimizer with variables among them).

    `saving_lib.get_attr_skipset` stores each set under "saving_attr_skipset_<type>" but looks
    for "saving_attr_skiplist_<type>", so every save and load makes its reference objects again,
    and a reference Optimizer's two variables inside a MultiWorkerMirroredStrategy scope are
    created by collectives that only the worker that loads joins ("Collective instance ...
    expected type 0 ... but got type 1" when only the chief restores). Filled once under the key
    it reads, the sets are never made in a scope. `keras.backend.clear_session()` empties the
    cache, so callers warm it before each restore (cheap when warm).
    """
    if not keras_needs_skipset_fix():
        return
    from keras.src.backend.common import global_state
    from keras.src.saving import saving_lib

    for obj_type in _SKIPSET_TYPES:
        key = f"saving_attr_skiplist_{obj_type}"
        if global_state.get_global_attribute(key) is None:
            global_state.set_global_attribute(key, saving_lib.get_attr_skipset(obj_type))


# Keras releases whose saving internals `record_save` and `write_keras_zip` use (3.15.1 checked):
# the model walk `saving_lib._save_state`, `_serialize_model_as_json`, `H5IOStore` and
# `DiskIOStore`, `BaseOptimizer.save_own_variables`, and the names of the files in a `.keras` zip.
KERAS_SNAPSHOT_VERSIONS = ((3, 15), (3, 16))


def keras_snapshot_supported(version: str = keras.__version__) -> bool:
    """Whether background checkpoint saves may snapshot this Keras's models cheaply (else they
    write the whole model on the training thread, as a synchronous save does)."""
    return version_within(version, KERAS_SNAPSHOT_VERSIONS)


# Pythons whose zipfile member writer (`zipfile._ZipWriteFile`: `_fileobj`, `_compressor`,
# `_file_size`, `_crc`) `write_keras_zip`'s `crc_later` uses (3.10 to 3.13 read, 3.11 run).
ZIP_CRC_LATER_PYTHONS = ((3, 10), (3, 14))


def zip_crc_later_supported(version: str = ".".join(map(str, sys.version_info[:2]))) -> bool:
    """Whether `write_keras_zip` can leave the weights member's CRC-32 for the caller to fill in
    on this Python (else the zip computes it, as zipfile always does)."""
    return version_within(version, ZIP_CRC_LATER_PYTHONS)


def keras_model_bytes(model: Any) -> bytes:
    """The `.keras` archive of `model` (what `model.save("x.keras")` writes) as bytes."""
    try:
        from keras.src.saving import saving_lib
    except ImportError:  # the library moved: the same archive through a temporary file
        saving_lib = None
    if saving_lib is not None:
        archive = io.BytesIO()
        saving_lib.save_model(model, archive)
        return archive.getvalue()
    with tempfile.TemporaryDirectory(prefix="kerasdist-save-") as temp:
        path = os.path.join(temp, "model.keras")
        model.save(path)
        with open(path, "rb") as stream:
            return stream.read()


# --------------------------------------------------------------------------------------------
# `model.save` in two halves: the walk recorded, then replayed into the file


@dataclass
class SavedEntry:
    """One `store.make(path, metadata)` of Keras's walk and the values set after it."""

    path: str
    metadata: dict[str, Any] | None
    values: list[tuple[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class RecordedSave:
    """What `model.save` would write for a model, as `record_save` recorded it."""

    config_json: str
    metadata_json: str
    entries: list[SavedEntry]
    assets: list[tuple[str, bytes]]  # (path in the zip, content), in the order Keras writes them


def record_save(model: Any, freeze: Callable[[Any], Any]) -> RecordedSave:
    """Run the walk `model.save` runs (Keras 3.15's `saving_lib._save_model_to_fileobj`: the
    config, then `saving_lib._save_state` handing each saveable a store for its variables) with a
    store that records every path, metadata and key, in order, and each value as `freeze(value)`
    returns it (which must keep it as it is now, whatever training does next). Optimizers hand over
    their variables themselves for it, not the `variable.numpy()` copies they give `model.save`.
    Assets (lookup-layer vocabularies) are written by their layers into a temporary directory, as
    `model.save` does, and read back into memory. Call it outside any strategy scope."""
    from keras.src.saving import saving_lib

    warm_saving_skipsets()  # outside any strategy scope: callbacks run outside it
    config_json, metadata_json = saving_lib._serialize_model_as_json(model)
    weights = recording_store(freeze)
    assets = _assets_on_demand_class()()
    try:
        with _optimizers_hand_over_variables(model):
            saving_lib._save_state(model, weights_store=weights, assets_store=assets, inner_path="",
                                   visited_saveables=set())
    finally:
        assets.close()  # keeps each asset file's bytes, then removes the temporary directory
    return RecordedSave(config_json, metadata_json, weights.entries, assets.files)


def recording_store(freeze: Callable[[Any], Any]) -> Any:
    """The weights store `record_save` hands Keras's walk: `make(path, metadata)` starts an entry
    of its `entries`, `store[key] = value` adds `(key, freeze(value))` to the last one."""
    return _store_class()(freeze)


class WeightsFile(Protocol):
    """A seekable binary file h5py writes the weights into, `view()`, the bytes written, and
    `lend(array)`, told of each value just before h5py writes it (a file may keep a view of the
    array's memory instead of a copy of what h5py hands it from there)."""

    def lend(self, array: np.ndarray) -> None: ...
    def write(self, data: Any) -> int: ...
    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int: ...
    def tell(self) -> int: ...
    def view(self) -> memoryview: ...


def write_keras_zip(recorded: RecordedSave, archive_file: Any, weights_file_for: Callable[[str], WeightsFile],
                    weights_zip64: bool = False, crc_later: bool = False) -> tuple[zipfile.ZipInfo, bool]:
    """Write the `.keras` zip `model.save` writes for `recorded` into `archive_file` (the same
    members, in the same order; the weights file holds the same groups, datasets and attributes,
    in the same order, written by Keras's own `H5IOStore`, without its copy of each value).
    `weights_file_for(name)` is called just before the weights member `name` goes into the zip,
    `archive_file` then being where that member's header will start; the weights are written into
    the file it returns, then stored from its `view()`, with a ZIP64 field in its local header when
    `weights_zip64` (zipfile's own rule otherwise: over about 2 GiB), so that the caller knows
    where its data starts. With `crc_later` (where `zip_crc_later_supported`), the weights
    member's CRC-32 is left at 0 in its local header and central-directory entry, for the caller to
    fill in. Returns the weights member's entry and whether its CRC-32 was left out."""
    from keras.src.saving import saving_lib

    with zipfile.ZipFile(archive_file, "w") as archive:
        archive.writestr(saving_lib._METADATA_FILENAME, recorded.metadata_json)
        archive.writestr(saving_lib._CONFIG_FILENAME, recorded.config_json)
        name = saving_lib._VARS_FNAME_H5
        weights_file = weights_file_for(name)
        store = _writer_class()(weights_file)
        try:
            for entry in recorded.entries:
                store.make(entry.path, metadata=entry.metadata)
                for key, value in entry.values:
                    array = np.asarray(value)  # a tensor's own memory, no copy
                    weights_file.lend(array)
                    store[key] = array
        finally:
            store.close()
        crc_left = _write_member(archive, name, weights_file.view(), weights_zip64,
                                 crc_later and zip_crc_later_supported())
        for asset, content in recorded.assets:
            archive.writestr(asset, content)
    return archive.getinfo(name), crc_left


def _write_member(archive: zipfile.ZipFile, name: str, data: memoryview, force_zip64: bool,
                  crc_later: bool) -> bool:
    """`archive.writestr(name, data)` (the same entry), its local header given a ZIP64 field also
    below zipfile's size for one when `force_zip64`; with `crc_later`, a stored member's CRC-32 is
    left at 0 (the member's writer is handed the data as zipfile's own `write` would, but for
    the checksum). Returns whether it was left out."""
    info = zipfile.ZipInfo(name, date_time=time.localtime(time.time())[:6])
    info.compress_type = archive.compression
    info.external_attr = 0o600 << 16
    info.file_size = len(data)
    with archive.open(info, "w", force_zip64=force_zip64) as member:
        if crc_later and not member._compressor:
            member._fileobj.write(data)
            member._file_size += len(data)
            return True
        member.write(data)
    return False


@contextlib.contextmanager
def _optimizers_hand_over_variables(model: Any) -> Iterator[None]:
    """Keras optimizers save `store[str(i)] = variable.numpy()` (`BaseOptimizer.save_own_variables`):
    a copy, on the training thread, into freshly allocated memory. During the walk they hand the
    variables themselves to the store instead, which freezes them as it freezes the layers'."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    def hand_over(optimizer: Any, store: Any) -> None:
        for i, variable in enumerate(optimizer.variables):
            store[str(i)] = variable

    patched = []
    optimizer = getattr(model, "optimizer", None)
    while isinstance(optimizer, BaseOptimizer) and optimizer not in patched:
        if type(optimizer).save_own_variables is BaseOptimizer.save_own_variables:
            object.__setattr__(optimizer, "save_own_variables", functools.partial(hand_over, optimizer))
            patched.append(optimizer)
        optimizer = getattr(optimizer, "inner_optimizer", None)  # LossScaleOptimizer
    try:
        yield
    finally:
        for optimizer in patched:
            object.__delattr__(optimizer, "save_own_variables")


@functools.cache
def _store_class() -> type:
    from keras.src.saving import saving_lib

    class RecordingStore(saving_lib.H5IOStore):  # `_save_state` accepts only Keras's stores
        """Records the walk's `make` and `__setitem__` calls instead of writing HDF5."""

        def __init__(self, freeze: Callable[[Any], Any]) -> None:  # no HDF5 file: none of H5IOStore's state is used
            self.mode = "w"
            self.entries: list[SavedEntry] = []
            self._freeze = freeze

        def __bool__(self) -> bool:
            return True

        def make(self, path: str, metadata: dict[str, Any] | None = None) -> RecordingStore:
            self.entries.append(SavedEntry(path, dict(metadata) if metadata else None))
            return self

        def __setitem__(self, key: str, value: Any) -> None:
            self.entries[-1].values.append((key, self._freeze(value)))

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


@functools.cache
def _writer_class() -> type:
    from keras.src.saving import saving_lib

    class WeightsWriter(saving_lib.H5IOStore):
        """Keras's writer of the weights file (its groups, attributes and datasets, in its order),
        into a file object of ours, without the copy of every value its `__setitem__` makes."""

        def __init__(self, target: WeightsFile) -> None:
            self._target = target
            super().__init__(saving_lib._VARS_FNAME_H5, mode="w")

        def _get_h5_file(self, path_or_io: Any, mode: str | None = None) -> Any:
            return h5py.File(self._target, mode="w")

        def __setitem__(self, key: str, value: np.ndarray) -> None:
            if not self._h5_entry_initialized:
                self._create_h5_group(self._h5_entry_path)
            if keras.backend.standardize_dtype(value.dtype) == "bfloat16":
                self._h5_entry_group.create_dataset(key, data=value).attrs["dtype"] = "bfloat16"
            else:
                self._h5_entry_group[key] = value

        def close(self) -> None:
            self.h5_file.close()

    return WeightsWriter


@functools.cache
def _assets_on_demand_class() -> type:
    from keras.src.saving import saving_lib

    class AssetsOnDemand(saving_lib.DiskIOStore):  # `_save_state` accepts only Keras's stores
        """Keras's asset store, its temporary directory made at the walk's first `make` (a layer
        that saves assets; a model without any makes and removes none at each save), standing in
        for the zip archive its `close` writes each asset file into: they are kept in `files`."""

        def __init__(self) -> None:  # DiskIOStore's own runs at the first make
            self.files: list[tuple[str, bytes]] = []
            self._made = False

        def make(self, path: str) -> str:
            if not self._made:
                super().__init__(saving_lib._ASSETS_DIRNAME, archive=self, mode="w")
                self._made = True
            return super().make(path)

        def write(self, filename: str | os.PathLike[str], arcname: str) -> None:
            self.files.append((arcname, Path(filename).read_bytes()))

        def close(self) -> None:
            if self._made:
                super().close()

    return AssetsOnDemand
