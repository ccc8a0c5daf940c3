"""The completion record: what one checkpoint records besides its files, how it is written and
how a checkpoint is verified against it. The one definition of the record's schema.

A save is two steps: a `Snapshot` of the model (its files, not yet written: pieces of the
recorded values where `snapshot.py` can, #47), and `commit`, which writes those files and the
record through the store (`store/`): on a local disk under a
temporary name, fsynced, record last, then renamed into place; on an object store uploaded with
the record last, which is the commit. A crash at any byte therefore leaves the old checkpoint and,
at worst, an ignored partial entry; a checkpoint whose files do not match their record is refused
by `read_checkpoint`.

The record (`state.json`) holds the training progress the trainer gives (`Progress`: epoch,
step, history, metrics, writer, and the run's `RunRecord`), the global step and weight signature
of the snapshot, the time, and the size and CRC-32 of every other file (a SHA-256 in records of
format 1, still read). Everything here is about one checkpoint at a time; which checkpoints
exist, which is newest and which are kept is `CheckpointManager`'s business.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerasdist.checkpoint.checksums import CHECKSUMS, FileContent, PendingCrc, describe
from kerasdist.checkpoint.layout import CALLBACKS_FILE, INPUT_FILE, RECORD_FILE
from kerasdist.checkpoint.model_state import plain
from kerasdist.checkpoint.snapshot import Snapshot
from kerasdist.checkpoint.store import Store

FORMAT_VERSION = 2  # 2: files carry a CRC-32 (1: a SHA-256)


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
        epoch_order: how its epochs were ordered (`make_dataset` data): the order function's
            name or "in order", with ", split over N workers" where each worker read a share
            of its own (`per_worker`, FILE auto-shard); a resume ordered otherwise is told
            apart by it.
        steps_per_epoch: batches per epoch of the data that trained it, when the data could not
            tell without a pass over it (a dataset with a filter); a resume reuses it.
        saved_at: when it was saved (seconds since the epoch, UTC), as its record says.
        size: bytes of its files, as its record lists them (the record itself not counted).
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
    steps_per_epoch: int | None = None
    saved_at: float | None = None
    size: int | None = None

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.epoch, self.step_in_epoch, self.global_step)


@dataclass(frozen=True)
class RunRecord:
    """What every checkpoint of a run records about the run itself (`CheckpointInfo`'s fields of
    the same names), so that a resume can tell a changed run apart.

    Attributes:
        settings: the training settings (`speed.TrainingSettings.record()`), or empty.
        global_batch_size: samples per optimizer step, when known.
        epoch_order: how the epochs are ordered (`DatasetInfo.epoch_order`), when known.
        steps_per_epoch: batches per epoch, recorded when counting them takes a pass.
    """

    settings: dict[str, Any] = field(default_factory=dict)
    global_batch_size: int | None = None
    epoch_order: str | None = None
    steps_per_epoch: int | None = None


@dataclass(frozen=True)
class Progress:
    """Where training stands when a checkpoint is taken: what the trainer gives its record
    (`CheckpointInfo`'s fields of the same names, the run's facts in `run`). Make it with
    `Progress.of`, which copies the history and metrics as plain values (the trainer's own go on
    changing).

    Attributes:
        epoch: the epoch to run next; step_in_epoch: batches of it done (0 at an epoch end).
        history: per-epoch logs of the completed epochs; metrics: the logs at save time.
        writer: the task that writes it ("worker:0"), or None outside a cluster.
        run: what the run records about itself.
        callbacks: the other callbacks' state (`callback_state.CallbackStates.encode`), or None.
        input: the position of the data's reader (`data/resumable.py`), or None.
    """

    epoch: int
    step_in_epoch: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    writer: str | None = None
    run: RunRecord = field(default_factory=RunRecord)
    callbacks: bytes | None = None
    input: bytes | None = None

    @classmethod
    def of(cls, epoch: int, step_in_epoch: int = 0, history: Any = None, metrics: Any = None,
           writer: str | None = None, run: RunRecord | None = None, callbacks: bytes | None = None,
           input: bytes | None = None) -> Progress:
        """The progress to record, copied."""
        return cls(int(epoch), int(step_in_epoch), plain(history or []), plain(metrics or {}), writer,
                   run or RunRecord(), callbacks, input)


# --------------------------------------------------------------------------------------------
# Reading


def read_checkpoint(store: Store, entry: str) -> tuple[str | None, CheckpointInfo | None]:
    """(problem, info): why the checkpoint `entry` of `store` cannot be used, or its info. Reads
    the completion record, and checks the size, then the checksum, of every file it lists."""
    problem, info, record = read_candidate(store, entry)
    if problem is None:
        for name, (_, algorithm, expected) in _files_of(record).items():
            if store.checksum(entry, name, algorithm) != expected:
                return _corrupted(f"{store.path_of(entry)}/{name}"), None
    return problem, info


def read_candidate(store: Store, entry: str) -> tuple[str | None, CheckpointInfo | None, dict[str, Any]]:
    """(problem, info, record): `read_checkpoint` without the checksums, the record beside: a
    checkpoint that passes is valid if its files match their checksums (`verified_files` checks
    them on the copy a restore loads)."""
    if not store.is_entry(entry):
        return f"{entry} is not a checkpoint directory", None, {}
    where = store.path_of(entry)
    record_path = f"{where}/{RECORD_FILE}"
    if store.size(entry, RECORD_FILE) is None:
        return f"{record_path} is missing (the save never completed)", None, {}
    try:
        record = json.loads(store.read(entry, RECORD_FILE))
        info = _info_of(where, record)
        files = _files_of(record)  # checked here: a record with `files` of the wrong shape is refused, not raised
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
        return f"{record_path} is not a valid completion record", None, {}
    for name, (expected_size, _, _) in files.items():
        problem = _size_problem(f"{where}/{name}", store.size(entry, name), expected_size)
        if problem:
            return problem, None, {}
    return None, info, record


@contextlib.contextmanager
def verified_files(store: Store, entry: str, record: dict[str, Any]) -> Iterator[tuple[str | None, Path]]:
    """(problem, directory): a local directory holding the files `record` (from
    `read_candidate`) lists, each read once (on an object store: one download, checked as it
    arrives), and why they cannot be used (None: each matches its size and checksum, so what is
    loaded from there is what the record describes, whatever the store holds by then)."""
    files = _files_of(record)
    with store.summed_files(entry, {name: algorithm for name, (_, algorithm, _) in files.items()}) as (local, sums):
        problem = None
        for name, (expected_size, _, expected) in files.items():
            size, checksum = sums.get(name, (None, None))
            problem = _size_problem(f"{store.path_of(entry)}/{name}", size, expected_size)
            if problem is None and checksum != expected:
                problem = _corrupted(f"{store.path_of(entry)}/{name}")
            if problem:
                break
        yield problem, local


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
        steps_per_epoch=record.get("steps_per_epoch"),
        saved_at=None if record.get("saved_at") is None else float(record["saved_at"]),
        size=sum(int(item["size"]) for item in record["files"].values()),
    )


def _checksum_of(item: dict[str, Any]) -> tuple[str, str]:
    """(algorithm, checksum) of a record's file entry: its CRC-32, or an older record's SHA-256."""
    for algorithm in CHECKSUMS:
        if algorithm in item:
            return algorithm, str(item[algorithm])
    raise KeyError("a file entry without a checksum")


def _files_of(record: dict[str, Any]) -> dict[str, tuple[int, str, str]]:
    """name -> (size, algorithm, checksum) of the files a record lists."""
    return {str(name): (int(item["size"]), *_checksum_of(item)) for name, item in record["files"].items()}


def _corrupted(path: str) -> str:
    return f"{path} does not match its recorded checksum (corrupted)"


def _size_problem(path: str, size: int | None, expected_size: int) -> str | None:
    """Why a file of `size` bytes (None: missing) is not the one its record lists, or None."""
    if size is None:
        return f"{path} is missing"
    if size != expected_size:
        return f"{path} has {size} bytes, the record says {expected_size} (truncated or replaced)"
    return None


# --------------------------------------------------------------------------------------------
# Writing


def commit(store: Store, taken: Snapshot, progress: Progress) -> CheckpointInfo:
    """Write a snapshot and its completion record as one checkpoint, the record last, and return
    it. The run's settings and epoch order go into the record only when known, so records of
    runs without them are as before."""
    facts = progress.run
    run = {"settings": dict(facts.settings)} if facts.settings else {}
    if facts.epoch_order:
        run["epoch_order"] = facts.epoch_order
    if facts.steps_per_epoch:
        run["steps_per_epoch"] = facts.steps_per_epoch
    files = taken.files_to_write()
    if progress.callbacks is not None:
        files = {**files, CALLBACKS_FILE: progress.callbacks}
    if progress.input is not None:
        files = {**files, INPUT_FILE: progress.input}
    record = {
        "format": FORMAT_VERSION,
        "epoch": progress.epoch,
        "step_in_epoch": progress.step_in_epoch,
        "global_step": taken.global_step,
        "saved_at": time.time(),
        "writer": progress.writer,
        "global_batch_size": facts.global_batch_size,
        "signature": taken.signature,
        "history": progress.history,
        "metrics": progress.metrics,
        **run,
    }

    def record_bytes() -> bytes:  # once the files are written: a PendingCrc's checksum is known then
        record["files"] = {name: _described(content) for name, content in files.items()}
        return json.dumps(record, indent=1).encode()

    entry = store.commit(taken.global_step, files, record_bytes)
    return _info_of(store.path_of(entry), record)


def _described(content: FileContent) -> dict[str, Any]:
    if isinstance(content, PendingCrc):
        return describe(content.data, content.finish())
    return describe(content)
