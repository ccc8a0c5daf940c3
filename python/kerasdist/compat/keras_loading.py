"""Keras's loading where its public API falls short, each use gated on the Keras (and TensorFlow)
versions checked (why and the canaries: docs/upstream.md):
- `load_keras_weights`: `model.load_weights(x.keras)` with the weights member read in place (no
  zip CRC, no buffered copies), each value straight into the tensor its variable takes over, for
  restores of a verified checkpoint;
- `initializers_deferred`: a build about to be restored without its random initializers, its
  large variables (an optimizer's slots too) with their memory unfilled.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import struct
import threading
import weakref
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import keras
import numpy as np
import tensorflow as tf

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
    write it); else through `model.load_weights`. In place, each plain numeric value is read by
    h5py straight into a new tensor that its variable then takes over (`TensorReader`: one pass
    over the bytes, no copy, no second buffer), on the TensorFlow versions checked. The member's
    CRC-32 is not checked here: callers verify the file first. Returns whether the weights were
    read in place."""
    span = _stored_weights_span(path) if force or keras_loads_weights_in_place() else None
    if span is None:
        model.load_weights(path)
        return False
    from keras.src.saving import saving_lib

    if not model.built:
        raise ValueError(f"model {model.name!r} is not built: build it before loading weights into it.")
    store = _reader_class()(saving_lib._VARS_FNAME_H5, archive=_MemberArchive(Path(path), *span), mode="r")
    failed: set[int] = set()
    errors: dict[int, Any] = {}
    try:
        with _reads_adopted():
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
# and takes every assignment through `Variable.assign` (its value converted by the backend
# Variable's `_convert_to_tensor`), and whose random initializers draw from `self.seed`, an int
# drawn when the initializer is made (stateless: the same values whenever called) or a
# SeedGenerator (3.15.1 checked).
KERAS_DEFERRED_INIT_VERSIONS = ((3, 15), (3, 16))
# TensorFlow releases whose eager `Tensor._numpy()` of a CPU tensor is a writable view of the
# tensor's own memory, and whose `AssignVariableOp` takes over its input tensor's memory instead of
# copying it (2.21.0 checked; the first is also checked once per process before any use).
TF_TENSOR_VIEW_VERSIONS = ((2, 21), (2, 22))
# A variable this large about to be restored starts with its memory unfilled (`tf.raw_ops.Empty`):
# the restore's value replaces that memory, untouched. Smaller ones start filled, as before.
UNFILLED_FROM_BYTES = 1 << 20


def keras_defers_initializers(version: str = keras.__version__) -> bool:
    return version_within(version, KERAS_DEFERRED_INIT_VERSIONS)


def tensorflow_reads_into_tensors(version: str = tf.__version__) -> bool:
    """Whether restores may read values straight into new tensors' memory, and start large
    variables unfilled, with this TensorFlow."""
    return version_within(version, TF_TENSOR_VIEW_VERSIONS)


class _SharedPatch:
    """Methods of Keras classes replaced while any thread is in a block that uses them: installed
    by the first thread to enter, put back by the last to leave (a patch saved and restored per
    block would leave another thread's installed for good when two blocks overlap). What a
    replacement does for a thread depends only on that thread's own blocks (`_this_thread`)."""

    def __init__(self, replacements: Callable[[], list[tuple[type, str, Callable[[Any], Any]]]]) -> None:
        self._replacements = replacements  # -> [(class, name, original -> replacement)]
        self._lock = threading.Lock()
        self._blocks = 0
        self._originals: list[tuple[type, str, Any]] = []  # (class, name, its own attribute or None)

    def __enter__(self) -> None:
        with self._lock:
            self._blocks += 1
            if self._blocks == 1:
                for cls, name, replacing in self._replacements():
                    self._originals.append((cls, name, cls.__dict__.get(name)))
                    setattr(cls, name, replacing(getattr(cls, name)))

    def __exit__(self, *raised: Any) -> None:
        with self._lock:
            self._blocks -= 1
            if self._blocks == 0:
                for cls, name, own in reversed(self._originals):
                    if own is None:  # inherited: the base class's shows again
                        delattr(cls, name)
                    else:
                        setattr(cls, name, own)
                self._originals.clear()


_this_thread = threading.local()  # .deferred: this thread's DeferredInitializers; .reads: see _read_into_tensor


# --------------------------------------------------------------------------------------------
# Values read straight into the memory of the tensors variables then take over


@functools.cache
def _reader_class() -> type:
    from keras.src.saving import saving_lib

    class TensorReader(saving_lib.H5IOStore):
        """Keras's reader of the weights file, a plain numeric dataset read by h5py straight into
        a new tensor's memory (`_read_into_tensor`) instead of Keras's array and its copy."""

        def __getitem__(self, key: str) -> Any:
            read = _read_into_tensor(saving_lib.safe_get_h5_dataset(self._h5_entry_group, key))
            return read if read is not None else super().__getitem__(key)

    return TensorReader


def _read_into_tensor(dataset: h5py.Dataset) -> np.ndarray | None:
    """`dataset`'s values read into a new CPU tensor's memory, returned as the writable numpy view
    of it a variable's `assign` then takes the tensor itself for (`_adopting`: no copy); None for
    what Keras reads its own way (a bfloat16-marked, scalar, empty or non-numeric dataset) or when
    this TensorFlow's views are not known to be the tensors' memory."""
    reads = getattr(_this_thread, "reads", None)
    if (reads is None or "dtype" in dataset.attrs or dataset.ndim == 0 or dataset.size == 0
            or dataset.dtype.kind not in "biufc" or not tensorflow_reads_into_tensors()
            or not tf.executing_eagerly() or not _tensor_views_write_through()):
        return None
    with tf.device("/CPU:0"):
        tensor = tf.raw_ops.Empty(shape=dataset.shape, dtype=tf.as_dtype(dataset.dtype.newbyteorder("=")),
                                  init=False)
    view = tensor._numpy()  # a fresh tensor, its memory shared with nothing else yet
    dataset.read_direct(view)
    reads[id(view)] = (weakref.ref(view), tensor)
    weakref.finalize(view, reads.pop, id(view), None)  # a view no variable took: its tensor goes with it
    return view


@functools.cache
def _tensor_views_write_through() -> bool:
    """Whether this TensorFlow's `_numpy()` of a new CPU tensor is a writable view of its memory
    (checked once: values written through the view, read back by a TensorFlow op)."""
    with tf.device("/CPU:0"):
        tensor = tf.raw_ops.Empty(shape=[4], dtype=tf.int32, init=False)
    view = tensor._numpy()
    if not isinstance(view, np.ndarray) or not view.flags.writeable:
        return False
    view[:] = [3, 1, 4, 1]
    return int(tf.reduce_sum(tensor * tf.constant([1, 10, 100, 1000]))) == 1413


def _adopting(convert: Callable[..., Any]) -> Callable[..., Any]:
    """The backend Variable's `_convert_to_tensor` (what `assign` converts its value with): a view
    `_read_into_tensor` gave this thread is its tensor itself, no copy; the view is read-only from
    then on, its memory the variable's."""
    from keras.src.backend import standardize_dtype

    def convert_to_tensor(variable: Any, value: Any, dtype: Any = None) -> Any:
        reads = getattr(_this_thread, "reads", None)
        view, tensor = reads.get(id(value), (None, None)) if reads else (None, None)
        if view is None or view() is not value or (
                dtype is not None and standardize_dtype(dtype) != standardize_dtype(tensor.dtype)):
            return convert(variable, value, dtype)
        del reads[id(value)]
        value.flags.writeable = False
        return tensor

    return convert_to_tensor


def _adoption_patches() -> list[tuple[type, str, Callable[[Any], Any]]]:
    from keras.src.backend import Variable as BackendVariable

    return [(BackendVariable, "_convert_to_tensor", _adopting)]


_ADOPTION = _SharedPatch(_adoption_patches)


@contextlib.contextmanager
def _reads_adopted() -> Iterator[None]:
    """In the block, this thread's `TensorReader` reads into tensors its variables take over."""
    outer = getattr(_this_thread, "reads", None)
    _this_thread.reads = {}  # id(view) -> (its weakref, its tensor), until a variable takes the tensor
    try:
        with _ADOPTION:
            yield
    finally:
        _this_thread.reads = outer


# --------------------------------------------------------------------------------------------
# A build about to be restored: no random numbers drawn, large variables left unfilled


class DeferredInitializers:
    """The variables `initializers_deferred` started without their initializer's values, with the
    initializers owed them."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[Any, Any]] = {}  # id(variable) -> (variable, initializer)
        self.deferred = 0  # how many variables started so

    def finish(self) -> None:
        """Give each deferred variable no assignment reached the value its initializer makes."""
        pending, self.pending = self.pending, {}
        for variable, initializer in pending.values():
            variable.assign(initializer(variable.shape, dtype=variable.dtype))


def _first_value(variable: Any, initializer: Any) -> Callable[..., Any] | None:
    """What a variable about to be restored starts as instead of `initializer`'s values, or None
    for its initializer's: a random initializer with an int seed (whose values do not depend on
    when it runs) gives zeros, or unfilled memory for a large variable; a constant one (zeros,
    ones) unfilled memory for a large variable. Others (a SeedGenerator's) run as usual."""
    from keras.src.initializers.constant_initializers import Constant, Ones, Zeros
    from keras.src.initializers.random_initializers import RandomInitializer

    large = variable_bytes(variable) >= UNFILLED_FROM_BYTES and tensorflow_reads_into_tensors()
    if isinstance(initializer, RandomInitializer) and isinstance(initializer.seed, int):
        return _unfilled if large else _zeros
    return _unfilled if large and isinstance(initializer, (Zeros, Ones, Constant)) else None


def variable_bytes(variable: Any) -> int:
    """A Keras variable's bytes, from its shape and dtype (also before it holds a value); 0 for
    types without a fixed size (strings)."""
    dtype = tf.as_dtype(variable._dtype)
    return math.prod(variable._shape) * dtype.size if dtype.is_numpy_compatible or dtype.is_bool else 0


def _zeros(shape: Any, dtype: Any = None) -> Any:
    return keras.ops.zeros(shape, dtype=dtype)


def _unfilled(shape: Any, dtype: Any = None) -> Any:
    return tf.raw_ops.Empty(shape=list(shape), dtype=tf.as_dtype(dtype), init=False)


def _deferred_here() -> DeferredInitializers | None:
    return getattr(_this_thread, "deferred", None)


def _initializing_deferred(initialize: Callable[..., Any]) -> Callable[..., Any]:
    def initialize_with_initializer(variable: Any, initializer: Any) -> None:
        deferred = _deferred_here()
        first = _first_value(variable, initializer) if deferred is not None else None
        if first is None:
            return initialize(variable, initializer)
        initialize(variable, first)
        deferred.pending[id(variable)] = (variable, initializer)
        deferred.deferred += 1

    return initialize_with_initializer


def _assign_noted(assign: Callable[..., Any]) -> Callable[..., Any]:
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    def assign_noting(variable: Any, value: Any) -> Any:
        result = assign(variable, value)
        deferred = _deferred_here()
        if deferred is not None and not in_stateless_scope():  # (a stateless scope only records it)
            deferred.pending.pop(id(variable), None)
        return result

    return assign_noting


def _deferral_patches() -> list[tuple[type, str, Callable[[Any], Any]]]:
    from keras.src.backend import Variable as BackendVariable
    from keras.src.backend.common.variables import Variable as CommonVariable

    return [(BackendVariable, "_initialize_with_initializer", _initializing_deferred),
            (CommonVariable, "assign", _assign_noted)]


_DEFERRAL = _SharedPatch(_deferral_patches)


@contextlib.contextmanager
def initializers_deferred(enabled: bool = True) -> Iterator[DeferredInitializers]:
    """Variables this thread makes in the block with a random, int-seeded initializer (Keras's
    defaults: GlorotUniform, RandomNormal, ... seeded when made) start as zeros instead, and those
    of 1 MiB or more (`UNFILLED_FROM_BYTES`) with such an initializer or a constant one (zeros,
    ones: an optimizer's slots) start with their memory unfilled (whatever it held); any that no
    assignment in the block reached gets its initializer's values at the block's end, the very
    values it would have had (the seed is stateless), whether or not the block raised. For a model
    built to be restored at once: a restore assigns every weight and slot, so the random numbers
    are never drawn nor the memory filled. Initializers seeded by a SeedGenerator (whose values
    depend on when they run) and all others run as usual; other threads' variables are not
    touched, in a block of their own or not. A no-op when `enabled` is false or on a Keras outside
    the gate (unfilled starts: also a TensorFlow outside `TF_TENSOR_VIEW_VERSIONS`)."""
    deferred = DeferredInitializers()
    if not (enabled and keras_defers_initializers()):
        yield deferred
        return
    outer = _deferred_here()
    _this_thread.deferred = deferred
    try:
        with _DEFERRAL:
            yield deferred
    finally:
        _this_thread.deferred = outer
        deferred.finish()
