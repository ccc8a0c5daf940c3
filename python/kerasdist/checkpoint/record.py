"""The checkpoint format: what one checkpoint holds, how it is made, checked and committed.

A checkpoint is an entry `ckpt-<global step>/` of the checkpoint directory holding `model.keras`
(weights, optimizer state, config), `rng.npz` (the Keras seed-generator states that `load_model`
does not restore) and `state.json`, the completion record: epoch, step, metrics, history, and the
size and CRC-32 of every other file (a SHA-256 in records of format 1, still read). A save is two
steps: `snapshot` makes the files in memory (`dict[name, bytes]`) from the model, and `commit`
writes them with their record through the store (`storage.py`): on a local disk under a temporary
name, fsynced, record last, then renamed into place; on an object store uploaded with the record
last, which is the commit. A crash at any byte therefore leaves the old checkpoint and, at worst,
an ignored partial entry; a checkpoint whose files do not match their record is refused by
`read_checkpoint`.

Everything here is about one checkpoint at a time; which checkpoints exist, which is newest and
which are kept is `CheckpointManager`'s business.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kerasdist.checkpoint.checksums import CHECKSUMS, Content, describe
from kerasdist.checkpoint.model_state import optimizer_step, plain, seed_states, signature
from kerasdist.checkpoint.storage import (
    CHECKPOINT_PREFIX,
    MODEL_FILE,
    RECORD_FILE,
    REPLACED_MARK,
    RNG_FILE,
    SAVED_AGAIN_MARK,
    TEMP_PREFIX,
    LocalStore,
    ObjectStore,
    open_store,
)
from kerasdist.compat import keras_model_bytes

__all__ = [
    "CHECKPOINT_PREFIX", "MODEL_FILE", "RECORD_FILE", "REPLACED_MARK", "RNG_FILE", "SAVED_AGAIN_MARK",
    "TEMP_PREFIX", "CheckpointInfo", "CheckpointWarning", "Snapshot", "commit", "read_checkpoint",
    "read_record", "snapshot", "write_checkpoint",
]

FORMAT_VERSION = 2  # 2: files carry a CRC-32 (1: a SHA-256)
Store = LocalStore | ObjectStore


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (damaged, partial) or could not be used."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint and the point training resumes from.

    Attributes:
        path: the checkpoint: a directory, or a URL on an object store.
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


def read_checkpoint(store: Store, entry: str) -> tuple[str | None, CheckpointInfo | None]:
    """(problem, info): why the checkpoint `entry` of `store` cannot be used, or its info. Reads
    the completion record and checksums every file it lists."""
    if not store.is_entry(entry):
        return f"{entry} is not a checkpoint directory", None
    where = store.path_of(entry)
    record_path = f"{where}/{RECORD_FILE}"
    if store.size(entry, RECORD_FILE) is None:
        return f"{record_path} is missing (the save never completed)", None
    try:
        record = json.loads(store.read(entry, RECORD_FILE))
        info = _info_of(where, record)
        # checked here, so that a record with `files` of the wrong shape is refused, not raised
        files = {str(name): (int(item["size"]), *_checksum_of(item)) for name, item in record["files"].items()}
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
        return f"{record_path} is not a valid completion record", None
    for name, (size, algorithm, checksum) in files.items():
        problem = _file_problem(store, entry, name, size, algorithm, checksum)
        if problem:
            return problem, None
    return None, info


def read_record(store: Store, entry: str) -> dict[str, Any]:
    """The completion record of a checkpoint already known to be valid."""
    return json.loads(store.read(entry, RECORD_FILE))


def _info_of(path: str, record: dict[str, Any]) -> CheckpointInfo:
    return CheckpointInfo(
        path=path,
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


def _checksum_of(item: dict[str, Any]) -> tuple[str, str]:
    """(algorithm, checksum) of a record's file entry: its CRC-32, or an older record's SHA-256."""
    for algorithm in CHECKSUMS:
        if algorithm in item:
            return algorithm, str(item[algorithm])
    raise KeyError("a file entry without a checksum")


def _file_problem(store: Store, entry: str, name: str, expected_size: int, algorithm: str,
                  expected: str) -> str | None:
    path = f"{store.path_of(entry)}/{name}"
    size = store.size(entry, name)
    if size is None:
        return f"{path} is missing"
    if size != expected_size:
        return f"{path} has {size} bytes, the record says {expected_size} (truncated or replaced)"
    if store.checksum(entry, name, algorithm) != expected:
        return f"{path} does not match its recorded checksum (corrupted)"
    return None


# --------------------------------------------------------------------------------------------
# Writing


@dataclass(frozen=True)
class Snapshot:
    """A checkpoint's files, made in memory from the model, not yet written anywhere.

    Attributes:
        files: file name -> contents (`model.keras`, `rng.npz`).
        global_step: the model's training steps when it was taken.
        signature: shape and dtype of every weight (checked before a restore).
        crc32s: the CRC-32 of those files already known (computed while they were made).
    """

    files: Mapping[str, Content]
    global_step: int
    signature: list[list[Any]]
    crc32s: Mapping[str, int] = field(default_factory=dict)


def snapshot(model: Any) -> Snapshot:
    """The model's checkpoint files in memory: what `commit` writes (and what a background
    save copies in the training thread before writing elsewhere)."""
    rng_file = io.BytesIO()
    np.savez(rng_file, *seed_states(model))
    return Snapshot(
        files={MODEL_FILE: keras_model_bytes(model), RNG_FILE: rng_file.getvalue()},
        global_step=optimizer_step(model),
        signature=signature(model),
    )


def commit(
    store: Store,
    taken: Snapshot,
    *,
    epoch: int,
    step_in_epoch: int = 0,
    history: list[dict[str, float]] | None = None,
    metrics: dict[str, float] | None = None,
    writer: str | None = None,
    settings: dict[str, Any] | None = None,
    global_batch_size: int | None = None,
    epoch_order: str | None = None,
) -> CheckpointInfo:
    """Write a snapshot and its completion record as one checkpoint, the record last, and return
    it. `settings` (the run's training settings) and `epoch_order` go into the record only when
    given, so records of runs without them are as before."""
    record = {
        "format": FORMAT_VERSION,
        "epoch": int(epoch),
        "step_in_epoch": int(step_in_epoch),
        "global_step": taken.global_step,
        "saved_at": time.time(),
        "writer": writer,
        "global_batch_size": global_batch_size,
        "signature": taken.signature,
        "history": plain(history or []),
        "metrics": plain(metrics or {}),
        **({"settings": dict(settings)} if settings else {}),
        **({"epoch_order": epoch_order} if epoch_order else {}),
        "files": {name: describe(data, taken.crc32s.get(name)) for name, data in taken.files.items()},
    }
    files = {**taken.files, RECORD_FILE: json.dumps(record, indent=1).encode()}
    entry = store.commit(taken.global_step, files)
    return _info_of(store.path_of(entry), record)


def write_checkpoint(model: Any, directory: str | os.PathLike[str] | Store, **record: Any) -> CheckpointInfo:
    """Write one checkpoint of `model` into `directory` (a path, URL or store) and return it:
    `snapshot` then `commit`, synchronously."""
    return commit(open_store(directory), snapshot(model), **record)
