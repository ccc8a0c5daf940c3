"""Crash-safe checkpoints, local or on object storage: atomic commit, validation on restore,
chief-only writes, preemption.

- `store/`: where checkpoints live (a local directory, or an `s3://` / `gs://` / `memory://` prefix
  through fsspec); the only code that reads or writes checkpoint files.
- `layout`: the names of a checkpoint's files; `record`: its completion record (schema, commit,
  verification); `checksums`: the files' CRC-32s.
- `snapshot`: a model's state taken cheaply on the training thread, its files made later.
- `model_state`: what a checkpoint holds beyond `model.save` (seed states) and must check
  (weight signature).
- `manager`: `CheckpointManager`, one object per store a trainer hands down (validation, listing and
  checksums once, restore and resume point from one read, save, prune), and the public functions on it.
- `chief_state`: workers restored from the chief's read, so hosts need no shared disk.
- `background`: background saves (one in flight, errors raised at the next save / end of fit).
- `options`: `CheckpointOptions`, the checkpoint options as one record, checked once.
- `callback`: the Keras callback, made of `save_policy` (when), `saver` (how), `preemption_hold`
  (SIGTERM during fit, `kerasdist.preemption`), `other_callbacks` (the fit's other callbacks and
  their state, `callback_state`) and `recorder` (the run log, `run_log`).
"""

from kerasdist.checkpoint.background import BackgroundSaveError
from kerasdist.checkpoint.callback import (
    CheckpointCallback,
    check_trainer_callbacks,
    checkpoint_callback,
)
from kerasdist.checkpoint.manager import (
    CheckpointManager,
    as_manager,
    latest_checkpoint,
    list_checkpoints,
    make_or_restore_model,
    manager_of,
    save_checkpoint,
)
from kerasdist.checkpoint.options import CheckpointOptions
from kerasdist.checkpoint.record import CheckpointInfo, CheckpointWarning, RunRecord
from kerasdist.checkpoint.run_log import RunLogWarning
from kerasdist.checkpoint.table import checkpoint_table

__all__ = [
    "BackgroundSaveError",
    "CheckpointCallback",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointOptions",
    "CheckpointWarning",
    "RunLogWarning",
    "RunRecord",
    "as_manager",
    "check_trainer_callbacks",
    "checkpoint_callback",
    "checkpoint_table",
    "latest_checkpoint",
    "list_checkpoints",
    "make_or_restore_model",
    "manager_of",
    "save_checkpoint",
]
