"""`CheckpointManager`: one object per checkpoint directory, and the functions built on it.

The manager is what the callback, `make_or_restore_model`, `resume_fit`, `ps_fit` and
`distributed_fit` talk to. It checks the directory once, checksums each checkpoint once (again
only if its files change on disk), restores a model and gives the resume point from that same
read, saves atomically (`format.write_checkpoint`) and prunes.
"""

from __future__ import annotations

import os
import shutil
import warnings
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import keras

from kerasdist.checkpoint.format import (
    MODEL_FILE,
    REPLACED_MARK,
    RNG_FILE,
    CheckpointInfo,
    CheckpointWarning,
    checkpoint_candidates,
    fingerprint,
    probe_writable,
    read_checkpoint,
    read_record,
    remove_temporary,
    write_checkpoint,
    write_checkpoint_files,
)
from kerasdist.checkpoint.model_state import check_signature, optimizer_step, restore_seed_states
from kerasdist.step_guard import guard_train_function


class CheckpointManager:
    """The checkpoints of one directory: which exist and are valid, the newest, saving, pruning.

    The directory is checked when the manager is made (a path, not a file) and, once, created
    and probed for writing before the first restore or save. Listing reads each checkpoint's
    completion record; its files are checksummed the first time this manager sees it and again
    only if their size or modification time changes, so a run verifies every checkpoint once
    however many times it asks. Damaged checkpoints are skipped with one `CheckpointWarning`.

    Args:
        directory: the checkpoint directory.
        create: create and probe the directory now (default); False defers that to the first
            restore or save, so arguments can be checked before anything is touched.
    """

    def __init__(self, directory: str | os.PathLike[str], *, create: bool = True):
        self.directory = _checked_path(directory)
        self._writable = False
        self._seen: dict[str, tuple[Any, CheckpointInfo | None]] = {}  # path -> (fingerprint, info)
        self._restored: tuple[weakref.ref[Any], CheckpointInfo] | None = None
        if create:
            self.create()

    def __repr__(self) -> str:
        return f"CheckpointManager({str(self.directory)!r})"

    def create(self) -> Path:
        """Create the directory and check it is writable; done once per manager."""
        if not self._writable:
            try:
                probe_writable(self.directory)
            except OSError as err:
                raise ValueError(
                    f"checkpoint_dir {str(self.directory)!r} is not writable: {err.strerror}."
                ) from None
            self._writable = True
        return self.directory

    # -- reading -------------------------------------------------------------------------------
    def checkpoints(self) -> list[CheckpointInfo]:
        """The valid checkpoints, oldest first by the step recorded in each."""
        seen = {}
        for candidate in checkpoint_candidates(self.directory):
            key, now = str(candidate), fingerprint(candidate)
            entry = self._seen.get(key)
            if entry is None or entry[0] != now:
                problem, info = read_checkpoint(candidate)
                if problem:
                    warnings.warn(f"Skipping checkpoint {candidate}: {problem}.", CheckpointWarning, stacklevel=4)
                entry = (now, info)
            seen[key] = entry
        self._seen = seen
        return sorted((info for _, info in seen.values() if info is not None), key=_newness)

    def latest(self) -> CheckpointInfo | None:
        """The newest valid checkpoint (by recorded epoch and step, never by name or time)."""
        checkpoints = self.checkpoints()
        return checkpoints[-1] if checkpoints else None

    def resume_point(self, model: Any = None) -> CheckpointInfo | None:
        """Where training of `model` continues: the checkpoint this manager restored into it,
        while the model has not trained since (the very read that restored it, even if the
        directory changed meanwhile); otherwise the newest valid checkpoint."""
        restored_by = manager_of(model) if model is not None else None
        if restored_by is not None and restored_by._restored is not None and (
            restored_by is self or _same_directory(restored_by.directory, self.directory)
        ):
            restored_model, info = restored_by._restored
            if restored_model() is model and optimizer_step(model) == info.global_step:
                return info
        return self.latest()

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
        self.create()
        latest = self.latest()
        if latest is not None:
            path = Path(latest.path)
            check_signature(model, read_record(path)["signature"], path)
            _build_optimizer(model, path)
            model.load_weights(path / MODEL_FILE)
            restore_seed_states(model, path / RNG_FILE)
        self._note_restored(model, latest)
        return latest

    def load_model(self, custom_objects: Any = None, safe_mode: bool = True) -> Any:
        """The whole model (config, weights, optimizer) of the newest valid checkpoint."""
        self.create()
        latest = self.latest()
        if latest is None:
            raise ValueError(
                f"checkpoint_dir {str(self.directory)!r} holds no valid checkpoint, and no build_fn "
                "was given to build a fresh model."
            )
        path = Path(latest.path)
        model = keras.models.load_model(path / MODEL_FILE, custom_objects=custom_objects, safe_mode=safe_mode)
        restore_seed_states(model, path / RNG_FILE)
        self._note_restored(model, latest)
        return model

    def _note_restored(self, model: Any, info: CheckpointInfo | None) -> None:
        self._restored = (weakref.ref(model), info) if info is not None else None
        remember_manager(model, self)

    # -- writing -------------------------------------------------------------------------------
    def save(self, model: Any, **record: Any) -> CheckpointInfo:
        """Write a checkpoint atomically (`epoch`, `step_in_epoch`, `history`, `metrics`,
        `writer` as in `format.write_checkpoint`); callers decide who writes (the chief)."""
        return self._written(write_checkpoint(model, self.create(), **record))

    def save_files(self, record: dict[str, Any], files: dict[str, bytes]) -> CheckpointInfo:
        """Write a checkpoint made elsewhere atomically: its record (`format.checkpoint_record`)
        and files (`snapshot.Snapshot.files()`); what a background save runs."""
        return self._written(write_checkpoint_files(self.create(), record, files))

    def _written(self, info: CheckpointInfo) -> CheckpointInfo:
        path = Path(info.path)
        self._seen[str(path)] = (fingerprint(path), info)  # written and described here: verified
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
                shutil.rmtree(info.path, ignore_errors=True)
                self._seen.pop(info.path, None)
                removed.append(info.path)
        return removed

    def remove_temporary(self) -> list[str]:
        """Delete the temporary directories of interrupted saves (the chief, at the start)."""
        return remove_temporary(self.directory)


def _newness(info: CheckpointInfo) -> tuple[tuple[int, int, int], bool]:
    """Newer sorts later: by the record; of two records of one step, the one not displaced."""
    return info.order, REPLACED_MARK not in Path(info.path).name


def _checked_path(checkpoint_dir: Any) -> Path:
    """Refuse a checkpoint_dir that is not a directory path, before anything is touched."""
    if isinstance(checkpoint_dir, CheckpointManager):
        return checkpoint_dir.directory
    if not isinstance(checkpoint_dir, (str, os.PathLike)) or not str(checkpoint_dir):
        raise ValueError(f"checkpoint_dir must be a directory path, got {checkpoint_dir!r}.")
    directory = Path(checkpoint_dir)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"checkpoint_dir {str(directory)!r} is a file, not a directory.")
    return directory


def _build_optimizer(model: Any, path: Path) -> None:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        optimizer.build(model.trainable_variables)
    else:
        warnings.warn(
            f"build_fn's model is not compiled: only the weights of {path} are restored, not the "
            "optimizer state.", CheckpointWarning, stacklevel=4,
        )


def as_manager(checkpoint_dir: Any, model: Any = None) -> CheckpointManager:
    """`checkpoint_dir` as a manager: itself if it is one, the manager `model` was restored by
    when it names the same directory, else a new manager of that directory."""
    if isinstance(checkpoint_dir, CheckpointManager):
        return checkpoint_dir
    remembered = manager_of(model) if model is not None else None
    if remembered is not None and isinstance(checkpoint_dir, (str, os.PathLike)) and str(checkpoint_dir) \
            and _same_directory(remembered.directory, Path(checkpoint_dir)):
        return remembered
    return CheckpointManager(checkpoint_dir)


def _same_directory(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


# --------------------------------------------------------------------------------------------
# The model remembers its manager


_MANAGER_ATTRIBUTE = "_kerasdist_checkpoint_manager"


def remember_manager(model: Any, manager: CheckpointManager) -> None:
    """Tag the model with its checkpoint manager, so `resume_fit(model, data, epochs)` needs no
    `checkpoint` argument (and reads naturally as `model |> resume_fit(data, epochs = 5)` in R)."""
    object.__setattr__(model, _MANAGER_ATTRIBUTE, manager)


def manager_of(model: Any) -> CheckpointManager | None:
    return getattr(model, _MANAGER_ATTRIBUTE, None)


def remembered_checkpoint_dir(model: Any) -> str | None:
    """The directory `make_or_restore_model` made or restored `model` from, or None."""
    manager = manager_of(model)
    return str(manager.directory) if manager is not None else None


# --------------------------------------------------------------------------------------------
# Public functions


def list_checkpoints(checkpoint_dir: str | os.PathLike[str]) -> list[CheckpointInfo]:
    """The valid checkpoints in `checkpoint_dir`, oldest first by the step recorded in each.

    Damaged or partial checkpoints are skipped with a `CheckpointWarning` naming the file.
    """
    return CheckpointManager(checkpoint_dir, create=False).checkpoints()


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> CheckpointInfo | None:
    """The newest valid checkpoint (by recorded epoch and step, never by name or time), or None."""
    return CheckpointManager(checkpoint_dir, create=False).latest()


def save_checkpoint(model: Any, checkpoint_dir: str | os.PathLike[str], **record: Any) -> CheckpointInfo:
    """Write one checkpoint atomically and return it (see `CheckpointManager.save`)."""
    return as_manager(checkpoint_dir).save(model, **record)


def make_or_restore_model(
    checkpoint_dir: str | os.PathLike[str],
    build_fn: Callable[[], Any] | None = None,
    *,
    strategy: Any = None,
    custom_objects: dict[str, Any] | None = None,
    safe_mode: bool = True,
) -> Any:
    """Build the model, and restore the newest valid checkpoint into it if there is one.

    The model is built by `build_fn()` inside the strategy's scope (the given `strategy`, else the
    active one). When `checkpoint_dir` holds checkpoints, the newest valid one (by the epoch and
    step recorded in it) is loaded: weights, optimizer state and random-generator states; damaged
    ones are skipped with a warning. `latest_checkpoint(checkpoint_dir)` then tells the epoch and
    step to resume from; pass its `epoch` as `initial_epoch` to `fit` (or use `resume_fit`, which
    continues from the checkpoint restored here) so `epochs=N` means N in total.

    Args:
        checkpoint_dir: directory of checkpoints; created if missing.
        build_fn: function returning a compiled Keras model. If None, the model is loaded whole
            from the newest checkpoint (its config, with `custom_objects` and `safe_mode`).
        strategy: a `tf.distribute.Strategy`; default the active one.
        custom_objects: custom classes or functions needed to load a saved model.
        safe_mode: refuse to load lambdas from checkpoints (Keras safe mode); default True.

    Returns:
        The Keras model.
    """
    from kerasdist.strategy import run_context

    if build_fn is not None and not callable(build_fn):
        raise ValueError(f"build_fn must be a function returning a Keras model, got {type(build_fn).__name__}.")
    context = run_context(strategy)
    manager = as_manager(checkpoint_dir)
    with context.strategy.scope():
        if build_fn is None:
            model = manager.load_model(custom_objects, safe_mode)
        else:
            model = _build(build_fn)
            manager.restore(model)
    guard_train_function(model)
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
