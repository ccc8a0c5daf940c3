"""Checkpoints in a local directory (a plain path or a `file://` URL): the rename is the commit.

A checkpoint is written under a temporary name, every file fsynced, the commit marker (the
completion record) last, and the directory renamed into place. This is the layout and the
guarantee of every kerasdist version so far. Files of 4 MB and more bypass the page cache where
the filesystem allows (`direct_io`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kerasdist.checkpoint.checksums import FileContent, checksum_of_stream
from kerasdist.checkpoint.layout import (
    CHECKPOINT_PREFIX,
    COMMIT_MARKER,
    REPLACED_MARK,
    RUNS_FOLDER,
    TEMP_PREFIX,
    entry_name,
)
from kerasdist.checkpoint.store.direct_io import fsync_directory, write_durably
from kerasdist.checkpoint.store.protocol import Summed


class LocalStore:
    """Checkpoints in a local directory: fsync and atomic rename (see the module docstring)."""

    def __init__(self, directory: Path):
        if directory.exists() and not directory.is_dir():
            raise ValueError(f"checkpoint_dir {str(directory)!r} is a file, not a directory.")
        self.directory = directory

    @property
    def location(self) -> str:
        """The directory as messages and `CheckpointInfo.path` show it."""
        return str(self.directory)

    @property
    def is_local(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"LocalStore({self.location!r})"

    def same_as(self, other: Any) -> bool:
        if not isinstance(other, LocalStore):
            return False
        try:
            return self.directory.resolve() == other.directory.resolve()
        except OSError:
            return False

    def prepare(self) -> None:
        """Create the directory if needed and write (then delete) a file in it."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f"{TEMP_PREFIX}probe-{uuid.uuid4().hex[:8]}"
            probe.write_bytes(b"")
            probe.unlink(missing_ok=True)  # the chief may have swept it already (remove_temporary)
        except OSError as err:
            raise ValueError(f"checkpoint_dir {self.location!r} is not writable: {err.strerror}.") from None

    # -- reading ---------------------------------------------------------------------------
    def path_of(self, entry: str) -> str:
        return str(self.directory / entry)

    def entry_of(self, path: str) -> str:
        return Path(path).name

    def entries(self) -> list[str]:
        """Names of the entries that claim to be checkpoints (by name), sorted by name."""
        if not self.directory.is_dir():
            return []
        return sorted(p.name for p in self.directory.glob(f"{CHECKPOINT_PREFIX}*"))

    def is_entry(self, entry: str) -> bool:
        return (self.directory / entry).is_dir()

    def fingerprint(self, entry: str) -> tuple[Any, ...] | None:
        """Size and modification time of the entry's files; None if unreadable."""
        try:
            return tuple(
                (item.name, item.stat().st_size, item.stat().st_mtime_ns)
                for item in sorted((self.directory / entry).iterdir())
            )
        except OSError:
            return None

    def size(self, entry: str, name: str) -> int | None:
        """The size of one file of an entry; None if it is missing."""
        path = self.directory / entry / name
        return path.stat().st_size if path.is_file() else None

    def read(self, entry: str, name: str) -> bytes:
        return (self.directory / entry / name).read_bytes()

    def checksum(self, entry: str, name: str, algorithm: str) -> str:
        """One file's checksum by `algorithm` (one of `CHECKSUMS`), as records hold it."""
        with open(self.directory / entry / name, "rb") as stream:
            return checksum_of_stream(stream, algorithm)

    @contextlib.contextmanager
    def summed_files(self, entry: str, algorithms: Mapping[str, str]) -> Iterator[Summed]:
        """The entry itself, and the size and checksum of each file `algorithms` names that is
        there. The manager's local restores do not call it (their listing verified the entry and
        they load it in place); it keeps `record.verified_files` a function of any store."""
        sums = {}
        for name, algorithm in algorithms.items():
            with contextlib.suppress(FileNotFoundError, IsADirectoryError), \
                    open(self.directory / entry / name, "rb") as stream:
                sums[name] = (os.fstat(stream.fileno()).st_size, checksum_of_stream(stream, algorithm))
        yield self.directory / entry, sums

    # -- writing ---------------------------------------------------------------------------
    def commit(self, step: int, files: Mapping[str, FileContent], marker: Callable[[], bytes]) -> str:
        """Write `files` as checkpoint `ckpt-<step>` atomically (each fsynced, a `PendingCrc`'s
        checksum computed while it is written, then the commit marker `marker` makes, then one
        rename); returns the entry's name."""
        temp = self.directory / f"{TEMP_PREFIX}{step}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        temp.mkdir(parents=True)
        try:
            for name, content in files.items():
                write_durably(temp / name, content)
            write_durably(temp / COMMIT_MARKER, marker())
            fsync_directory(temp)
            final = self.directory / entry_name(step)
            _rename_into_place(temp, final)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        return final.name

    def remove(self, entry: str) -> None:
        """Delete an entry, its commit marker first."""
        with contextlib.suppress(OSError):
            (self.directory / entry / COMMIT_MARKER).unlink()
        shutil.rmtree(self.directory / entry, ignore_errors=True)

    def remove_temporary(self) -> list[str]:
        """Delete temporary directories left by interrupted saves; returns what was removed."""
        removed = []
        for temp in self.directory.glob(f"{TEMP_PREFIX}*"):
            shutil.rmtree(temp, ignore_errors=True)
            removed.append(str(temp))
        return removed

    # -- the run log -----------------------------------------------------------------------
    def write_run_file(self, name: str, data: bytes) -> None:
        """Replace `runs/<name>` by a rename; not fsynced: the log is no checkpoint, and a host
        crash that loses its last lines loses no training."""
        folder = self.directory / RUNS_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        temp = folder / f".{name}.{os.getpid()}.tmp"
        temp.write_bytes(data)
        os.replace(temp, folder / name)

    def run_files(self) -> dict[str, bytes]:
        folder = self.directory / RUNS_FOLDER
        if not folder.is_dir():
            return {}
        return {path.name: path.read_bytes() for path in sorted(folder.iterdir())
                if path.is_file() and not path.name.startswith(".")}


def _rename_into_place(temp: Path, final: Path) -> None:
    """Rename the finished temporary directory into place; the rename is the commit.

    When `final` exists (the same step saved again, e.g. preempted right after a save) it is
    first renamed to `ckpt-<step>.replaced-<id>`: still a checkpoint by name and record, so a
    crash between the two renames leaves it listed and restorable (with `keep=1` it may be the
    only one), never a temporary directory that the next start deletes. It is removed once the
    new checkpoint is in place; a crash before that leaves two checkpoints of one step, and the
    older by record is pruned like any other.
    """
    if final.exists():
        displaced = final.with_name(f"{final.name}{REPLACED_MARK}{uuid.uuid4().hex[:8]}")
        os.rename(final, displaced)
        fsync_directory(final.parent)
        os.rename(temp, final)
        fsync_directory(final.parent)
        shutil.rmtree(displaced, ignore_errors=True)
    else:
        os.rename(temp, final)
    fsync_directory(final.parent)
