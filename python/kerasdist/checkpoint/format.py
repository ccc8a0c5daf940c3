"""The on-disk checkpoint format and its atomic commit.

A checkpoint is a directory `ckpt-<global step>/` holding `model.keras` (weights, optimizer state,
config), `rng.npz` (the Keras seed-generator states that `load_model` does not restore) and
`state.json`, the completion record: epoch, step, metrics, history, and the size and SHA-256 of
every other file. It is written under a temporary name in the same directory, every file is
fsynced, the record is written last, and only then is the directory renamed into place. A crash at
any byte therefore leaves the old checkpoint and, at worst, an ignored temporary directory; a
checkpoint whose files do not match their record is refused by `read_checkpoint`.

Everything here is about one checkpoint directory at a time; which checkpoints exist, which is
newest and which are kept is `CheckpointManager`'s business.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kerasdist.checkpoint.model_state import optimizer_step, plain, seed_states, signature

FORMAT_VERSION = 1
RECORD_FILE = "state.json"
MODEL_FILE = "model.keras"
RNG_FILE = "rng.npz"
CHECKPOINT_PREFIX = "ckpt-"
TEMP_PREFIX = ".tmp-ckpt-"
# A checkpoint displaced by a new save of the same step keeps a `ckpt-` name (so it is still
# found) until the new one is in place: see `_commit`.
REPLACED_MARK = ".replaced-"


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (damaged, partial) or could not be used."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint and the point training resumes from.

    Attributes:
        path: the checkpoint directory.
        epoch: the epoch to run next (0-based); equals the number of completed epochs when
            `step_in_epoch` is 0.
        step_in_epoch: batches of `epoch` already trained (0 at an epoch boundary).
        global_step: training steps (batches) taken in total; under gradient accumulation more
            than `optimizer.iterations`, which counts applied updates.
        history: per-epoch logs of all completed epochs, earlier runs included.
        metrics: the logs at save time (epoch metrics for epoch-end checkpoints).
        writer: the task that wrote it ("worker:0", "chief:0"), or None outside a cluster.
        settings: the training settings the run used (`speed.TrainingSettings`: mixed
            precision, XLA, gradient accumulation); empty for checkpoints written before they
            were recorded.
        global_batch_size: samples per optimizer step of the run that wrote it, when known
            (data from `make_dataset`); a resume under another global batch is told apart by it.
        epoch_order: the name of the function that ordered its epochs (shuffled `make_dataset`
            data), when known; a resume whose kerasdist orders them otherwise is told apart by it.
    """

    path: str
    epoch: int
    step_in_epoch: int
    global_step: int
    history: list[dict[str, float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    writer: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    global_batch_size: int | None = None
    epoch_order: str | None = None

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.epoch, self.step_in_epoch, self.global_step)


# --------------------------------------------------------------------------------------------
# Reading


def checkpoint_candidates(directory: Path) -> list[Path]:
    """The entries of `directory` that claim to be checkpoints (by name), sorted by name."""
    return sorted(directory.glob(f"{CHECKPOINT_PREFIX}*")) if directory.is_dir() else []


def fingerprint(path: Path) -> tuple[Any, ...] | None:
    """Size and modification time of the checkpoint's files: a checkpoint whose fingerprint is
    unchanged since it was verified need not be checksummed again. None if unreadable."""
    try:
        return tuple(
            (entry.name, entry.stat().st_size, entry.stat().st_mtime_ns)
            for entry in sorted(path.iterdir())
        )
    except OSError:
        return None


def read_checkpoint(path: Path) -> tuple[str | None, CheckpointInfo | None]:
    """(problem, info): why the checkpoint at `path` cannot be used, or its info. Reads the
    completion record and checksums every file it lists."""
    if not path.is_dir():
        return f"{path.name} is not a checkpoint directory", None
    record_path = path / RECORD_FILE
    if not record_path.is_file():
        return f"{record_path} is missing (the save never completed)", None
    try:
        record = json.loads(record_path.read_text())
        info = _info_of(path, record)
        # checked here, so that a record with `files` of the wrong shape is refused, not raised
        files = {str(name): (int(entry["size"]), str(entry["sha256"])) for name, entry in record["files"].items()}
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
        return f"{record_path} is not a valid completion record", None
    for name, (size, sha256) in files.items():
        problem = _file_problem(path / name, size, sha256)
        if problem:
            return problem, None
    return None, info


def read_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The completion record of a checkpoint already known to be valid."""
    return json.loads((Path(path) / RECORD_FILE).read_text())


def _info_of(path: Path, record: dict[str, Any]) -> CheckpointInfo:
    return CheckpointInfo(
        path=str(path),
        epoch=int(record["epoch"]),
        step_in_epoch=int(record["step_in_epoch"]),
        global_step=int(record["global_step"]),
        history=list(record.get("history", [])),
        metrics=dict(record.get("metrics", {})),
        writer=record.get("writer"),
        settings=dict(record.get("settings") or {}),
        global_batch_size=None if record.get("global_batch_size") is None else int(record["global_batch_size"]),
        epoch_order=record.get("epoch_order"),
    )


def _file_problem(path: Path, expected_size: int, expected_sha256: str) -> str | None:
    if not path.is_file():
        return f"{path} is missing"
    size = path.stat().st_size
    if size != expected_size:
        return f"{path} has {size} bytes, the record says {expected_size} (truncated or replaced)"
    if _sha256(path) != expected_sha256:
        return f"{path} does not match its recorded checksum (corrupted)"
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# Writing


def write_checkpoint(model: Any, directory: Path, **fields: Any) -> CheckpointInfo:
    """Write one checkpoint of `model` into `directory` atomically and return it (the record's
    fields as `checkpoint_record` takes them)."""
    record = checkpoint_record(model, **fields)

    def write_files(temp: Path) -> None:
        model.save(temp / MODEL_FILE)
        np.savez(temp / RNG_FILE, *seed_states(model))

    return _write(directory, record, write_files)


def write_checkpoint_files(directory: Path, record: dict[str, Any], files: dict[str, bytes]) -> CheckpointInfo:
    """Write a checkpoint made elsewhere (`checkpoint_record`, and `snapshot.Snapshot.files()`)
    into `directory` atomically and return it: the same commit as `write_checkpoint`'s."""
    if set(files) != {MODEL_FILE, RNG_FILE}:
        raise ValueError(f"A checkpoint's files are {MODEL_FILE} and {RNG_FILE}, got {sorted(files)}.")

    def write_files(temp: Path) -> None:
        for name, content in files.items():
            (temp / name).write_bytes(content)

    return _write(directory, record, write_files)


def checkpoint_record(
    model: Any,
    *,
    epoch: int,
    step_in_epoch: int = 0,
    history: list[dict[str, float]] | None = None,
    metrics: dict[str, float] | None = None,
    writer: str | None = None,
    settings: dict[str, Any] | None = None,
    global_batch_size: int | None = None,
    epoch_order: str | None = None,
) -> dict[str, Any]:
    """The completion record of a checkpoint of `model` now, without its `files`. `settings` (the
    run's training settings) and `epoch_order` go into it only when given, so records of runs
    without them are as before."""
    return {
        "format": FORMAT_VERSION,
        "epoch": int(epoch),
        "step_in_epoch": int(step_in_epoch),
        "global_step": optimizer_step(model),
        "saved_at": time.time(),
        "writer": writer,
        "global_batch_size": global_batch_size,
        "signature": signature(model),
        "history": plain(history or []),
        "metrics": plain(metrics or {}),
        **({"settings": dict(settings)} if settings else {}),
        **({"epoch_order": epoch_order} if epoch_order else {}),
    }


def _write(directory: Path, record: dict[str, Any], write_files: Callable[[Path], None]) -> CheckpointInfo:
    """Write the files (`write_files(temp)`) into a temporary directory, fsync and describe them in
    the record, write the record last, then commit."""
    global_step = record["global_step"]
    temp = directory / f"{TEMP_PREFIX}{global_step}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    temp.mkdir(parents=True)
    try:
        write_files(temp)
        record = {**record, "files": {name: _fsync_and_describe(temp / name) for name in (MODEL_FILE, RNG_FILE)}}
        _write_durably(temp / RECORD_FILE, json.dumps(record, indent=1))
        _fsync_directory(temp)
        final = directory / f"{CHECKPOINT_PREFIX}{global_step}"
        _commit(temp, final)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return _info_of(final, record)


def _commit(temp: Path, final: Path) -> None:
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


def _fsync_and_describe(path: Path) -> dict[str, Any]:
    with open(path, "rb+") as stream:
        os.fsync(stream.fileno())
    return {"size": path.stat().st_size, "sha256": _sha256(path)}


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w") as stream:
        stream.write(text)
        stream.flush()
        os.fsync(stream.fileno())


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temporary(directory: Path) -> list[str]:
    """Delete temporary directories left by interrupted saves; returns what was removed."""
    removed = []
    for temp in directory.glob(f"{TEMP_PREFIX}*"):
        shutil.rmtree(temp, ignore_errors=True)
        removed.append(str(temp))
    return removed


def probe_writable(directory: Path) -> None:
    """Create `directory` if needed and write (then delete) a file in it; OSError if it cannot."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f"{TEMP_PREFIX}probe-{uuid.uuid4().hex[:8]}"
    probe.write_bytes(b"")
    probe.unlink()
