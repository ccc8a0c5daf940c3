"""Checkpoints under a URL prefix of an object store, through fsspec (s3fs for `s3://`, gcsfs for
`gs://`, fsspec's own in-process `memory://` for tests): the commit marker is the commit.

Object stores have no atomic rename, so a checkpoint is uploaded under its final name and counts
only once its commit marker (the completion record, which holds the size and checksum of every
other file) is uploaded last (the commit-marker design Orbax uses on GCS). An entry without its
marker is an unfinished upload: never listed as a checkpoint, deleted by the chief at the start
of training (`remove_temporary`). A second save of a step that is already there goes to a new
name (`ckpt-<step>.s<time>`), and the old one is deleted only once the new marker is in place, so
the only valid checkpoint is never destroyed first. Deleting a checkpoint deletes its marker
first, so a half-deleted checkpoint is never taken for a valid one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kerasdist.checkpoint.checksums import FileContent, checksum_of_stream, finished
from kerasdist.checkpoint.layout import (
    CHECKPOINT_PREFIX,
    COMMIT_MARKER,
    RUNS_FOLDER,
    SAVED_AGAIN_MARK,
    TEMP_PREFIX,
    entry_name,
)
from kerasdist.checkpoint.store.protocol import Summed

# scheme -> (the fsspec plugin that serves it, what to install: from Python, and from R)
# (R's kerasdist_py_require() adds it to reticulate's environment, or says what to do elsewhere)
_S3_INSTALL = ("pip install 'kerasdist[s3]' (or s3fs); from R: "
               'kerasdist::kerasdist_py_require(storage = "s3")')
_GCS_INSTALL = ("pip install 'kerasdist[gcs]' (or gcsfs); from R: "
                'kerasdist::kerasdist_py_require(storage = "gcs")')
OBJECT_SCHEMES = {
    "s3": ("s3fs", _S3_INSTALL),
    "s3a": ("s3fs", _S3_INSTALL),
    "gs": ("gcsfs", _GCS_INSTALL),
    "gcs": ("gcsfs", _GCS_INSTALL),
    "memory": ("fsspec", "pip install fsspec"),
}
_BUCKET_SCHEMES = ("s3", "s3a", "gs", "gcs")
# gcsfs's default filesystem asks each bucket's type over gRPC before a call; where that probe
# cannot get through (an emulator, a proxy that passes only HTTPS) every call waits for it to time
# out. So gs:// URLs get gcsfs's JSON-API filesystem unless this variable, gcsfs's switch for that
# probe, is set (zonal buckets need it true). Figures: RELIABILITY.md, "Object storage".
GCS_BUCKET_TYPE_PROBE = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
# How long the check that a bucket answers waits: on a dead endpoint the clients' own retries run
# for seconds (s3fs) to over a minute (gcsfs, no setting), and a start should not hang on that.
REACHABLE_WITHIN_SECONDS = 10.0
# Bytes per ranged GET of a download (fsspec's buffered file fetches a block per request and
# holds it in memory until it is read). On SeaweedFS 16 MB blocks were the quickest of 8 / 16 /
# 50 (s3fs's default) / 128 MB, no slower than one whole GET: bench/history/, "One download".
_DOWNLOAD_BLOCK = 16 << 20


class ObjectStore:
    """Checkpoints under a URL prefix of an object store: commit by completion record (see the
    module docstring).

    Args:
        url: the checkpoint_dir URL, e.g. "s3://bucket/run".
        scheme: its scheme, one of `OBJECT_SCHEMES`.
        storage_options: options for the fsspec filesystem (credentials, endpoint, ...).
    """

    def __init__(self, url: str, scheme: str, storage_options: Mapping[str, Any]):
        if not url.split("://", 1)[1].strip("/"):
            raise ValueError(f"checkpoint_dir {url!r} names no bucket or folder: write e.g. {scheme}://bucket/run.")
        plugin, install = OBJECT_SCHEMES[scheme]
        try:
            filesystem = _filesystem_class(scheme)
        except ImportError:
            raise ImportError(
                f"checkpoint_dir {url!r} needs the {plugin} package, which is not installed: {install}."
            ) from None
        try:
            self.fs = filesystem(**storage_options)
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

    @property
    def is_local(self) -> bool:
        return False

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
            raise ValueError(f"checkpoint_dir {self.url!r} is not writable: {reason(err)}") from None
        self._checked = True

    def check_reachable(self) -> None:
        """A ValueError naming checkpoint_dir when the endpoint does not answer or the bucket
        does not exist."""
        if self._reachable or self.scheme not in _BUCKET_SCHEMES:
            return
        from fsspec.exceptions import FSTimeoutError

        bucket = self.root.lstrip("/").split("/", 1)[0]
        try:
            self._bucket_info(bucket)
        except FSTimeoutError:
            raise ValueError(
                f"checkpoint_dir {self.url!r} cannot be reached: no answer within {REACHABLE_WITHIN_SECONDS:g} s."
            ) from None
        except FileNotFoundError:
            raise ValueError(
                f"checkpoint_dir {self.url!r}: the bucket {bucket!r} does not exist; kerasdist does not "
                "create buckets."
            ) from None
        except PermissionError as err:
            raise ValueError(
                f"checkpoint_dir {self.url!r}: access denied ({reason(err)}) Check the credentials "
                "(storage_options, or the environment and credentials files)."
            ) from None
        except Exception as err:  # noqa: BLE001 (whatever the plugin raises: named here)
            raise ValueError(f"checkpoint_dir {self.url!r} cannot be reached: {reason(err)}") from None
        self._reachable = True

    def _bucket_info(self, bucket: str) -> dict[str, Any]:
        """`fs.info(bucket)`, given up after `REACHABLE_WITHIN_SECONDS` (FSTimeoutError) where the
        filesystem is asynchronous, as s3fs and gcsfs are."""
        if not getattr(self.fs, "async_impl", False):
            return self.fs.info(bucket)
        from fsspec.asyn import sync

        return sync(self.fs.loop, self.fs._info, bucket, timeout=REACHABLE_WITHIN_SECONDS)

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
    def summed_files(self, entry: str, algorithms: Mapping[str, str]) -> Iterator[Summed]:
        """A temporary local directory holding one download of each file `algorithms` names,
        summed as it arrives (streamed to disk, never whole in memory), and each one's size and
        checksum; a missing file is left out."""
        with tempfile.TemporaryDirectory(prefix="kerasdist-ckpt-") as temp:
            sums = {}
            for name, algorithm in algorithms.items():
                with contextlib.suppress(FileNotFoundError):
                    sums[name] = self._download_summed(self._key(entry, name), Path(temp) / name, algorithm)
            yield Path(temp), sums

    def _download_summed(self, key: str, path: Path, algorithm: str) -> tuple[int, str]:
        self.fs.invalidate_cache(key)  # the size the object has now, not the listing's
        with self.fs.open(key, "rb", block_size=_DOWNLOAD_BLOCK) as stream, open(path, "wb") as copy:
            checksum = checksum_of_stream(stream, algorithm, copy_to=copy)
            return copy.tell(), checksum

    # -- writing ---------------------------------------------------------------------------
    def commit(self, step: int, files: Mapping[str, FileContent], marker: Callable[[], bytes]) -> str:
        """Upload `files` as a checkpoint of `step`, the commit marker last; returns the entry's
        name. Older entries of the same step are deleted once the new marker is in place."""
        entry, uploading = entry_name(step), False
        try:
            same_step = [e for e in self.entries() if e == entry or e.startswith(entry + SAVED_AGAIN_MARK)]
            if same_step:  # a new name: the old one stays valid until the new record is in place
                entry = f"{entry}{SAVED_AGAIN_MARK}{time.time_ns():020d}"
            uploading = True
            for name, content in files.items():  # bytes: botocore refuses other buffers
                self.fs.pipe_file(self._key(entry, name), bytes(finished(content)))
            self.fs.pipe_file(self._key(entry, COMMIT_MARKER), marker())
        except BaseException as err:
            if uploading:  # only the entry this save began, never an older one
                with contextlib.suppress(Exception):
                    self.remove(entry)
            if isinstance(err, Exception):
                raise OSError(f"Saving checkpoint {self.path_of(entry)} failed: {reason(err)}") from err
            raise
        for older in same_step:
            self.remove(older)
        return entry

    def remove(self, entry: str) -> None:
        """Delete an entry, its commit marker first."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._key(entry, COMMIT_MARKER))
        key = self._key(entry)
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(key, recursive=True)
        self.fs.invalidate_cache(key)
        if self.fs.exists(key):  # the empty folder some stores keep (SeaweedFS): deleted on a second pass
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(key, recursive=True)

    def remove_temporary(self) -> list[str]:
        """Delete unfinished uploads (entries without a commit marker) and stray probes."""
        removed = []
        for item in self._listing(self.root):
            name = item["name"].rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(TEMP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(item["name"], recursive=True)
                removed.append(self.path_of(name))
            elif name.startswith(CHECKPOINT_PREFIX) and self.size(name, COMMIT_MARKER) is None:
                self.remove(name)
                removed.append(self.path_of(name))
        return removed

    # -- the run log -----------------------------------------------------------------------
    def write_run_file(self, name: str, data: bytes) -> None:
        """Upload `runs/<name>` (an upload replaces an object whole)."""
        self.fs.pipe_file(f"{self.root}/{RUNS_FOLDER}/{name}", data)

    def run_files(self) -> dict[str, bytes]:
        files = {}
        for item in self._listing(f"{self.root}/{RUNS_FOLDER}"):
            if item.get("type") == "file":
                files[item["name"].rsplit("/", 1)[-1]] = self.fs.cat_file(item["name"])
        return dict(sorted(files.items()))


def _filesystem_class(scheme: str) -> type:
    """The fsspec filesystem class for `scheme`; ImportError where its plugin is missing."""
    if scheme in ("gs", "gcs") and GCS_BUCKET_TYPE_PROBE not in os.environ:
        import gcsfs  # the package itself: one removed from sys.modules is missing, as it should be

        return gcsfs.core.GCSFileSystem
    import fsspec

    return fsspec.get_filesystem_class(scheme)


def reason(err: BaseException) -> str:
    """What went wrong, as a sentence (an error's text, or its type when it has none)."""
    text = str(err).strip() or type(err).__name__
    return text if text.endswith(".") else text + "."
