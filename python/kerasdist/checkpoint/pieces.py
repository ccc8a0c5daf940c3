"""A file's bytes kept as pieces: views of the arrays it was written from, and small bytes of its own.

Saves build their `.keras` file this way, not in a buffer of the state's size: h5py's file-object
driver hands each dataset's write over in the array's own memory, and `Pieces` keeps a view of it where
that memory is one of the arrays it was lent, else a copy (HDF5's headers, the zip's, small
values). A fresh state-sized buffer costs seconds a GB to touch on a VM that took freed memory
back (bench/README.md, checkpoints at scale); pieces cost a view each. The local store copies them
through its small reused buffer as it writes (`store.direct_io`); anything else gets `joined()`.

A lent array must not change until the file is written: a synchronous save lends reads of the
variables, which TensorFlow keeps as they were (module docstring of `snapshot`); a background
save its copies in its `SaveMemory`, which the next snapshot reuses only once this file is
written. That h5py hands the array's memory over (h5py 3.x's file-object driver, HDF5 writing a
large contiguous dataset without its sieve buffer) is not a promise of theirs: were it to stop,
every byte would be copied (correct, one state's size of memory again), and the test of
`lent_bytes` in tests/python/test_background_save.py fails so that it is seen.
"""

from __future__ import annotations

import bisect
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

Piece = memoryview | bytearray  # a view of a lent array, or bytes of its own

_LEND_MIN_BYTES = 64 << 10  # smaller writes are copied: a few more bytes, far fewer pieces


class Pieces:
    """The bytes of one file, held as pieces in offset order; what no piece covers reads as zeros."""

    def __init__(self, lent: Iterable[np.ndarray] = ()) -> None:
        self._lent_starts: list[int] = []
        self._lent: list[np.ndarray] = []
        for array in lent:
            self.lend(array)
        self._starts: list[int] = []
        self._pieces: list[Piece] = []
        self.size = 0

    def __len__(self) -> int:
        return self.size

    @property
    def lent_bytes(self) -> int:
        """How many of the file's bytes are views of lent arrays, not copies."""
        return sum(len(piece) for piece in self._pieces if isinstance(piece, memoryview))

    def lend(self, array: np.ndarray) -> None:
        """Writes from `array`'s memory are kept as views of it from now on: it must not change
        while these pieces are in use. Small, non-contiguous or object arrays are not lent."""
        if array.nbytes >= _LEND_MIN_BYTES and array.flags.c_contiguous and not array.dtype.hasobject:
            flat = array.reshape(-1).view(np.uint8)
            at = bisect.bisect_right(self._lent_starts, address_of(flat))
            self._lent_starts.insert(at, address_of(flat))
            self._lent.insert(at, flat)

    def window(self, base: int) -> PiecesWindow:
        """A file object whose byte 0 is byte `base` of these pieces."""
        return PiecesWindow(self, base)

    def write_at(self, offset: int, data: Any) -> int:
        """Put `data`'s bytes at `offset`, over whatever was there: as a view where they lie in a
        lent array, else as a copy."""
        source = memoryview(data).cast("B")
        if not source:
            return 0
        end = offset + len(source)
        piece = self._lent_view(source)
        if piece is None and self._overwrite_in_place(offset, source):
            return len(source)
        self._cut(offset, end)
        at = bisect.bisect_left(self._starts, offset)
        if piece is None:
            before = at - 1
            if before >= 0 and isinstance(self._pieces[before], bytearray) and \
                    self._starts[before] + len(self._pieces[before]) == offset:
                self._pieces[before] += source  # adjoining bytes of its own: one piece
                self.size = max(self.size, end)
                return len(source)
            piece = bytearray(source)
        self._starts.insert(at, offset)
        self._pieces.insert(at, piece)
        self.size = max(self.size, end)
        return len(source)

    def truncate(self, size: int) -> None:
        """Cut the file to `size` bytes, or grow it with zeros."""
        if size < self.size:
            self._cut(size, self.size)
        self.size = size

    def views(self, start: int = 0, end: int | None = None) -> Iterator[Any]:
        """The bytes from `start` to `end` (the file's end), in order, as views and zeros."""
        end = self.size if end is None else min(end, self.size)
        at = max(0, bisect.bisect_right(self._starts, start) - 1)
        position = start
        while position < end:
            if at < len(self._starts) and self._starts[at] <= position:
                piece_start, piece = self._starts[at], self._pieces[at]
                if piece_start + len(piece) > position:
                    stop = min(end, piece_start + len(piece))
                    yield memoryview(piece)[position - piece_start:stop - piece_start]
                    position = stop
                at += 1
                continue
            stop = min(end, self._starts[at]) if at < len(self._starts) else end
            yield bytes(stop - position)
            position = stop

    def copy_into(self, start: int, target: Any) -> None:
        """Fill `target` (a writable buffer) with the bytes from `start`."""
        out = memoryview(target).cast("B")
        filled = 0
        for view in self.views(start, start + len(out)):
            out[filled:filled + len(view)] = view
            filled += len(view)
        out[filled:] = bytes(len(out) - filled)

    def read_at(self, offset: int, count: int) -> bytes:
        return b"".join(self.views(offset, offset + count))

    def crc32(self, start: int = 0, end: int | None = None, crc: int = 0) -> int:
        """The CRC-32 of the bytes from `start` to `end` (zlib's crc32 releases the GIL)."""
        for view in self.views(start, end):
            crc = zlib.crc32(view, crc)
        return crc

    def pack_into(self, fmt: str, offset: int, *values: Any) -> None:
        self.write_at(offset, struct.pack(fmt, *values))

    def joined(self) -> bytes:
        """The file's bytes in one buffer (one copy: `bytes()` of it is no second one)."""
        return b"".join(self.views())

    def _overwrite_in_place(self, offset: int, source: memoryview) -> bool:
        """Write `source` into the one piece of our own bytes that holds all of it (HDF5 rewrites
        its headers at close: no split, no copy of the piece)."""
        at = bisect.bisect_right(self._starts, offset) - 1
        if at < 0 or not isinstance(self._pieces[at], bytearray):
            return False
        start = offset - self._starts[at]
        piece = self._pieces[at]
        if start + len(source) > len(piece):
            return False
        piece[start:start + len(source)] = source
        return True

    def _lent_view(self, source: memoryview) -> memoryview | None:
        if len(source) < _LEND_MIN_BYTES:
            return None
        address = address_of(source)
        at = bisect.bisect_right(self._lent_starts, address) - 1
        if at < 0:
            return None
        offset = address - self._lent_starts[at]
        array = self._lent[at]
        if offset + len(source) > array.size:
            return None
        return memoryview(array[offset:offset + len(source)])

    def _cut(self, start: int, end: int) -> None:
        """Remove what pieces hold from `start` to `end`, splitting those that straddle it."""
        at = max(0, bisect.bisect_right(self._starts, start) - 1)
        while at < len(self._starts) and self._starts[at] < end:
            piece_start, piece = self._starts[at], self._pieces[at]
            piece_end = piece_start + len(piece)
            if piece_end <= start:
                at += 1
                continue
            kept = []
            if piece_start < start:
                kept.append((piece_start, piece[:start - piece_start]))
            if piece_end > end:
                kept.append((end, piece[end - piece_start:]))
            self._starts[at:at + 1] = [s for s, _ in kept]
            self._pieces[at:at + 1] = [p for _, p in kept]
            at += len(kept)


class Window:
    """A seekable binary file, as h5py's and zipfile's writers use one: its position, its size and
    the calls on them. A subclass keeps the bytes (`_write_here`, `_read_here`, `_resize`)."""

    def __init__(self) -> None:
        self._position = self._size = 0

    def write(self, data: Any) -> int:
        count = self._write_here(data)
        self._position += count
        self._size = max(self._size, self._position)
        return count

    def readinto(self, target: Any) -> int:
        out = memoryview(target).cast("B")
        count = max(0, min(len(out), self._size - self._position))
        self._read_here(out[:count])
        self._position += count
        return count

    def read(self, size: int = -1) -> bytes:
        target = bytearray(max(0, self._size - self._position) if size < 0 else size)
        return bytes(target[:self.readinto(target)])

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        origin = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        self._position = origin + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def truncate(self, size: int | None = None) -> int:
        size = self._position if size is None else size
        self._resize(size)
        self._size = size
        return size

    def flush(self) -> None:
        pass

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def _write_here(self, data: Any) -> int:
        """Put `data` at the position; return how many bytes."""
        raise NotImplementedError

    def _read_here(self, out: memoryview) -> None:
        """Fill `out` with the bytes from the position."""
        raise NotImplementedError

    def _resize(self, size: int) -> None:
        """Make the file `size` bytes long (zeros where it grows)."""
        raise NotImplementedError


class PiecesWindow(Window):
    """A file on part of a `Pieces`, from its byte `base`."""

    def __init__(self, pieces: Pieces, base: int) -> None:
        super().__init__()
        self.pieces, self._base = pieces, base

    def lend(self, array: np.ndarray) -> None:
        self.pieces.lend(array)

    def view(self) -> PiecesSpan:
        """The file's bytes, as a span of the pieces (valid while they are)."""
        return PiecesSpan(self.pieces, self._base, self._base + self._size)

    def _write_here(self, data: Any) -> int:
        start = self._base + self._position
        if isinstance(data, PiecesSpan):
            if data.pieces is not self.pieces or data.start != start:
                raise RuntimeError(f"pieces written elsewhere than where they are ({data.start} to {start}): "
                                   "not saved")
            return len(data)  # its own bytes, where they are already: nothing to copy
        return self.pieces.write_at(start, data)

    def _read_here(self, out: memoryview) -> None:
        self.pieces.copy_into(self._base + self._position, out)

    def _resize(self, size: int) -> None:
        self.pieces.truncate(self._base + size)


class PiecesSpan:
    """Bytes `start` to `end` of a `Pieces`: what a `PiecesWindow` hands over as its content."""

    def __init__(self, pieces: Pieces, start: int, end: int) -> None:
        self.pieces, self.start, self.end = pieces, start, end

    def __len__(self) -> int:
        return self.end - self.start


def address_of(buffer: Any) -> int:
    """Where `buffer`'s bytes start in memory (0 when it has none)."""
    return np.frombuffer(buffer, np.uint8).ctypes.data if len(buffer) else 0
