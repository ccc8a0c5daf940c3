"""Monitoring from several workers, written once: logs, CSV files and exports go to the user's paths
on the chief only; every other worker writes to a folder of its own in the temporary directory,
removed when the process exits, as TensorFlow's multi-worker guide prescribes (every worker still
runs the callbacks: a save under a multi-worker strategy can take part in collectives).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Any

import keras

from kerasdist.context import RunContext, run_context

# The Keras callbacks that write files, and the attribute that names where.
FILE_WRITERS: dict[type, str] = {
    keras.callbacks.TensorBoard: "log_dir",
    keras.callbacks.CSVLogger: "filename",
    keras.callbacks.ModelCheckpoint: "filepath",
}
_WORKER_FOLDER: list[str] = []  # this process's, made on first use
_WRITERS: dict[str, Any] = {}  # the run figures' summary writers, by directory


def chief_path(path: str | os.PathLike[str], context: RunContext | None = None) -> str:
    """`path` on the chief (and outside a cluster); on any other worker the same name in a
    temporary folder of its own, removed when the process exits. For what your own code or
    callbacks write: `TensorBoard(log_dir=kerasdist.chief_path("logs"))`.

    Args:
        path: a file or directory path (a name pattern such as "model-{epoch}.keras" is kept).
        context: where this process trains, from `run_context`; None: `run_context()` (this
            process's place in its cluster).
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"path must be a file or directory path, got {path!r}.")
    context = context if context is not None else run_context()
    if context.is_chief:
        return os.fspath(path)
    return os.path.join(_worker_folder(context.task), os.path.basename(os.path.normpath(os.fspath(path))))


def chief_writes_only(callbacks: list[Any], context: RunContext) -> list[Any]:
    """`callbacks` with each file-writing Keras callback (TensorBoard, CSVLogger, ModelCheckpoint)
    pointed at `chief_path` of its path: on workers other than the chief, a temporary one."""
    if not context.is_chief:
        for callback in callbacks:
            for kind, attribute in FILE_WRITERS.items():
                if isinstance(callback, kind):
                    setattr(callback, attribute, chief_path(getattr(callback, attribute), context))
    return callbacks


def monitored(callbacks: list[Any], context: RunContext, checkpoint: Any) -> list[Any]:
    """A trainer's callbacks written by the chief only (`chief_writes_only`); the chief's
    checkpoint callback is told where its TensorBoard logs go, for the run figures."""
    callbacks = chief_writes_only(callbacks, context)
    checkpoint.tensorboard_dir = tensorboard_dir_of(callbacks) if context.is_chief else None
    return callbacks


def _worker_folder(task: str | None) -> str:
    if not _WORKER_FOLDER:
        name = (task or "worker").replace(":", "-")
        _WORKER_FOLDER.append(tempfile.mkdtemp(prefix=f"kerasdist-{name}-"))
        atexit.register(remove_worker_folder)
    return _WORKER_FOLDER[0]


def remove_worker_folder() -> None:
    """Remove this process's temporary folder (at the interpreter's exit; R calls it at its own)."""
    while _WORKER_FOLDER:
        shutil.rmtree(_WORKER_FOLDER.pop(), ignore_errors=True)


def tensorboard_dir_of(callbacks: list[Any]) -> str | None:
    """The log_dir of the first TensorBoard callback among `callbacks`, if any."""
    return next((c.log_dir for c in callbacks if isinstance(c, keras.callbacks.TensorBoard)), None)


def write_run_figures(log_dir: str, epoch: int, figures: dict[str, Any]) -> None:
    """`figures` as TensorBoard scalars `kerasdist/<name>` at `epoch`, in `log_dir`/kerasdist
    (a text figure, such as the straggler named, as a text summary)."""
    import tensorflow as tf

    directory = os.path.join(log_dir, "kerasdist")
    if directory not in _WRITERS:  # one writer, one events file, for the whole run
        _WRITERS[directory] = tf.summary.create_file_writer(directory)
    writer = _WRITERS[directory]
    with writer.as_default():
        for name, value in figures.items():
            if isinstance(value, str):
                tf.summary.text(f"kerasdist/{name}", value, step=epoch)
            else:
                tf.summary.scalar(f"kerasdist/{name}", value, step=epoch)
    writer.flush()
