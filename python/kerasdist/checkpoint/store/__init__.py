"""Where checkpoints live: a local directory, or a prefix in an object store (s3://, gs://, memory://).

Everything kerasdist does to checkpoint files goes through a `Store` made by `open_store`; the
record (`record.py`) and the manager (`manager.py`) never touch paths themselves, and never know
which kind of store they hold (`protocol.Store`). Two implementations, one guarantee (a crash at
any byte leaves every committed checkpoint intact, and a partial entry is never taken for one):
`local.LocalStore` commits by an atomic rename, `object.ObjectStore` by uploading the commit
marker last.

Configuration of object stores is the ecosystem's: the AWS / Google environment variables and
credentials files (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL_S3`, `GOOGLE_APPLICATION_CREDENTIALS`,
`STORAGE_EMULATOR_HOST`, ...), or a `storage_options` mapping passed on to the fsspec filesystem
(s3fs's `key`, `secret`, `client_kwargs={"endpoint_url": ...}`, gcsfs's `token`, `endpoint_url`, ...).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kerasdist.checkpoint.store.local import LocalStore
from kerasdist.checkpoint.store.object import OBJECT_SCHEMES, ObjectStore
from kerasdist.checkpoint.store.protocol import Store

__all__ = ["LocalStore", "ObjectStore", "Store", "open_store", "scheme_of"]

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")


def scheme_of(checkpoint_dir: Any) -> str | None:
    """The URL scheme of `checkpoint_dir` ("s3", "file", ...), or None for a plain path."""
    if not isinstance(checkpoint_dir, str):
        return None
    found = _URL.match(checkpoint_dir)
    return found.group(1).lower() if found else None


def open_store(checkpoint_dir: Any, storage_options: Mapping[str, Any] | None = None) -> Store:
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
    if scheme not in OBJECT_SCHEMES:
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
