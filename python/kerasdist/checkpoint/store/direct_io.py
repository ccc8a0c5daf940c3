"""Writing a file durably, and large files without the page cache: the local store's writes.

Checkpoint files of tens of MB are written with O_DIRECT, from where they are when they start on a
page boundary (a save's file buffer, where files are not built as pieces), else through one
reused buffer (a save's `Pieces` are copied into it as they are written), as DeepSpeed's
FastPersist does: a
checkpoint is not read back soon, and filling the page cache with it costs several times the CPU,
which a background save takes from training on a small machine (figures:
bench/history/2026-11-25-checkpoints.md, "Memory the VM has handed back"). Where a filesystem
refuses O_DIRECT (tmpfs, some network filesystems) the buffered write is used.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kerasdist.checkpoint.checksums import Content, FileContent, PendingCrc
from kerasdist.checkpoint.pieces import Pieces, address_of


def write_durably(path: Path, data: FileContent) -> None:
    """Write `data` as the file `path` and fsync it; large files bypass the page cache. A
    `PendingCrc`'s checksum is computed in a thread while the rest of the file is written, and
    the blocks that hold it are written after it is filled in, before the fsync."""
    pending = data if isinstance(data, PendingCrc) else None
    content = pending.data if pending is not None else data
    if len(content) >= _DIRECT_MIN_BYTES and _write_direct(path, content, pending):
        return
    if pending is not None:
        pending.finish()  # its fields filled in, in `content`
    _write_and_fsync(path, content, "wb")


def _write_and_fsync(path: Path, data: Any, mode: str) -> None:
    """Write `data` (bytes, or `Pieces` one view at a time: never joined) at the end of `path`."""
    with open(path, mode) as stream:
        for view in data.views() if isinstance(data, Pieces) else (data,):
            stream.write(view)
        stream.flush()
        os.fsync(stream.fileno())


_DIRECT_MIN_BYTES = 4 << 20
_DIRECT_ALIGN = 4096  # offsets, sizes and buffer addresses: the largest logical block size in use
_DIRECT_CHUNK = 8 << 20
_direct_buffer: mmap.mmap | None = None  # page-aligned, reused; one writer at a time
_direct_lock = threading.Lock()


def _write_direct(path: Path, data: Content | Pieces, pending: PendingCrc | None = None) -> bool:
    """Write and fsync `data` as `path` through O_DIRECT; False (nothing left at `path`) where the
    filesystem refuses it, for the buffered path to write instead. With `pending` (whose bytes
    `data` are), its span's CRC-32 is computed in a thread (zlib's crc32 releases the GIL) while
    the blocks without its fields are written, then those fields are filled in and their blocks
    and the unaligned tail written. `Pieces` are copied through the reused buffer."""
    global _direct_buffer
    if not hasattr(os, "O_DIRECT"):
        return False
    aligned = len(data) - len(data) % _DIRECT_ALIGN
    source = data if isinstance(data, Pieces) else memoryview(data).cast("B")
    in_place = not isinstance(source, Pieces) and address_of(source) % _DIRECT_ALIGN == 0  # no copy
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o666)
    except OSError as error:
        if error.errno == errno.EINVAL:
            return False
        raise
    try:
        with _direct_lock, ThreadPoolExecutor(1, thread_name_prefix="kerasdist-crc") as summer:
            if _direct_buffer is None and not in_place:
                _direct_buffer = mmap.mmap(-1, _DIRECT_CHUNK)
            span_crc = None
            if pending is not None and pending.span_crc is None:
                span_crc = summer.submit(pending.crc32_of_span)
            body, last = _blocks_in_order(aligned, pending.fields if pending is not None else ())
            for start, end in body:
                _write_at(fd, source, start, end, in_place)
            if pending is not None:
                pending.finish(span_crc.result() if span_crc is not None else None)
            for start, end in last:
                _write_at(fd, source, start, end, in_place)
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        os.unlink(path)  # this filesystem wants another alignment
        return False
    finally:
        os.close(fd)
    tail = source.read_at(aligned, len(source) - aligned) if isinstance(source, Pieces) else source[aligned:]
    _write_and_fsync(path, tail, "ab")  # the unaligned tail; one fsync for data and metadata
    return True


def _blocks_in_order(aligned: int, fields: tuple[int, ...]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The ranges of the file's first `aligned` bytes in chunks (aligned, at most `_DIRECT_CHUNK`):
    those without any of `fields` (4 bytes each), then the blocks holding them, to write last."""
    held = sorted({offset // _DIRECT_ALIGN * _DIRECT_ALIGN for field in fields
                   for offset in (field, field + 3) if offset < aligned})
    body, start = [], 0
    for end in [*held, aligned]:
        body += [(at, min(at + _DIRECT_CHUNK, end)) for at in range(start, end, _DIRECT_CHUNK)]
        start = end + _DIRECT_ALIGN if end < aligned else end
    return body, [(block, block + _DIRECT_ALIGN) for block in held]


def _write_at(fd: int, source: memoryview | Pieces, start: int, end: int, in_place: bool) -> None:
    os.lseek(fd, start, os.SEEK_SET)
    if in_place:
        assert isinstance(source, memoryview)
        _write_all(fd, source[start:end])
        return
    assert _direct_buffer is not None
    chunk = memoryview(_direct_buffer)[:end - start]
    if isinstance(source, Pieces):
        source.copy_into(start, chunk)
    else:
        chunk[:] = source[start:end]
    _write_all(fd, chunk)



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
