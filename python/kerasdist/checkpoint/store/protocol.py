"""What every store offers (`Store`) and the one rule both implementations keep: the commit
marker is written last and deleted first.

A store holds entries (`ckpt-<step>`, one checkpoint each) of named files. An entry is a
checkpoint once its commit marker (`layout.COMMIT_MARKER`) is there; how the store makes that
moment atomic is its own business (a rename on a local disk, the marker's upload on an object
store), as in Orbax's `atomicity.py`. Callers pass contents and names, never paths.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kerasdist.checkpoint.checksums import FileContent

Summed = tuple[Path, dict[str, tuple[int, str]]]  # a local directory, and name -> (size, checksum)


@runtime_checkable
class Store(Protocol):
    """Where one `checkpoint_dir`'s checkpoints live (`store.open_store` makes one)."""

    @property
    def directory(self) -> Path | str:
        """The checkpoint directory: a Path for a local one, the URL for an object store."""

    @property
    def location(self) -> str:
        """The directory or URL, as messages and `CheckpointInfo.path` show it."""

    @property
    def is_local(self) -> bool:
        """True where `directory` is a folder of this machine's file system (a Path)."""

    def same_as(self, other: Any) -> bool:
        """Whether `other` is a store of the same place (and options)."""

    def prepare(self) -> None:
        """Make sure checkpoints can be written (create, probe); a ValueError naming
        checkpoint_dir otherwise."""

    def path_of(self, entry: str) -> str:
        """The path or URL of an entry."""

    def entry_of(self, path: str) -> str:
        """The entry a path or URL of `path_of` names."""

    def entries(self) -> list[str]:
        """The entries that claim to be checkpoints by name, sorted by name."""

    def is_entry(self, entry: str) -> bool:
        """Whether `entry` exists and holds something."""

    def fingerprint(self, entry: str) -> tuple[Any, ...] | None:
        """What changes when the entry's files change (sizes, versions); None if unreadable."""

    def size(self, entry: str, name: str) -> int | None:
        """The size of one file of an entry; None if it is missing."""

    def read(self, entry: str, name: str) -> bytes:
        """One file's contents."""

    def checksum(self, entry: str, name: str, algorithm: str) -> str:
        """One file's checksum by `algorithm` (one of `checksums.CHECKSUMS`)."""

    def summed_files(self, entry: str, algorithms: Mapping[str, str]) -> AbstractContextManager[Summed]:
        """A local directory holding the files of `entry` that `algorithms` names (name -> one of
        `checksums.CHECKSUMS`), each summed as it is read, for as long as the block runs: the
        block gets the directory and each file's (size, checksum), a missing file left out. A
        local store sums them where they are; an object store downloads each once, summing it
        as it arrives, into a temporary directory (on disk, not in memory)."""

    def commit(self, step: int, files: Mapping[str, FileContent], marker: Callable[[], bytes]) -> str:
        """Write `files` as the checkpoint of `step`, then the commit marker, whose bytes `marker`
        makes once they are written (the record holds CRC-32s a `PendingCrc` gets only then), last
        and atomically; returns the entry's name. A crash at any byte leaves no entry that passes
        for one."""

    def remove(self, entry: str) -> None:
        """Delete an entry, its commit marker first."""

    def remove_temporary(self) -> list[str]:
        """Delete what interrupted saves left; returns the paths removed."""

    def write_run_file(self, name: str, data: bytes) -> None:
        """Replace one file of the run log (`runs/<name>`, see `run_log.py`) whole, atomically."""

    def run_files(self) -> dict[str, bytes]:
        """The run log's files (`runs/`), name -> contents, sorted by name."""

