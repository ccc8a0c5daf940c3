"""Where checkpoints live: a local directory, or a prefix in an object store (s3://, gs://, memory://).

Everything kerasdist does to checkpoint files goes through a store made by `open_store`; the
format (`format.py`) and the manager (`manager.py`) never touch paths themselves.

- `LocalStore`: a directory (a plain path or a `file://` URL). A checkpoint is written under a
  temporary name, every file fsynced, the completion record (`state.json`) last, and the directory
  renamed into place: the rename is the commit. This is the layout and the guarantee of every
  kerasdist version so far. Files of 4 MB and more are written with O_DIRECT where the
  filesystem takes it (see `_write_direct`), the others through the page cache.
- `ObjectStore`: any other URL, through fsspec (s3fs for `s3://`, gcsfs for `gs://`, fsspec's own
  in-process `memory://` for tests). Object stores have no atomic rename, so a checkpoint is
  uploaded under its final name and counts only once its completion record, which holds the size
  and checksum of every other file, is uploaded last (the commit-marker design Orbax uses on GCS).
  An entry without its record is an unfinished upload: never listed as a checkpoint, deleted by
  the chief at the start of training (`remove_temporary`). A second save of a step that is already
  there goes to a new name (`ckpt-<step>.s<time>`), and the old one is deleted only once the new
  record is in place, so the only valid checkpoint is never destroyed first. Deleting a
  checkpoint deletes its record first, so a half-deleted checkpoint is never taken for a valid one.

Configuration of object stores is the ecosystem's: the AWS / Google environment variables and
credentials files (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL_S3`, `GOOGLE_APPLICATION_CREDENTIALS`,
...), or a `storage_options` mapping passed on to the fsspec filesystem (s3fs's `key`, `secret`,
`client_kwargs={"endpoint_url": ...}`, ...).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kerasdist.checkpoint.checksums import Content, checksum_of_stream

RECORD_FILE = "state.json"
MODEL_FILE = "model.keras"
RNG_FILE = "rng.npz"
CHECKPOINT_PREFIX = "ckpt-"
TEMP_PREFIX = ".tmp-ckpt-"
# Local: a checkpoint displaced by a new save of the same step keeps a `ckpt-` name (so it is
# still found) until the new one is in place: see `LocalStore.commit`.
REPLACED_MARK = ".replaced-"
# Object stores: a new save of a step already there goes to `ckpt-<step>.s<ns since epoch>`.
SAVED_AGAIN_MARK = ".s"

# scheme -> (the fsspec plugin that serves it, what to install)
_OBJECT_SCHEMES = {
    "s3": ("s3fs", "pip install 'kerasdist[s3]' (or s3fs)"),
    "s3a": ("s3fs", "pip install 'kerasdist[s3]' (or s3fs)"),
    "gs": ("gcsfs", "pip install 'kerasdist[gcs]' (or gcsfs)"),
    "gcs": ("gcsfs", "pip install 'kerasdist[gcs]' (or gcsfs)"),
    "memory": ("fsspec", "pip install fsspec"),
}
_BUCKET_SCHEMES = ("s3", "s3a", "gs", "gcs")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")


def scheme_of(checkpoint_dir: Any) -> str | None:
    """The URL scheme of `checkpoint_dir` ("s3", "file", ...), or None for a plain path."""
    if not isinstance(checkpoint_dir, str):
        return None
    found = _URL.match(checkpoint_dir)
    return found.group(1).lower() if found else None


def open_store(checkpoint_dir: Any, storage_options: Mapping[str, Any] | None = None) -> LocalStore | ObjectStore:
    """The store `checkpoint_dir` names: a `LocalStore` for a path or `file://` URL, an
    `ObjectStore` for `s3://`, `gs://` and `memory://` URLs. Checks only the argument and that the
    plugin is installed; nothing is read or written.

    Raises:
        ValueError: `checkpoint_dir` is not a path or URL, has an unsupported scheme, is a file,
            or `storage_options` is not a mapping (or is given for a local path).
        ImportError: the fsspec plugin for the scheme is not installed (the message says what
            to install).
    """
    if isinstance(checkpoint_dir, (LocalStore, ObjectStore)):
        return checkpoint_dir
    if not isinstance(checkpoint_dir, (str, os.PathLike)) or not str(checkpoint_dir):
        raise ValueError(
            "checkpoint_dir must be a directory path or a URL (s3://, gs://, memory://, file://), "
            f"got {checkpoint_dir!r}."
        )
    options = _checked_options(storage_options)
    scheme = scheme_of(checkpoint_dir)
    if scheme is None or scheme == "file":
        if options:
            raise ValueError(
                f"storage_options apply to object-store URLs (s3://, gs://, memory://); checkpoint_dir "
                f"{str(checkpoint_dir)!r} is a local directory: leave storage_options out."
            )
        return LocalStore(_local_path(checkpoint_dir) if scheme else Path(checkpoint_dir))
    if scheme not in _OBJECT_SCHEMES:
        raise ValueError(
            f"checkpoint_dir {checkpoint_dir!r} has the scheme {scheme + '://'!r}, which kerasdist does "
            f"not support: use a local path, file://, s3://, gs:// or memory://."
        )
    return ObjectStore(checkpoint_dir, scheme, options)


def _checked_options(storage_options: Any) -> dict[str, Any]:
    if storage_options is None:
        return {}
    if not isinstance(storage_options, Mapping) or not all(isinstance(k, str) for k in storage_options):
        raise ValueError(
            "storage_options must be a mapping of option names to values (a dict; a named list "
            f"in R), e.g. {{'key': ..., 'secret': ...}}, got {type(storage_options).__name__}."
        )
    return dict(storage_options)


def _local_path(url: str) -> Path:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost") or not parts.path:
        raise ValueError(
            f"checkpoint_dir {url!r} is not a local file:// URL: write file:///absolute/path."
        )
    return Path(parts.path)


# --------------------------------------------------------------------------------------------
# A local directory


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
    def local_files(self, entry: str) -> Iterator[Path]:
        """A local directory holding the entry's files (the entry itself)."""
        yield self.directory / entry

    # -- writing ---------------------------------------------------------------------------
    def commit(self, step: int, files: Mapping[str, Content]) -> str:
        """Write `files` as checkpoint `ckpt-<step>` atomically (the record last, fsynced, then
        one rename); returns the entry's name."""
        temp = self.directory / f"{TEMP_PREFIX}{step}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        temp.mkdir(parents=True)
        try:
            for name in _record_last(files):
                _write_durably(temp / name, files[name])
            _fsync_directory(temp)
            final = self.directory / f"{CHECKPOINT_PREFIX}{step}"
            _rename_into_place(temp, final)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        return final.name

    def remove(self, entry: str) -> None:
        """Delete an entry, its completion record first."""
        with contextlib.suppress(OSError):
            (self.directory / entry / RECORD_FILE).unlink()
        shutil.rmtree(self.directory / entry, ignore_errors=True)

    def remove_temporary(self) -> list[str]:
        """Delete temporary directories left by interrupted saves; returns what was removed."""
        removed = []
        for temp in self.directory.glob(f"{TEMP_PREFIX}*"):
            shutil.rmtree(temp, ignore_errors=True)
            removed.append(str(temp))
        return removed


def _record_last(files: Mapping[str, Content]) -> list[str]:
    return sorted(files, key=lambda name: name == RECORD_FILE)


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
        _fsync_directory(final.parent)
        os.rename(temp, final)
        _fsync_directory(final.parent)
        shutil.rmtree(displaced, ignore_errors=True)
    else:
        os.rename(temp, final)
    _fsync_directory(final.parent)


def _write_durably(path: Path, data: Content) -> None:
    """Write `data` as the file `path` and fsync it; large files bypass the page cache."""
    if len(data) >= _DIRECT_MIN_BYTES and _write_direct(path, data):
        return
    _write_and_fsync(path, data, "wb")


def _write_and_fsync(path: Path, data: Any, mode: str) -> None:
    with open(path, mode) as stream:
        stream.write(data)
        stream.flush()
        os.fsync(stream.fileno())


# Checkpoint files of tens of MB are written with O_DIRECT, as DeepSpeed's FastPersist does: a
# checkpoint is not read back soon, and filling the page cache with it cost 60-160 ms of CPU per
# 63 MB on this project's VMs (every page freshly handed back by the host), against about 16 ms
# for O_DIRECT through one reused buffer (bench/README.md). The CPU is what a background save
# takes from training on a small machine.
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
    source = memoryview(data)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o666)
    except OSError as error:
        if error.errno == errno.EINVAL:
            return False
        raise
    try:
        with _direct_lock:
            if _direct_buffer is None:
                _direct_buffer = mmap.mmap(-1, _DIRECT_CHUNK)
            for start in range(0, aligned, _DIRECT_CHUNK):
                size = min(_DIRECT_CHUNK, aligned - start)
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


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# An object store through fsspec


class ObjectStore:
    """Checkpoints under a URL prefix of an object store: commit by completion record (see the
    module docstring).

    Args:
        url: the checkpoint_dir URL, e.g. "s3://bucket/run".
        scheme: its scheme, one of `_OBJECT_SCHEMES`.
        storage_options: options for the fsspec filesystem (credentials, endpoint, ...).
    """

    def __init__(self, url: str, scheme: str, storage_options: Mapping[str, Any]):
        if not url.split("://", 1)[1].strip("/"):
            raise ValueError(f"checkpoint_dir {url!r} names no bucket or folder: write e.g. {scheme}://bucket/run.")
        plugin, install = _OBJECT_SCHEMES[scheme]
        try:
            import fsspec

            fsspec.get_filesystem_class(scheme)
        except ImportError:
            raise ImportError(
                f"checkpoint_dir {url!r} needs the {plugin} package, which is not installed: {install}."
            ) from None
        try:
            self.fs = fsspec.filesystem(scheme, **storage_options)
        except (TypeError, ValueError) as err:
            raise ValueError(f"storage_options for checkpoint_dir {url!r} were refused: {err}") from None
        self.scheme = scheme
        self.storage_options = dict(storage_options)
        self.root = self.fs._strip_protocol(url).rstrip("/")
        self.url = f"{scheme}://{self.root.lstrip('/')}"
        self._checked = False
        self._reachable = False

    @property
    def directory(self) -> str:
        return self.url

    @property
    def location(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r})"

    def same_as(self, other: Any) -> bool:
        return isinstance(other, ObjectStore) and (self.url, self.storage_options) == (other.url, other.storage_options)

    def prepare(self) -> None:
        """Check once that the store answers, the bucket exists and a probe object can be
        written and deleted; a ValueError naming checkpoint_dir otherwise."""
        if self._checked:
            return
        self.check_reachable()
        probe = f"{self.root}/{TEMP_PREFIX}probe-{uuid.uuid4().hex[:8]}"
        try:
            self.fs.pipe_file(probe, b"")
            with contextlib.suppress(FileNotFoundError):  # the chief may have swept it already
                self.fs.rm_file(probe)
        except Exception as err:  # noqa: BLE001 (whatever the plugin raises: named here)
            raise ValueError(f"checkpoint_dir {self.url!r} is not writable: {_reason(err)}") from None
        self._checked = True

    def check_reachable(self) -> None:
        """A ValueError naming checkpoint_dir when the endpoint does not answer or the bucket
        does not exist."""
        if self._reachable or self.scheme not in _BUCKET_SCHEMES:
            return
        bucket = self.root.lstrip("/").split("/", 1)[0]
        try:
            self.fs.info(bucket)
        except FileNotFoundError:
            raise ValueError(
                f"checkpoint_dir {self.url!r}: the bucket {bucket!r} does not exist; kerasdist does not "
                "create buckets."
            ) from None
        except PermissionError as err:
            raise ValueError(
                f"checkpoint_dir {self.url!r}: access denied ({_reason(err)}) Check the credentials "
                "(storage_options, or the environment and credentials files)."
            ) from None
        except Exception as err:  # noqa: BLE001 (whatever the plugin raises: named here)
            raise ValueError(f"checkpoint_dir {self.url!r} cannot be reached: {_reason(err)}") from None
        self._reachable = True

    # -- reading ---------------------------------------------------------------------------
    def path_of(self, entry: str) -> str:
        return f"{self.url}/{entry}"

    def entry_of(self, path: str) -> str:
        return path.rstrip("/").rsplit("/", 1)[-1]

    def _key(self, entry: str, name: str | None = None) -> str:
        return f"{self.root}/{entry}" + (f"/{name}" if name else "")

    def _listing(self, key: str) -> list[dict[str, Any]]:
        """The objects and prefixes right under `key`, without folder markers (`key/`)."""
        self.fs.invalidate_cache(key)
        try:
            return [item for item in self.fs.ls(key, detail=True) if not item["name"].endswith("/")]
        except FileNotFoundError:
            return []

    def entries(self) -> list[str]:
        """Names of the prefixes that claim to be checkpoints (by name) and hold objects, sorted
        by name. Some stores (SeaweedFS) keep the folder of a prefix whose objects were all
        deleted for a while, listed as a prefix: that is nothing, not an interrupted save."""
        self.check_reachable()
        names = (item["name"].rstrip("/").rsplit("/", 1)[-1] for item in self._listing(self.root)
                 if item.get("type") == "directory")
        return sorted(name for name in names if name.startswith(CHECKPOINT_PREFIX) and self.is_entry(name))

    def is_entry(self, entry: str) -> bool:
        return bool(self._listing(self._key(entry)))

    def fingerprint(self, entry: str) -> tuple[Any, ...] | None:
        """Size and version tag (ETag, or modification time) of the entry's objects."""
        try:
            items = self._listing(self._key(entry))
        except OSError:
            return None
        return tuple(sorted(
            (item["name"].rsplit("/", 1)[-1], item.get("size"),
             str(item.get("ETag") or item.get("mtime") or item.get("updated") or item.get("created")))
            for item in items
        ))

    def size(self, entry: str, name: str) -> int | None:
        try:
            info = self.fs.info(self._key(entry, name))
        except FileNotFoundError:
            return None
        return int(info["size"]) if info.get("type") == "file" else None

    def read(self, entry: str, name: str) -> bytes:
        return self.fs.cat_file(self._key(entry, name))

    def checksum(self, entry: str, name: str, algorithm: str) -> str:
        """One file's checksum by `algorithm` (one of `CHECKSUMS`), as records hold it."""
        with self.fs.open(self._key(entry, name), "rb") as stream:
            return checksum_of_stream(stream, algorithm)

    @contextlib.contextmanager
    def local_files(self, entry: str) -> Iterator[Path]:
        """A temporary local directory holding a download of the entry's files."""
        with tempfile.TemporaryDirectory(prefix="kerasdist-ckpt-") as temp:
            for item in self._listing(self._key(entry)):
                if item.get("type") == "file":
                    name = item["name"].rsplit("/", 1)[-1]
                    (Path(temp) / name).write_bytes(self.fs.cat_file(item["name"]))
            yield Path(temp)

    # -- writing ---------------------------------------------------------------------------
    def commit(self, step: int, files: Mapping[str, Content]) -> str:
        """Upload `files` as a checkpoint of `step`, the record last; returns the entry's name.
        Older entries of the same step are deleted once the new record is in place."""
        entry, uploading = f"{CHECKPOINT_PREFIX}{step}", False
        try:
            same_step = [e for e in self.entries() if e == entry or e.startswith(entry + SAVED_AGAIN_MARK)]
            if same_step:  # a new name: the old one stays valid until the new record is in place
                entry = f"{entry}{SAVED_AGAIN_MARK}{time.time_ns():020d}"
            uploading = True
            for name in _record_last(files):  # bytes: botocore refuses other buffers
                self.fs.pipe_file(self._key(entry, name), bytes(files[name]))
        except BaseException as err:
            if uploading:  # only the entry this save began, never an older one
                with contextlib.suppress(Exception):
                    self.remove(entry)
            if isinstance(err, Exception):
                raise OSError(f"Saving checkpoint {self.path_of(entry)} failed: {_reason(err)}") from err
            raise
        for older in same_step:
            self.remove(older)
        return entry

    def remove(self, entry: str) -> None:
        """Delete an entry, its completion record first."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._key(entry, RECORD_FILE))
        key = self._key(entry)
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(key, recursive=True)
        self.fs.invalidate_cache(key)
        if self.fs.exists(key):  # the empty folder some stores keep (SeaweedFS): deleted on a second pass
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(key, recursive=True)

    def remove_temporary(self) -> list[str]:
        """Delete unfinished uploads (entries without a completion record) and stray probes."""
        removed = []
        for item in self._listing(self.root):
            name = item["name"].rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(TEMP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(item["name"], recursive=True)
                removed.append(self.path_of(name))
            elif name.startswith(CHECKPOINT_PREFIX) and self.size(name, RECORD_FILE) is None:
                self.remove(name)
                removed.append(self.path_of(name))
        return removed


def _reason(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text if text.endswith(".") else text + "."
