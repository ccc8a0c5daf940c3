"""Crash-safe checkpoints: atomic commit, validation on restore, chief-only writes, preemption.

A checkpoint is a directory `ckpt-<global step>/` holding `model.keras` (weights, optimizer state,
config), `rng.npz` (the Keras seed-generator states that `load_model` does not restore) and
`state.json`, the completion record: epoch, step, metrics, history, and the size and SHA-256 of
every other file. It is written under a temporary name in the same directory, every file is
fsynced, the record is written last, and only then is the directory renamed into place. A crash at
any byte therefore leaves the old checkpoint and, at worst, an ignored temporary directory; a
checkpoint whose files do not match their record is skipped with a warning on restore.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kerasdist.step_guard import guard_train_function

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: saved on SIGTERM, restart to continue
FORMAT_VERSION = 1
RECORD_FILE = "state.json"
MODEL_FILE = "model.keras"
RNG_FILE = "rng.npz"
CHECKPOINT_PREFIX = "ckpt-"
TEMP_PREFIX = ".tmp-ckpt-"


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
        global_step: optimizer steps taken in total.
        history: per-epoch logs of all completed epochs, earlier runs included.
        metrics: the logs at save time (epoch metrics for epoch-end checkpoints).
        writer: the task that wrote it ("worker:0", "chief:0"), or None outside a cluster.
    """

    path: str
    epoch: int
    step_in_epoch: int
    global_step: int
    history: list[dict[str, float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    writer: str | None = None

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.epoch, self.step_in_epoch, self.global_step)


# --------------------------------------------------------------------------------------------
# Reading


def list_checkpoints(checkpoint_dir: str | os.PathLike[str]) -> list[CheckpointInfo]:
    """The valid checkpoints in `checkpoint_dir`, oldest first by the step recorded in each.

    Damaged or partial checkpoints are skipped with a `CheckpointWarning` naming the file.
    """
    return _listed(checkpoint_dir, verify_files=True, warn=True)


def _listed(checkpoint_dir: str | os.PathLike[str], verify_files: bool, warn: bool) -> list[CheckpointInfo]:
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        return []
    found = []
    for candidate in sorted(directory.glob(f"{CHECKPOINT_PREFIX}*")):
        problem, info = _validate(candidate, verify_files)
        if problem and warn:
            warnings.warn(f"Skipping checkpoint {candidate}: {problem}.", CheckpointWarning, stacklevel=3)
        elif info is not None:
            found.append(info)
    return sorted(found, key=lambda info: info.order)


def latest_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> CheckpointInfo | None:
    """The newest valid checkpoint (by recorded epoch and step, never by name or time), or None."""
    checkpoints = list_checkpoints(checkpoint_dir)
    return checkpoints[-1] if checkpoints else None


def _validate(path: Path, verify_files: bool = True) -> tuple[str | None, CheckpointInfo | None]:
    """(problem, info): a reason the checkpoint cannot be used, or its info. Without
    `verify_files` only the completion record is read (no checksums)."""
    if not path.is_dir():
        return f"{path.name} is not a checkpoint directory", None
    record_path = path / RECORD_FILE
    if not record_path.is_file():
        return f"{record_path} is missing (the save never completed)", None
    try:
        record = json.loads(record_path.read_text())
        files = record["files"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return f"{record_path} is not a valid completion record", None
    for name, expected in files.items() if verify_files else ():
        problem = _file_problem(path / name, expected)
        if problem:
            return problem, None
    return None, CheckpointInfo(
        path=str(path),
        epoch=int(record["epoch"]),
        step_in_epoch=int(record["step_in_epoch"]),
        global_step=int(record["global_step"]),
        history=list(record.get("history", [])),
        metrics=dict(record.get("metrics", {})),
        writer=record.get("writer"),
    )


def _file_problem(path: Path, expected: dict[str, Any]) -> str | None:
    if not path.is_file():
        return f"{path} is missing"
    size = path.stat().st_size
    if size != expected["size"]:
        return f"{path} has {size} bytes, the record says {expected['size']} (truncated or replaced)"
    if _sha256(path) != expected["sha256"]:
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


def save_checkpoint(
    model: Any,
    checkpoint_dir: str | os.PathLike[str],
    *,
    epoch: int,
    step_in_epoch: int = 0,
    history: list[dict[str, float]] | None = None,
    metrics: dict[str, float] | None = None,
    writer: str | None = None,
) -> CheckpointInfo:
    """Write one checkpoint atomically and return it. Callers decide who writes (the chief)."""
    directory = Path(checkpoint_dir)
    global_step = _optimizer_step(model)
    temp = directory / f"{TEMP_PREFIX}{global_step}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    temp.mkdir(parents=True)
    try:
        model.save(temp / MODEL_FILE)
        np.savez(temp / RNG_FILE, *_seed_states(model))
        record = {
            "format": FORMAT_VERSION,
            "epoch": int(epoch),
            "step_in_epoch": int(step_in_epoch),
            "global_step": global_step,
            "saved_at": time.time(),
            "writer": writer,
            "signature": _signature(model),
            "history": _plain(history or []),
            "metrics": _plain(metrics or {}),
            "files": {name: _fsync_and_describe(temp / name) for name in (MODEL_FILE, RNG_FILE)},
        }
        _write_durably(temp / RECORD_FILE, json.dumps(record, indent=1))
        _fsync_directory(temp)
        final = directory / f"{CHECKPOINT_PREFIX}{global_step}"
        _commit(temp, final)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return CheckpointInfo(str(final), int(epoch), int(step_in_epoch), global_step,
                          record["history"], record["metrics"], writer)


def _commit(temp: Path, final: Path) -> None:
    """Rename the finished temporary directory into place; the rename is the commit."""
    if final.exists():  # the same step saved again (e.g. preempted right after a save)
        stale = final.with_name(f"{TEMP_PREFIX}stale-{uuid.uuid4().hex[:8]}")
        os.rename(final, stale)
        os.rename(temp, final)
        shutil.rmtree(stale, ignore_errors=True)
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


def remove_temporary(checkpoint_dir: str | os.PathLike[str]) -> list[str]:
    """Delete temporary directories left by interrupted saves; returns what was removed."""
    removed = []
    for temp in Path(checkpoint_dir).glob(f"{TEMP_PREFIX}*"):
        shutil.rmtree(temp, ignore_errors=True)
        removed.append(str(temp))
    return removed


def prune_checkpoints(
    checkpoint_dir: str | os.PathLike[str],
    keep: int,
    best: CheckpointInfo | None = None,
    just_saved: CheckpointInfo | None = None,
) -> list[str]:
    """Keep the `keep` newest checkpoints by their records (and `best`, and `just_saved`, the
    valid one the caller has just written, so it is never the one removed).

    Only the completion records are read, not the files' checksums: this runs after every save.
    """
    checkpoints = _listed(checkpoint_dir, verify_files=False, warn=False)
    keep_paths = {info.path for info in checkpoints[-max(keep, 1):]}
    keep_paths.update(info.path for info in (best, just_saved) if info is not None)
    removed = []
    for info in checkpoints:
        if info.path not in keep_paths:
            shutil.rmtree(info.path, ignore_errors=True)
            removed.append(info.path)
    return removed


# --------------------------------------------------------------------------------------------
# Model state that `model.save` / `load_weights` miss or that needs checking


def _optimizer_step(model: Any) -> int:
    optimizer = getattr(model, "optimizer", None)
    return int(optimizer.iterations.numpy()) if optimizer is not None else 0


def _seed_generators(model: Any) -> list[Any]:
    """Keras SeedGenerators (Dropout and friends), in a stable order."""
    found = []
    for layer in model._flatten_layers(include_self=True, recursive=True):
        for name in sorted(vars(layer)):
            value = getattr(layer, name, None)
            if isinstance(value, keras.random.SeedGenerator):
                found.append(value)
    return found


def _seed_states(model: Any) -> list[np.ndarray]:
    return [np.asarray(generator.state.numpy()) for generator in _seed_generators(model)]


def _restore_seed_states(model: Any, path: Path) -> None:
    generators = _seed_generators(model)
    with np.load(path) as saved:
        states = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    if len(states) != len(generators):
        raise ValueError(
            f"The checkpoint {path.parent} has {len(states)} random-generator states, the model "
            f"has {len(generators)}: it was saved from a different architecture."
        )
    for generator, state in zip(generators, states, strict=True):
        generator.state.assign(state)


def _signature(model: Any) -> list[list[Any]]:
    """Shape and dtype of every weight: what must match for a checkpoint to load."""
    return [[list(map(int, w.shape)), str(w.dtype)] for w in model.weights]


def _plain(value: Any) -> Any:
    """Logs as JSON-safe floats."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


# --------------------------------------------------------------------------------------------
# Public entry points


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
    step to resume from; pass its `epoch` as `initial_epoch` to `fit` (or use `resume_fit`) so
    `epochs=N` means N in total.

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
    import tensorflow as tf

    directory = check_checkpoint_dir(checkpoint_dir)
    if build_fn is not None and not callable(build_fn):
        raise ValueError(f"build_fn must be a function returning a Keras model, got {type(build_fn).__name__}.")
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        raise ValueError(f"strategy must be a tf.distribute.Strategy, got {type(strategy).__name__}.")
    strategy = strategy or tf.distribute.get_strategy()
    latest = latest_checkpoint(directory)
    with strategy.scope():
        if build_fn is None:
            model = _load_whole(directory, latest, custom_objects, safe_mode)
        else:
            model = _build(build_fn)
            if latest is not None:
                _restore_into(model, latest)
    remember_checkpoint_dir(model, directory)
    guard_train_function(model)
    return model


_CHECKPOINT_DIR_ATTRIBUTE = "_kerasdist_checkpoint_dir"


def remember_checkpoint_dir(model: Any, directory: Path) -> None:
    """Tag the model with its checkpoint directory, so `resume_fit(model, data, epochs)` needs no
    `checkpoint` argument (and reads naturally as `model |> resume_fit(data, epochs = 5)` in R)."""
    object.__setattr__(model, _CHECKPOINT_DIR_ATTRIBUTE, str(directory))


def remembered_checkpoint_dir(model: Any) -> str | None:
    return getattr(model, _CHECKPOINT_DIR_ATTRIBUTE, None)


def check_checkpoint_dir(checkpoint_dir: Any) -> Path:
    """Refuse a checkpoint_dir that is not a usable directory, before anything is touched."""
    if not isinstance(checkpoint_dir, (str, os.PathLike)) or not str(checkpoint_dir):
        raise ValueError(f"checkpoint_dir must be a directory path, got {checkpoint_dir!r}.")
    directory = Path(checkpoint_dir)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"checkpoint_dir {str(directory)!r} is a file, not a directory.")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f"{TEMP_PREFIX}probe-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"checkpoint_dir {str(directory)!r} is not writable: {err.strerror}.") from None
    return directory


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


def _restore_into(model: Any, latest: CheckpointInfo) -> None:
    path = Path(latest.path)
    record = json.loads((path / RECORD_FILE).read_text())
    _check_signature(model, record["signature"], path)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        optimizer.build(model.trainable_variables)
    else:
        warnings.warn(
            f"build_fn's model is not compiled: only the weights of {path} are restored, not the "
            "optimizer state.", CheckpointWarning, stacklevel=3,
        )
    model.load_weights(path / MODEL_FILE)
    _restore_seed_states(model, path / RNG_FILE)


def _check_signature(model: Any, saved: list[list[Any]], path: Path) -> None:
    current = _signature(model)
    if len(current) != len(saved):
        raise ValueError(
            f"The checkpoint {path} does not match the model build_fn returned: it has "
            f"{len(saved)} weights, the model has {len(current)}."
        )
    for index, (now, then) in enumerate(zip(current, saved, strict=True)):
        if now != then:
            raise ValueError(
                f"The checkpoint {path} does not match the model build_fn returned: weight "
                f"{index} ({model.weights[index].path}) is {now[0]} {now[1]} in the model but "
                f"{then[0]} {then[1]} in the checkpoint."
            )


def _load_whole(directory: Path, latest: CheckpointInfo | None, custom_objects: Any, safe_mode: bool) -> Any:
    if latest is None:
        raise ValueError(
            f"checkpoint_dir {str(directory)!r} holds no valid checkpoint, and no build_fn was "
            "given to build a fresh model."
        )
    path = Path(latest.path)
    model = keras.models.load_model(path / MODEL_FILE, custom_objects=custom_objects, safe_mode=safe_mode)
    _restore_seed_states(model, path / RNG_FILE)
    return model


# --------------------------------------------------------------------------------------------
# The callback


def checkpoint_callback(
    checkpoint_dir: str | os.PathLike[str],
    *,
    every_epoch: bool = True,
    every_steps: int | None = None,
    keep: int = 3,
    keep_best: bool = False,
    monitor: str = "loss",
    mode: str = "min",
    handle_sigterm: bool = True,
) -> CheckpointCallback:
    """A Keras callback that writes crash-safe checkpoints.

    Saves at the end of every epoch (`every_epoch`) and/or every `every_steps` optimizer steps,
    atomically; keeps the `keep` newest (plus the best by `monitor` when `keep_best`), never
    deleting the newest valid one. Under multi-worker strategies only the chief writes. On SIGTERM
    it saves at the next step boundary, stops training and exits with `PREEMPTED_EXIT_CODE` (75).

    Args:
        checkpoint_dir: where checkpoints go; created if missing.
        every_epoch: save at each epoch end.
        every_steps: also save every this many steps (None: only at epoch ends).
        keep: how many of the newest checkpoints to keep (>= 1).
        keep_best: also keep the checkpoint with the best `monitor` value.
        monitor: the epoch metric `keep_best` compares, e.g. "loss" or "val_loss".
        mode: "min" or "max": whether a smaller or larger `monitor` is better.
        handle_sigterm: save and exit on SIGTERM (preemption); default True.
    """
    return CheckpointCallback(
        checkpoint_dir, every_epoch=every_epoch, every_steps=every_steps, keep=keep,
        keep_best=keep_best, monitor=monitor, mode=mode, handle_sigterm=handle_sigterm,
    )


def _check_callback_args(every_epoch: Any, every_steps: Any, keep: Any, mode: Any, monitor: Any) -> None:
    if not isinstance(every_epoch, bool):
        raise ValueError(f"every_epoch must be TRUE/True or FALSE/False, got {every_epoch!r}.")
    if every_steps is not None and (
        isinstance(every_steps, bool) or not isinstance(every_steps, int) or every_steps < 1
    ):
        raise ValueError(f"every_steps must be a positive integer or None, got {every_steps!r}.")
    if not every_epoch and every_steps is None:
        raise ValueError("every_epoch is False and every_steps is None: the callback would never save.")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an integer >= 1 (the newest checkpoint is always kept), got {keep!r}.")
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}.")
    if not isinstance(monitor, str) or not monitor:
        raise ValueError(f"monitor must be a metric name such as 'loss', got {monitor!r}.")


class CheckpointCallback(keras.callbacks.Callback):
    """See `checkpoint_callback`."""

    def __init__(self, checkpoint_dir, *, every_epoch=True, every_steps=None, keep=3,
                 keep_best=False, monitor="loss", mode="min", handle_sigterm=True):
        super().__init__()
        _check_callback_args(every_epoch, every_steps, keep, mode, monitor)
        self.checkpoint_dir = check_checkpoint_dir(checkpoint_dir)
        self.every_epoch = every_epoch
        self.every_steps = every_steps
        self.keep = keep
        self.keep_best = keep_best
        self.monitor = monitor
        self.mode = mode
        self.handle_sigterm = handle_sigterm
        self.step_offset = 0  # batches of the first epoch already trained before this fit
        self.saved: list[CheckpointInfo] = []
        self.preempted = False
        self._first_epoch: int | None = None
        self._epoch = 0
        self._step = 0
        self._batches_seen = 0  # in this fit's current epoch
        self._history: list[dict[str, float]] = []
        self._best: CheckpointInfo | None = None
        self._previous_handler: Any = None
        self._is_chief = True
        self._task: str | None = None

    # -- Keras hooks ------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._is_chief, self._task = self._role()
        checkpoints = list_checkpoints(self.checkpoint_dir)  # checksums every file: once
        self._history = list(checkpoints[-1].history) if checkpoints else []
        self._best = self._best_of(checkpoints) if self.keep_best else None
        self._first_epoch = None
        if self._is_chief:
            remove_temporary(self.checkpoint_dir)
        self._install_sigterm_handler()

    def on_epoch_begin(self, epoch, logs=None):
        first = self._first_epoch is None
        self._first_epoch = epoch if first else self._first_epoch
        self._epoch = epoch
        self._step = self.step_offset if first else 0
        self._batches_seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        self._batches_seen = batch + 1
        if self.preempted:
            self._save(self._epoch, self._step, logs)
            self.model.stop_training = True
            return
        last_batch = self.params.get("steps") is not None and batch + 1 >= self.params["steps"]
        if self.every_steps and not last_batch and _optimizer_step(self.model) % self.every_steps == 0:
            self._save(self._epoch, self._step, logs)

    def on_epoch_end(self, epoch, logs=None):
        steps = self.params.get("steps")
        if self.preempted and (steps is None or self._batches_seen < steps):
            return  # stopped mid-epoch: the step checkpoint is the resume point
        self._history.append(_plain(logs or {}))
        if self.every_epoch or self.preempted:
            self._save(epoch + 1, 0, logs)

    def on_train_end(self, logs=None):
        self._restore_sigterm_handler()
        if self.preempted:
            raise SystemExit(PREEMPTED_EXIT_CODE)

    # -- helpers ----------------------------------------------------------------------------
    def _save(self, epoch: int, step: int, logs: dict | None) -> None:
        if not self._is_chief:
            return
        info = save_checkpoint(
            self.model, self.checkpoint_dir, epoch=epoch, step_in_epoch=step,
            history=self._history, metrics=_plain(logs or {}), writer=self._task,
        )
        self.saved.append(info)
        if self.keep_best and step == 0 and self._better(info, self._best):
            self._best = info
        prune_checkpoints(self.checkpoint_dir, self.keep, self._best, just_saved=info)

    def _better(self, info: CheckpointInfo, best: CheckpointInfo | None) -> bool:
        value = info.metrics.get(self.monitor)
        if value is None:
            return False
        if best is None or best.metrics.get(self.monitor) is None:
            return True
        return value < best.metrics[self.monitor] if self.mode == "min" else value > best.metrics[self.monitor]

    def _best_of(self, checkpoints: list[CheckpointInfo]) -> CheckpointInfo | None:
        best = None
        for info in checkpoints:
            if info.step_in_epoch == 0 and self._better(info, best):
                best = info
        return best

    def _role(self) -> tuple[bool, str | None]:
        """(is this process the chief, its task name)."""
        from kerasdist.strategy import describe_strategy

        description = describe_strategy(getattr(self.model, "distribute_strategy", None))
        return description.is_chief, description.task

    def _install_sigterm_handler(self) -> None:
        self.preempted = False
        if not self.handle_sigterm:
            return
        try:
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        except ValueError:  # not the main thread: leave signals to the caller
            self._previous_handler = None

    def _restore_sigterm_handler(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _on_sigterm(self, signum, frame) -> None:
        self.preempted = True
