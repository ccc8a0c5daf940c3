"""Writing a file durably, and large files without the page cache: the local store's writes.

Checkpoint files of tens of MB are written with O_DIRECT, from where they are when they start on a
page boundary (a save's file buffer), else through one reused buffer, as DeepSpeed's FastPersist
does: a checkpoint is not read back soon, and filling the page cache with it costs
several times the CPU, which a background save takes from training on a small machine (figures:
bench/README.md, "Memory the VM has handed back"). Where a filesystem refuses O_DIRECT (tmpfs, some
network filesystems) the buffered write is used.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from kerasdist.checkpoint.checksums import Content


def write_durably(path: Path, data: Content) -> None:
    """Write `data` as the file `path` and fsync it; large files bypass the page cache."""
    if len(data) >= _DIRECT_MIN_BYTES and _write_direct(path, data):
        return
    _write_and_fsync(path, data, "wb")


def _write_and_fsync(path: Path, data: Any, mode: str) -> None:
    with open(path, mode) as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())


_DIRECT_MIN_BYTES = 4 << 20
_DIRECT_ALIGN = 4096  # offsets, sizes and buffer addresses: the largest logical block size in use
_DIRECT_CHUNK = 8 << 20
_direct_buffer: mmap.mmap | None = None  # page-aligned, reused; one writer at a time
_direct_lock = threading.Lock()


def _write_direct(path: Path, data: Content) -> bool:
    """Write and fsync `data` as `path` through O_DIRECT; False (nothing left at `path`) where the
    filesystem refuses it, for the buffered path to write instead."""
    global _direct_buffer
    if not hasattr(os, "O_DIRECT"):
        return False
    aligned = len(data) - len(data) % _DIRECT_ALIGN
    source = memoryview(data).cast("B")
    in_place = _address(source) % _DIRECT_ALIGN == 0  # written from where it is, no copy
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o666)
    except OSError as error:
        if error.errno == errno.EINVAL:
            return False
        raise
    try:
        with _direct_lock:
            if _direct_buffer is None and not in_place:
                _direct_buffer = mmap.mmap(-1, _DIRECT_CHUNK)
            for start in range(0, aligned, _DIRECT_CHUNK):
                size = min(_DIRECT_CHUNK, aligned - start)
                if in_place:
                    _write_all(fd, source[start:start + size])
                else:
                    _direct_buffer[:size] = source[start:start + size]
                    _write_all(fd, memoryview(_direct_buffer)[:size])
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        os.unlink(path)  # this filesystem wants another alignment
        return False
    finally:
        os.close(fd)
    _write_and_fsync(path, source[aligned:], "ab")  # the unaligned tail; one fsync for data and metadata
    return True


def _address(view: memoryview) -> int:
    return np.frombuffer(view, np.uint8).ctypes.data if len(view) else 0


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


def fsync_directory(path: Path) -> None:
    """fsync a directory, so that the names in it (a rename, a new file) are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
