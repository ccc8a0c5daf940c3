"""Keras's loading where its public API falls short, each use gated on the Keras versions checked
(why and the canaries: docs/upstream.md):
- `load_keras_weights`: `model.load_weights(x.keras)` with the weights member read in place (no
  zip CRC, no buffered copies), for restores of a verified checkpoint;
- `initializers_deferred`: a build about to be restored without its random initializers.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras

from kerasdist.compat.versions import version_within

# Keras releases whose `saving_lib.load_weights_only` is `H5IOStore(_VARS_FNAME_H5, archive=...)`
# over `ZipFile.open`, walked by `_load_state` (3.15.1 checked).
KERAS_LOAD_IN_PLACE_VERSIONS = ((3, 15), (3, 16))
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length (APPNOTE 4.3.7)
_LOCAL_HEADER_SIGNATURE = b"PK\x03\x04"


def keras_loads_weights_in_place(version: str = keras.__version__) -> bool:
    """Whether `load_keras_weights` may read a `.keras` file's weights member in place with this
    Keras (else it calls `model.load_weights`)."""
    return version_within(version, KERAS_LOAD_IN_PLACE_VERSIONS)


def load_keras_weights(model: Any, path: str | os.PathLike[str], force: bool = False) -> bool:
    """Load what `model.load_weights(path)` loads from a `.keras` file (the weights of every layer
    and the optimizer's variables) into built `model`, the weights member read in place, with
    Keras's own `H5IOStore` and `_load_state`, when this Keras was checked (or `force`), `path` is
    a local regular file and the member is stored uncompressed (as `model.save` and kerasdist
    write it); else through `model.load_weights`. The member's CRC-32 is not checked here:
    callers verify the file first. Returns whether the weights were read in place."""
    span = _stored_weights_span(path) if force or keras_loads_weights_in_place() else None
    if span is None:
        model.load_weights(path)
        return False
    from keras.src.saving import saving_lib

    if not model.built:
        raise ValueError(f"model {model.name!r} is not built: build it before loading weights into it.")
    store = saving_lib.H5IOStore(saving_lib._VARS_FNAME_H5, archive=_MemberArchive(Path(path), *span), mode="r")
    failed: set[int] = set()
    errors: dict[int, Any] = {}
    try:
        saving_lib._load_state(model, weights_store=store, assets_store=None, inner_path="",
                               visited_saveables=set(), failed_saveables=failed, error_msgs=errors)
    finally:
        store.close()
    if failed:
        saving_lib._raise_loading_failure(errors)
    return True


def _stored_weights_span(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(offset, size) of the `.keras` file's weights member, when `path` is a local regular file
    and the member is stored, unencrypted and within the file; else None."""
    from keras.src.saving import saving_lib

    if not str(path).endswith(".keras") or not os.path.isfile(path):  # remote paths too
        return None
    try:
        with open(path, "rb") as stream, zipfile.ZipFile(stream) as archive:
            info = archive.getinfo(saving_lib._VARS_FNAME_H5)
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                return None
            stream.seek(info.header_offset)
            signature, name_length, extra_length = _LOCAL_HEADER.unpack(stream.read(_LOCAL_HEADER.size))
            end = stream.seek(0, os.SEEK_END)
    except (OSError, KeyError, zipfile.BadZipFile, struct.error):
        return None
    start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    if signature != _LOCAL_HEADER_SIGNATURE or start + info.file_size > end:
        return None
    return start, info.file_size


class _MemberArchive:
    """Stands in for the `ZipFile` `H5IOStore` opens the weights member of."""

    def __init__(self, path: Path, start: int, size: int) -> None:
        self.path, self.start, self.size = path, start, size

    def __bool__(self) -> bool:
        return True

    def open(self, name: str, mode: str = "r") -> _MemberFile:
        return _MemberFile(self.path, self.start, self.size)


class _MemberFile(io.RawIOBase):
    """A read-only file over bytes [start, start + size) of a file, read with `os.preadv` straight
    into the caller's buffer (h5py's reads: no copy, no rewinding seek)."""

    def __init__(self, path: Path, start: int, size: int) -> None:
        super().__init__()
        self._fd, self._start, self._size, self._position = os.open(path, os.O_RDONLY), start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(f"negative seek position {base + offset}")
        self._position = base + offset
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = max(0, min(len(view), self._size - self._position))
        done = 0
        while done < wanted:  # preadv may return short on large reads
            count = os.preadv(self._fd, [view[done:wanted]], self._start + self._position + done)
            if count == 0:
                raise OSError(f"{self._fd}: the weights member ends before its recorded size")
            done += count
        self._position += done
        return done

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


# Keras releases whose backend Variable makes its first value in `_initialize_with_initializer`
# and takes every assignment through `Variable.assign`, and whose random initializers draw from
# `self.seed`, an int drawn when the initializer is made (stateless: the same values whenever
# called) or a SeedGenerator (3.15.1 checked).
KERAS_DEFERRED_INIT_VERSIONS = ((3, 15), (3, 16))


def keras_defers_initializers(version: str = keras.__version__) -> bool:
    return version_within(version, KERAS_DEFERRED_INIT_VERSIONS)


class DeferredInitializers:
    """The variables made as zeros in `initializers_deferred`, with the initializers owed them."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[Any, Any]] = {}  # id(variable) -> (variable, initializer)
        self.deferred = 0  # how many variables started as zeros

    def finish(self) -> None:
        """Give each deferred variable no assignment reached the value its initializer makes."""
        pending, self.pending = self.pending, {}
        for variable, initializer in pending.values():
            variable.assign(initializer(variable.shape, dtype=variable.dtype))


def _deferrable(initializer: Any) -> bool:
    """A random initializer whose values do not depend on when it runs (an int seed)."""
    from keras.src.initializers.random_initializers import RandomInitializer

    return isinstance(initializer, RandomInitializer) and isinstance(initializer.seed, int)


def _zeros(shape: Any, dtype: Any = None) -> Any:
    return keras.ops.zeros(shape, dtype=dtype)


# The patch is installed once for every thread in a block and removed when the last one leaves;
# each thread's block keeps its own variables (a patch saved and restored per block would leave
# another thread's patch installed for good when two blocks overlap).
_deferral_lock = threading.Lock()
_deferral_blocks = 0
_deferral_originals: tuple[Any, Any] | None = None
_this_thread = threading.local()  # .deferred: the DeferredInitializers of this thread's block


def _deferred_here() -> DeferredInitializers | None:
    return getattr(_this_thread, "deferred", None)


def _install_deferral() -> None:
    global _deferral_blocks, _deferral_originals
    from keras.src.backend import Variable as BackendVariable
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.common.variables import Variable as CommonVariable

    with _deferral_lock:
        _deferral_blocks += 1
        if _deferral_blocks > 1:
            return
        initialize, assign = BackendVariable._initialize_with_initializer, CommonVariable.assign
        _deferral_originals = (initialize, assign)

        def initialize_zeros(variable: Any, initializer: Any) -> None:
            deferred = _deferred_here()
            if deferred is None or not _deferrable(initializer):
                return initialize(variable, initializer)
            initialize(variable, _zeros)
            deferred.pending[id(variable)] = (variable, initializer)
            deferred.deferred += 1

        def assign_noted(variable: Any, value: Any) -> Any:
            result = assign(variable, value)
            deferred = _deferred_here()
            if deferred is not None and not in_stateless_scope():  # (a stateless scope only records it)
                deferred.pending.pop(id(variable), None)
            return result

        BackendVariable._initialize_with_initializer = initialize_zeros
        CommonVariable.assign = assign_noted


def _remove_deferral() -> None:
    global _deferral_blocks, _deferral_originals
    from keras.src.backend import Variable as BackendVariable
    from keras.src.backend.common.variables import Variable as CommonVariable

    with _deferral_lock:
        _deferral_blocks -= 1
        if _deferral_blocks == 0 and _deferral_originals is not None:
            BackendVariable._initialize_with_initializer, CommonVariable.assign = _deferral_originals
            _deferral_originals = None


@contextlib.contextmanager
def initializers_deferred(enabled: bool = True) -> Iterator[DeferredInitializers]:
    """Variables this thread makes in the block with a random, int-seeded initializer (Keras's
    defaults: GlorotUniform, RandomNormal, ... seeded when made) start as zeros instead; any that
    no assignment in the block reached gets its initializer's values at the block's end, the very
    values it would have had (the seed is stateless), whether or not the block raised. For a model
    built to be restored at once: a restore assigns every weight, so the random numbers are never
    drawn. Initializers seeded by a SeedGenerator (whose values depend on when they run) and all
    others run as usual; other threads' variables are not touched, in a block of their own or not.
    A no-op when `enabled` is false or on a Keras outside the gate."""
    deferred = DeferredInitializers()
    if not (enabled and keras_defers_initializers()):
        yield deferred
        return
    outer = _deferred_here()
    _install_deferral()
    _this_thread.deferred = deferred
    try:
        yield deferred
    finally:
        _this_thread.deferred = outer
        _remove_deferral()
        deferred.finish()
