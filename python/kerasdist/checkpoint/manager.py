"""`CheckpointManager`: one object per checkpoint store, and the functions built on it.

The manager is what the callback, `make_or_restore_model`, `resume_fit`, `ps_fit` and
`distributed_fit` talk to. It checks the directory once, checksums each checkpoint once (again
only if its files change on disk), restores a model and gives the resume point from that same
read, saves atomically (a `snapshot.Snapshot` + `record.commit`) and prunes. Every file it reads or
writes goes through its store (`store/`): a local directory or an object-store URL.

A trainer makes one manager per call and hands it down (to the restore, the callback, the resume
point); there is no registry of managers. What several managers of one store share, while one
of them lives, is the verification of its checkpoints (`_verifications_of`: each entry's result,
valid while its files keep their sizes and modification times), so `latest_checkpoint(dir)` during
a run, or after it while its model lives, verifies nothing twice. Every listing reads the store's
entries afresh (another process may have written or damaged one since). What a restore put into a
model (`Restored`) is kept beside the model, weakly, for the trainer that continues it
(`restored_of`), never as an attribute of the user's model.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import keras

from kerasdist import compat
from kerasdist.checkpoint.chief_state import (
    check_chief_checkpoint_is_seen,
    chief_resume_point,
    restore_from_chief,
)
from kerasdist.checkpoint.layout import (
    CALLBACKS_FILE,
    INPUT_FILE,
    MODEL_FILE,
    REPLACED_MARK,
    RNG_FILE,
)
from kerasdist.checkpoint.model_state import check_signature, optimizer_step, restore_seed_states
from kerasdist.checkpoint.record import (
    CheckpointInfo,
    CheckpointWarning,
    Progress,
    RunRecord,
    commit,
    read_candidate,
    read_checkpoint,
    read_record,
    verified_files,
)
from kerasdist.checkpoint.restored import Restored, manager_of, note_restored, restored_of
from kerasdist.checkpoint.snapshot import SaveMemory, Snapshot, snapshot_now
from kerasdist.checkpoint.store import open_store


class Verified(NamedTuple):
    """What reading one checkpoint entry found, valid while its files keep `fingerprint`."""

    fingerprint: Any
    info: CheckpointInfo | None  # None: damaged or partial
    problem: str | None  # why it cannot be used, else None


class CheckpointManager:
    """The checkpoints of one directory: which exist and are valid, the newest, saving, pruning.

    The directory is checked when the manager is made (a path, not a file) and, once, created
    and probed for writing before the first restore or save. Listing reads each checkpoint's
    completion record; its files are checksummed the first time a manager of this store sees it
    and again only if their size or modification time changes, so a run verifies every
    checkpoint once however many times it asks. Damaged checkpoints are skipped with one
    `CheckpointWarning`.

    Args:
        directory: the checkpoint directory: a path, or a URL (`s3://bucket/run`, `gs://...`,
            `memory://...`, `file://...`; see `store/`).
        create: create and probe the directory now (default); False defers that to the first
            restore or save, so arguments can be checked before anything is touched.
        storage_options: options for the object store's fsspec filesystem (credentials,
            endpoint), e.g. `{"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}`
            for s3://; None: the ecosystem's configuration (environment variables, credentials
            files).
    """

    def __init__(self, directory: str | os.PathLike[str], *, create: bool = True,
                 storage_options: Mapping[str, Any] | None = None):
        self.store = directory.store if isinstance(directory, CheckpointManager) \
            else open_store(directory, storage_options)
        self._writable = False
        # entry -> what reading it found, by its fingerprint: shared by the managers of this store
        self._shared = _verifications_of(self.store)
        self._verified = self._shared.entries
        self._warned: dict[str, Any] = {}  # entry -> the fingerprint this manager warned of it at
        # each read of the files to restore (finished at, seconds, what): the run log's restores
        self.restores: list[tuple[float, float, CheckpointInfo | None]] = []
        if create:
            self.create()

    def __repr__(self) -> str:
        return f"CheckpointManager({str(self.directory)!r})"

    @property
    def directory(self) -> Path | str:
        """The checkpoint directory: a Path for a local one, the URL for an object store."""
        return self.store.directory

    def create(self) -> Path | str:
        """Create the directory and check it is writable (for an object store: reachable, the
        bucket there); done once per manager. A ValueError naming checkpoint_dir if not."""
        if not self._writable:
            self.store.prepare()
            self._writable = True
        return self.directory

    # -- reading -------------------------------------------------------------------------------
    def checkpoints(self, *, warn_known: bool = False) -> list[CheckpointInfo]:
        """The valid checkpoints, oldest first by the step recorded in each. A damaged one is
        warned of when first seen (`warn_known`: at every listing, as the public functions do)."""
        listed = {entry: self._verify(entry, warn_known) for entry in self.store.entries()}
        for gone in set(self._verified) - set(listed):  # deleted or pruned since
            self._verified.pop(gone, None)
        return sorted((v.info for v in listed.values() if v.info is not None), key=_newness)

    def _verify(self, entry: str, warn_known: bool = False) -> Verified:
        """What reading `entry` finds, read again only when its files changed; warned as `checkpoints`."""
        now = self.store.fingerprint(entry)
        known = self._verified.get(entry)
        if known is None or known.fingerprint != now:
            problem, info = read_checkpoint(self.store, entry)
            known = self._verified[entry] = Verified(now, info, None if info is not None else str(problem))
        self._warn(entry, now, known.problem, again=warn_known)
        return known

    def _warn(self, entry: str, fingerprint: Any, problem: str | None, again: bool = False) -> None:
        """Warn of a damaged `entry` the first time this manager meets it as it is now (its
        verification may be another manager's), or `again`."""
        if again or self._warned.get(entry) != fingerprint:
            _warn_damaged(self.store, entry, problem)
        self._warned[entry] = fingerprint

    def damaged(self) -> dict[str, str]:
        """The checkpoints the last listing (`checkpoints()`) skipped: path -> why."""
        return {self.store.path_of(entry): v.problem for entry, v in self._verified.items() if v.problem is not None}

    def latest(self, *, warn_known: bool = False) -> CheckpointInfo | None:
        """The newest valid checkpoint (by recorded epoch and step, never by name or time)."""
        checkpoints = self.checkpoints(warn_known=warn_known)
        return checkpoints[-1] if checkpoints else None

    def refused_restore(self, acceptable: Callable[[CheckpointInfo], bool]) -> CheckpointInfo | None:
        """The checkpoint a restore would load now if `acceptable` refuses it, else None. Reads
        only records while every candidate left is acceptable (then which one is valid does not
        matter: an object store's newest is downloaded once, by the restore); else verifies them
        newest first, a damaged one warned of and skipped as a restore skips it."""
        candidates = [info for info, _, _ in self._candidates()]
        for index, info in enumerate(candidates):
            if all(map(acceptable, candidates[index:])) or self._verify(self.store.entry_of(info.path)).info:
                return None if acceptable(info) else info
        return None

    def resume_point(self, model: Any = None) -> CheckpointInfo | None:
        """Where training of `model` continues, the one answer every trainer and the callback
        use: the checkpoint restored into it from this store, while the model has not trained
        since (the very read that restored it, even if the store changed meanwhile); otherwise
        the newest valid checkpoint."""
        restored = self._restored_into(model) if model is not None else None
        return restored.info if restored is not None else self.latest()

    def run_start(self, model: Any, context: Any) -> tuple[CheckpointInfo | None, bytes | None]:
        """The resume point of a run on `model` and the data position kept there (`input_state`),
        asked once per run; under a multi-worker strategy the chief's, sent to every worker."""
        if compat.is_multi_worker(context.strategy):
            return chief_resume_point(self, model, context)
        point = self.resume_point(model)
        kept = self.input_state(model) if point is not None else None
        return point, kept[1] if kept is not None else None

    def holds(self, model: Any) -> bool:
        """Whether `model` was made or restored from this store (its state one of the store's,
        or trained on from one), rather than built elsewhere."""
        restored = restored_of(model)
        return restored is not None and (restored.manager is self or restored.manager.store.same_as(self.store))

    def _restored_into(self, model: Any) -> Restored | None:
        """What was restored into `model` from this store, while the model has not trained
        since; else None."""
        restored = restored_of(model)
        if restored is None or restored.info is None or not (
            restored.manager is self or restored.manager.store.same_as(self.store)
        ):
            return None
        return restored if optimizer_step(model) == restored.info.global_step else None

    def callback_state(self, model: Any, read: bool = True) -> tuple[CheckpointInfo, bytes | None] | None:
        """The checkpoint `model` stands at (its step) and the state of the callbacks it kept
        (None when it kept none), or None when no checkpoint holds the model's step: the one the
        model was restored from, else (when `read`) the newest valid one if it is of this step."""
        return self._kept(model, "callbacks", CALLBACKS_FILE, read)

    def input_state(self, model: Any, read: bool = True) -> tuple[CheckpointInfo, bytes | None] | None:
        """As `callback_state`, the position of the training data's reader the checkpoint kept
        (`input.bin`, `data/resumable.py`), None when it kept none."""
        return self._kept(model, "input", INPUT_FILE, read)

    def _kept(self, model: Any, part: str, file: str, read: bool) -> tuple[CheckpointInfo, bytes | None] | None:
        restored = self._restored_into(model)
        if restored is not None:
            return restored.info, getattr(restored, part)
        latest = self.latest() if read else None
        if latest is None or latest.global_step != optimizer_step(model):
            return None
        entry = self.store.entry_of(latest.path)
        return latest, _kept_file(functools.partial(self.store.read, entry, file))

    def best(self, better: Callable[[CheckpointInfo, CheckpointInfo | None], bool]) -> CheckpointInfo | None:
        """The epoch-end checkpoint that `better(candidate, best_so_far)` ranks first."""
        best = None
        for info in self.checkpoints():
            if info.step_in_epoch == 0 and better(info, best):
                best = info
        return best

    # -- restoring -----------------------------------------------------------------------------
    def restore(self, model: Any) -> CheckpointInfo | None:
        """Load the newest valid checkpoint (weights, optimizer and random-generator states)
        into a built `model`; returns it, or None when there is none."""
        started = time.perf_counter()
        self.create()
        latest, callbacks, position = None, None, None
        with contextlib.closing(self._newest_files(model)) as newest:  # a download is removed, even on an error
            for latest, local in newest:
                _load_weights(model, local / MODEL_FILE, verified=True)
                restore_seed_states(model, local / RNG_FILE, latest.path)
                callbacks, position = _kept_files(local)
        self.restores.append((time.time(), time.perf_counter() - started, latest))
        self.note_restored(model, latest, callbacks, position)
        return latest

    def load_model(self, custom_objects: Any = None, safe_mode: bool = True) -> Any:
        """The whole model (config, weights, optimizer) of the newest valid checkpoint."""
        started = time.perf_counter()
        self.create()
        with contextlib.closing(self._newest_files()) as newest:
            for latest, local in newest:
                model = keras.models.load_model(local / MODEL_FILE, custom_objects=custom_objects, safe_mode=safe_mode)
                restore_seed_states(model, local / RNG_FILE, latest.path)
                self.restores.append((time.time(), time.perf_counter() - started, latest))
                self.note_restored(model, latest, *_kept_files(local))
                return model
        raise ValueError(
            f"checkpoint_dir {str(self.directory)!r} holds no valid checkpoint, and no build_fn "
            "was given to build a fresh model."
        )

    def may_restore(self) -> bool:
        """Whether `restore` has a checkpoint to try: a local store's newest valid one; on an object
        store any entry (the restore verifies each by its one download)."""
        return self.latest() is not None if self.store.is_local else bool(self.store.entries())

    def _newest_files(self, model: Any = None) -> Iterator[tuple[CheckpointInfo, Path]]:
        """At most once: the newest valid checkpoint and a local directory of its files while the
        caller's loop body runs (`model` checked and its optimizer built first). A local store's:
        the listing's, in place. An object store's: candidates newest first, each downloaded once,
        checked as it arrives (`verified_files`); one that does not match is warned of and skipped."""
        if self.store.is_local:
            latest = self.latest()
            if latest is not None:
                _ready_for(model, self.store, latest)
                yield latest, Path(latest.path)
            return
        for info, record, fingerprint in self._candidates():
            entry = self.store.entry_of(info.path)
            _ready_for(model, self.store, info, record)
            with verified_files(self.store, entry, record) as (problem, local):
                self._verified[entry] = Verified(fingerprint, None if problem else info, problem)
                if problem is None:
                    yield info, local
                    return
            self._warn(entry, fingerprint, problem)

    def _candidates(self) -> list[tuple[CheckpointInfo, dict[str, Any], Any]]:
        """(info, record, fingerprint) of each entry whose record reads and whose files have their
        recorded sizes, newest first (checksums: the download's). Damaged ones are left out."""
        found = []
        for entry in self.store.entries():
            now = self.store.fingerprint(entry)
            known = self._verified.get(entry)
            if known is not None and known.fingerprint == now and known.info is None:
                self._warn(entry, now, known.problem)
                continue
            problem, info, record = read_candidate(self.store, entry)
            if problem is None:
                found.append((info, record, now))
            else:
                self._verified[entry] = Verified(now, None, problem)
                self._warn(entry, now, problem)
        return sorted(found, key=lambda candidate: _newness(candidate[0]), reverse=True)

    def note_restored(self, model: Any, info: CheckpointInfo | None, callbacks: bytes | None = None,
                      position: bytes | None = None) -> None:
        """`model` now holds `info`'s state (restored here, or by `chief_state` from the chief's
        read; None: nothing to restore): its resume point is `info`, its callbacks' state
        `callbacks`, its data's position `position`, kept beside the model (`restored_of`), so
        `resume_fit(model, data, epochs)` needs no `checkpoint` argument
        (`model |> resume_fit(data, epochs = 5)` in R)."""
        note_restored(model, Restored(self, info, callbacks, position))

    # -- writing -------------------------------------------------------------------------------
    def save(self, model: Any, progress: Progress | None = None, *, memory: SaveMemory | None = None,
             epoch: int | None = None, step_in_epoch: int = 0, history: list[dict[str, float]] | None = None,
             metrics: dict[str, float] | None = None, run: RunRecord | None = None) -> CheckpointInfo:
        """Write a checkpoint of `model` now, atomically, recording `progress`, or `epoch` (the
        epoch to run next), `step_in_epoch`, `history`, `metrics` and `run` (`CheckpointInfo`'s
        fields of those names); its file is built as pieces of the variables' memory
        (`snapshot_now`), else in `memory` when given (kept from one save to the next); callers
        decide who writes (the chief)."""
        if progress is None:
            if epoch is None:
                raise ValueError("save needs progress or epoch (the epoch to run next), got neither.")
            progress = Progress.of(epoch, step_in_epoch, history, metrics, run=run)
        return self.commit(snapshot_now(model, memory), progress)

    def commit(self, taken: Snapshot, progress: Progress) -> CheckpointInfo:
        """Write a snapshot taken earlier as a checkpoint, its completion record last: the
        second half of `save`, for savers that snapshot in one place and write in another."""
        self.create()
        info = commit(self.store, taken, progress)
        entry = self.store.entry_of(info.path)
        self._verified[entry] = Verified(self.store.fingerprint(entry), info, None)  # written here: verified
        return info

    def prune(self, keep: int, protect: Iterable[CheckpointInfo | None] = ()) -> list[str]:
        """Delete all but the `keep` newest valid checkpoints and those in `protect` (the best,
        the one just saved); returns the deleted paths."""
        checkpoints = self.checkpoints()
        kept = {info.path for info in checkpoints[-max(keep, 1):]}
        kept.update(info.path for info in protect if info is not None)
        removed = []
        for info in checkpoints:
            if info.path not in kept:
                entry = self.store.entry_of(info.path)
                self.store.remove(entry)  # its completion record first
                self._verified.pop(entry, None)
                removed.append(info.path)
        return removed

    def remove_temporary(self) -> list[str]:
        """Delete what interrupted saves left (the chief, at the start): temporary directories,
        and on object stores uploads without a completion record."""
        return self.store.remove_temporary()


def _warn_damaged(store: Any, entry: str, problem: str | None) -> None:
    if problem is not None:
        warnings.warn(f"Skipping checkpoint {store.path_of(entry)}: {problem}.", CheckpointWarning, stacklevel=6)


def _kept_file(read: Callable[[], bytes]) -> bytes | None:
    """A state a checkpoint may keep (`callbacks.npz`, `input.bin`): `read()` of it (in its store,
    or in the local copy a restore verified); None when it kept none."""
    with contextlib.suppress(FileNotFoundError):
        return read()
    return None


def _kept_files(local: Path) -> tuple[bytes | None, bytes | None]:
    """The callbacks' state and the data's position a checkpoint's local files kept."""
    return _kept_file((local / CALLBACKS_FILE).read_bytes), _kept_file((local / INPUT_FILE).read_bytes)


def _ready_for(model: Any, store: Any, info: CheckpointInfo, record: dict[str, Any] | None = None) -> None:
    """`model` (None: nothing to do) checked against the checkpoint's weight signature, and its
    optimizer built, before the checkpoint's files are read."""
    if model is not None:
        record = record if record is not None else read_record(store, store.entry_of(info.path))
        check_signature(model, record["signature"], info.path)
        _build_optimizer(model, info.path)


def _newness(info: CheckpointInfo) -> tuple[tuple[int, int, int], bool, str]:
    """Newer sorts later: by the record; of two records of one step, the one not displaced (local)
    or saved last (object stores name a second save of a step `ckpt-<step>.s<time>`)."""
    name = info.path.rstrip("/").rsplit("/", 1)[-1]
    return info.order, REPLACED_MARK not in name, name


def _load_weights(model: Any, path: Path, verified: bool) -> None:
    """Load a checkpoint's weights into `model`. `verified`: the file itself passed the
    checkpoint's checksum (a local store's, or an object store's download checked against the
    record), so the weights member is read in place, without the zip's second CRC of it; else
    `load_weights`, whose zip checks it."""
    if verified:
        compat.load_keras_weights(model, path)
    else:
        model.load_weights(path)


def _build_optimizer(model: Any, path: str) -> None:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        optimizer.build(model.trainable_variables)
    else:
        warnings.warn(
            f"build_fn's model is not compiled: only the weights of {path} are restored, not the "
            "optimizer state.", CheckpointWarning, stacklevel=4,
        )


# --------------------------------------------------------------------------------------------
# What managers of one store share, and what a restore put into a model


class _Verifications:
    """The verification of one store's entries, shared by its managers while any of them lives:
    a cache of results, each redone when its entry's files change (`CheckpointManager._verify`),
    not a registry of managers."""

    def __init__(self, store: Any):
        self.store = store
        self.entries: dict[str, Verified] = {}


_VERIFICATIONS: weakref.WeakSet[_Verifications] = weakref.WeakSet()  # held by the managers, not here


def _verifications_of(store: Any) -> _Verifications:
    """The verification of `store`'s entries its managers share (a new one when none lives)."""
    for shared in list(_VERIFICATIONS):
        if shared.store.same_as(store):
            return shared
    shared = _Verifications(store)
    _VERIFICATIONS.add(shared)
    return shared


def as_manager(checkpoint_dir: Any, model: Any = None,
               storage_options: Mapping[str, Any] | None = None, *, create: bool = True) -> CheckpointManager:
    """`checkpoint_dir` as a manager: itself if it is one, the manager `model` was restored by
    when it names the same store (a URL given without `storage_options` names the store the
    model came from, with its options), else a new one, `create`d unless False."""
    if isinstance(checkpoint_dir, CheckpointManager):
        return checkpoint_dir
    store = open_store(checkpoint_dir, storage_options)
    remembered = manager_of(model) if model is not None else None
    if remembered is not None and (remembered.store.same_as(store) or (
            storage_options is None and remembered.store.location == store.location)):
        return remembered
    return CheckpointManager(store, create=create)


# --------------------------------------------------------------------------------------------
# Public functions


def list_checkpoints(checkpoint_dir: str | os.PathLike[str], *,
                     storage_options: Mapping[str, Any] | None = None) -> list[CheckpointInfo]:
    """The valid checkpoints in `checkpoint_dir` (a path or URL), oldest first by the step
    recorded in each.

    Damaged or partial checkpoints are skipped with a `CheckpointWarning` naming the file.
    `storage_options`: for an object-store URL, as in `CheckpointManager`.
    """
    return CheckpointManager(checkpoint_dir, storage_options=storage_options, create=False).checkpoints(
        warn_known=True)


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str], *,
                      storage_options: Mapping[str, Any] | None = None) -> CheckpointInfo | None:
    """The newest valid checkpoint (by recorded epoch and step, never by name or time), or None.
    `checkpoint_dir` and `storage_options` as in `list_checkpoints`."""
    return CheckpointManager(checkpoint_dir, storage_options=storage_options, create=False).latest(warn_known=True)


def save_checkpoint(model: Any, checkpoint_dir: str | os.PathLike[str], *, epoch: int, step_in_epoch: int = 0,
                    history: list[dict[str, float]] | None = None, metrics: dict[str, float] | None = None,
                    run: RunRecord | None = None, storage_options: Mapping[str, Any] | None = None) -> CheckpointInfo:
    """Write one checkpoint atomically and return it (the fields as `CheckpointManager.save`
    takes them)."""
    return as_manager(checkpoint_dir, storage_options=storage_options).save(
        model, epoch=epoch, step_in_epoch=step_in_epoch, history=history, metrics=metrics, run=run)


def make_or_restore_model(
    checkpoint_dir: str | os.PathLike[str],
    build_fn: Callable[[], Any] | None = None,
    *,
    strategy: Any = None,
    custom_objects: dict[str, Any] | None = None,
    safe_mode: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> Any:
    """Build the model, and restore the newest valid checkpoint into it if there is one.

    The model is built by `build_fn()` inside the strategy's scope (the given `strategy`, else the
    active one). When `checkpoint_dir` holds checkpoints, the newest valid one (by the epoch and
    step recorded in it) is loaded: weights, optimizer state and random-generator states; damaged
    ones are skipped with a warning. Under a multi-worker strategy only the chief reads
    `checkpoint_dir`, and every other worker gets the state it restored (hosts need not share a
    disk; see `chief_state`). `latest_checkpoint(checkpoint_dir)` then tells the epoch and
    step to resume from; pass its `epoch` as `initial_epoch` to `fit` (or use `resume_fit`, which
    continues from the checkpoint restored here) so `epochs=N` means N in total.

    Args:
        checkpoint_dir: directory of checkpoints, created if missing; or an object-store URL
            (`s3://bucket/run`, `gs://bucket/run`, `memory://run`; see `CheckpointManager`).
        build_fn: function returning a compiled Keras model. If None, the model is loaded whole
            from the newest checkpoint (its config, with `custom_objects` and `safe_mode`).
        strategy: a `tf.distribute.Strategy`; None: the active one.
        custom_objects: custom classes or functions needed to load a saved model.
        safe_mode: refuse to load lambdas from checkpoints (Keras safe mode); default True.
        storage_options: options for an object store (credentials, endpoint), as in
            `CheckpointManager`; None: environment variables and credentials files.

    Returns:
        The Keras model.
    """
    from kerasdist.context import context_of

    if build_fn is not None and not callable(build_fn):
        raise ValueError(f"build_fn must be a function returning a Keras model, got {type(build_fn).__name__}.")
    context = context_of(strategy)
    manager = as_manager(checkpoint_dir, storage_options=storage_options)
    multi_worker = compat.is_multi_worker(context.strategy)
    compat.warm_saving_skipsets()  # outside the scope: Keras's loading makes variables otherwise
    with context.strategy.scope():
        if build_fn is None:
            if multi_worker:
                check_chief_checkpoint_is_seen(manager, context)
            model = manager.load_model(custom_objects, safe_mode)
        elif multi_worker:  # only the chief reads: the hosts may share no disk
            model = _build(build_fn)
            restore_from_chief(manager, model, context)
        else:
            # a build about to be restored draws no random numbers (see initializers_deferred);
            # a fresh start's initial values are drawn as ever
            with compat.initializers_deferred(enabled=manager.may_restore()):
                model = _build(build_fn)
                manager.restore(model)
    return model


def _build(build_fn: Callable[[], Any]) -> Any:
    model = build_fn()
    if not isinstance(model, keras.Model):
        raise ValueError(f"build_fn must return a Keras model, got {type(model).__name__}.")
    if not model.built:
        raise ValueError(
            "build_fn returned a model that is not built: give it an Input (or call build()) so "
            "its weights exist before a checkpoint is loaded into it."
        )
    return model
