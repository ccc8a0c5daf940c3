"""The record counts of make_dataset's files, kept so that each file is read to count its records
once, not at every make_dataset call (a restart, a rebuilt run, another worker on the machine).

A count is known by the file's path, size, modification time (ns) and how it is read (format,
columns, features, check_finite): a file changed in between is counted again. Counts are kept in
this process and in a small JSON file in the user's cache folder, never beside the data:
`$KERASDIST_CACHE_DIR`, else `$XDG_CACHE_HOME/kerasdist`, else `~/.cache/kerasdist`
(`KERASDIST_CACHE_DIR=off` keeps them in the process only). The count itself is the file's records
as make_dataset's reader reads them (every record parsed once)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

CACHE_VARIABLE = "KERASDIST_CACHE_DIR"
_STORE_NAME = "record-counts.json"
_STORE_ENTRIES = 50_000  # the newest kept: a bound on the file's size (about 150 bytes each)
_known: dict[str, list] = {}  # key -> [size, mtime_ns, count], this process's


def record_counts(files: Sequence[str], reading: str, count: Callable[[str], int]) -> list[int]:
    """The records in each of `files`, `count(file)` called only for files whose count is not
    known for their present size and modification time, as read the way `reading` says (format,
    columns, features, check_finite): a count made by another reading is not taken, since this
    one's parse or finiteness check could fail where that one did not."""
    stats = {f: _stat(f) for f in files}
    keys = {f: _key(f, reading) for f in files}
    unknown = [f for f in files if not _fits(_known.get(keys[f]), stats[f])]
    if unknown:
        stored = _stored()
        _known.update({keys[f]: stored[keys[f]] for f in unknown if _fits(stored.get(keys[f]), stats[f])})
    counted = {keys[f]: [*stats[f], count(f)] for f in files if not _fits(_known.get(keys[f]), stats[f])}
    if counted:
        _known.update(counted)
        _store(counted)
    return [_known[keys[f]][2] for f in files]


def store_path() -> Path | None:
    """Where counts are kept between processes (None: `KERASDIST_CACHE_DIR=off`)."""
    folder = os.environ.get(CACHE_VARIABLE)
    if folder == "off":
        return None
    if not folder:
        folder = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kerasdist")
    return Path(folder) / _STORE_NAME


def _key(path: str, reading: str) -> str:
    return f"{hashlib.sha256(reading.encode()).hexdigest()[:16]}:{os.path.abspath(path)}"


def _stat(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def _fits(entry: object, stat: tuple[int, int]) -> bool:
    """Whether a kept entry ([size, mtime_ns, count]) is the count of the file as it is now."""
    return isinstance(entry, list) and len(entry) == 3 and tuple(entry[:2]) == stat


def _stored() -> dict[str, list]:
    path = store_path()
    try:
        entries = json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):  # none yet, unreadable or half-written by an older release: counted again
        return {}
    return entries if isinstance(entries, dict) else {}


def _store(counted: dict[str, list]) -> None:
    """Add `counted` to the store, replaced whole (atomic: processes writing at once lose at most
    each other's new counts, which are then counted again). A store that cannot be written keeps
    the counts in this process only."""
    path = store_path()
    if path is None:
        return
    entries = {k: v for k, v in _stored().items() if k not in counted}
    entries.update(counted)
    entries = dict(list(entries.items())[-_STORE_ENTRIES:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".record-counts.")
    except OSError:
        return
    try:
        with os.fdopen(descriptor, "w") as handle:
            json.dump(entries, handle)
        os.replace(temporary, path)
    except OSError:
        Path(temporary).unlink(missing_ok=True)
