"""Checksums of checkpoint files, as completion records hold them.

Completion records hold each file's size and CRC-32 (format 1 records hold a SHA-256 instead,
still checked). With the size beside it, a CRC-32 catches torn, truncated and garbled files (every
error burst of up to 32 bits, all but one in 2^32 other changes): damage, not tampering, is what
these checksums are for (TensorFlow's own checkpoints guard their data with CRC-32C). The one of
`model.keras` is made from the CRC-32 of its weights member (`crc32_combine`), which spares a
second pass over the file (figures: bench/history/2026-11-25-checkpoints.md, "14:11-15:20"); on a local
store that one is computed in a thread while the file is written (`PendingCrc`, #47), not before.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kerasdist.checkpoint.pieces import Pieces

Content = bytes | memoryview  # a file's bytes, as saves hand them over
CHECKSUMS = ("crc32", "sha256")  # what records may hold, newest first


def describe(data: Content, crc32: int | None = None) -> dict[str, Any]:
    """The size and CRC-32 of one file's bytes, as completion records hold them; `crc32` when the
    caller already has it."""
    return {"size": len(data), "crc32": _crc32_hex(zlib.crc32(data) if crc32 is None else crc32)}


def _crc32_hex(crc: int) -> str:
    return f"{crc:08x}"


_CHUNK = 4 << 20


def checksum_of_stream(stream: Any, algorithm: str, copy_to: Any = None) -> str:
    """The checksum by `algorithm` (one of `CHECKSUMS`) of what `stream` reads. The next chunk is
    read in a thread while this one is summed (file reads, zlib's crc32 and hashlib release the
    GIL), so a cold file is checked at the pace of the slower of the two, not of both in turn.
    `copy_to`: a binary file that gets every chunk as it is summed (a download checked as it
    arrives)."""
    update, result = _summer(algorithm)
    if copy_to is not None:
        update = _copying(update, copy_to)
    buffers = (bytearray(_CHUNK), bytearray(_CHUNK))
    with ThreadPoolExecutor(1, thread_name_prefix="kerasdist-checksum") as reader:
        index = 0
        pending = reader.submit(_read_into, stream, buffers[0])
        while count := pending.result():
            pending = reader.submit(_read_into, stream, buffers[1 - index])
            update(memoryview(buffers[index])[:count])
            index = 1 - index
    return result()


def _summer(algorithm: str) -> tuple[Callable[[memoryview], None], Callable[[], str]]:
    """(update, result) of a running checksum by `algorithm`."""
    if algorithm == "crc32":
        crc = [0]

        def update(chunk: memoryview) -> None:
            crc[0] = zlib.crc32(chunk, crc[0])

        return update, lambda: _crc32_hex(crc[0])
    digest = hashlib.sha256()
    return digest.update, digest.hexdigest


def _copying(update: Callable[[memoryview], None], copy_to: Any) -> Callable[[memoryview], None]:
    def update_and_copy(chunk: memoryview) -> None:
        update(chunk)
        copy_to.write(chunk)

    return update_and_copy


def _read_into(stream: Any, buffer: bytearray) -> int:
    if hasattr(stream, "readinto"):
        return stream.readinto(buffer) or 0
    data = stream.read(len(buffer))
    buffer[:len(data)] = data
    return len(data)


_CRC32_POLYNOMIAL = 0xEDB88320  # bit-reflected, as zlib's


def _multiply_mod_polynomial(a: int, b: int) -> int:
    product, bit = 0, 1 << 31  # bit-reflected: x^0 is the top bit
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ _CRC32_POLYNOMIAL if b & 1 else b >> 1
    return product


_X_TO_2_TO_THE = [1 << 30]  # x^(2^k) modulo the polynomial, k = 0..31
for _ in range(31):
    _X_TO_2_TO_THE.append(_multiply_mod_polynomial(_X_TO_2_TO_THE[-1], _X_TO_2_TO_THE[-1]))


def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """The CRC-32 of A + B from CRC-32(A), CRC-32(B) and len(B), without reading A or B: zlib's
    `crc32_combine` (zlib 1.2.12's method), which Python's zlib does not expose."""
    power, k, n = 1 << 31, 0, 8 * length2  # x^(8 * length2), by squarings
    while n:
        if n & 1:
            power = _multiply_mod_polynomial(_X_TO_2_TO_THE[k % 32], power)
        n >>= 1
        k += 1
    return _multiply_mod_polynomial(power, crc1) ^ crc2


@dataclass
class PendingCrc:
    """A file's bytes, some of whose 4-byte fields (`fields`: offsets, outside the span) are to
    hold the CRC-32 of the span `data[start:end]`: a zip whose large member's checksum, in its
    local header and its central-directory entry, is left for the writer to compute while it
    writes the rest (`store.direct_io`). `finish` fills them in and gives the whole file's CRC-32;
    until then the bytes at `fields` are placeholders. `data` is one buffer, or `Pieces` (views of
    the values the file was written from: `pieces.py`).

    `span_crc`: the span's CRC-32 when known already (then `fields` hold it already)."""

    data: memoryview | Pieces
    start: int
    end: int
    fields: tuple[int, ...] = ()
    span_crc: int | None = None
    _crc: int | None = field(default=None, init=False)

    def crc32_of_span(self) -> int:
        """The span's CRC-32, computed now (in any thread: the bytes are only read)."""
        return _crc32(self.data, self.start, self.end)

    def finish(self, span_crc: int | None = None) -> int:
        """Fill in the fields with the span's CRC-32 (`span_crc`, else the known one, else computed
        now) and return the whole file's, made from it: the span is not read twice."""
        if self._crc is None:
            if self.span_crc is None:
                self.span_crc = self.crc32_of_span() if span_crc is None else span_crc
            for offset in self.fields:
                _pack_crc(self.data, offset, self.span_crc)
            size = len(self.data)
            crc = crc32_combine(_crc32(self.data, 0, self.start), self.span_crc, self.end - self.start)
            self._crc = crc32_combine(crc, _crc32(self.data, self.end, size), size - self.end)
        return self._crc

    def finished(self) -> Content:
        """The file's bytes, its fields filled in (`Pieces` joined into one buffer)."""
        self.finish()
        return self.data.joined() if isinstance(self.data, Pieces) else self.data


def _crc32(data: memoryview | Pieces, start: int, end: int) -> int:
    return data.crc32(start, end) if isinstance(data, Pieces) else zlib.crc32(data[start:end])


def _pack_crc(data: memoryview | Pieces, offset: int, crc: int) -> None:
    if isinstance(data, Pieces):
        data.pack_into("<I", offset, crc)
    else:
        struct.pack_into("<I", data, offset, crc)


FileContent = Content | PendingCrc  # what a save hands a store to write


def finished(content: FileContent) -> Content:
    """A file's bytes, whatever is pending in them filled in."""
    return content.finished() if isinstance(content, PendingCrc) else content
