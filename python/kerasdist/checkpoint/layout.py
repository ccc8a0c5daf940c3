"""The names a checkpoint directory holds: one definition, read by the stores, the record and the
snapshot.

A checkpoint is an entry `ckpt-<global step>/` holding `model.keras` (weights, optimizer state,
config), `rng.npz` (the Keras seed-generator states that `load_model` does not restore), `callbacks.npz`
(the other callbacks' state, when any has some), `input.bin` (the position of the data the
trainer reads itself, `data/resumable.py`, when it keeps one) and `state.json`, its completion
record (`record.py`), written last.
"""

from __future__ import annotations

RECORD_FILE = "state.json"
# What makes an entry a checkpoint, for the stores: written last, deleted first (the record).
COMMIT_MARKER = RECORD_FILE
MODEL_FILE = "model.keras"
RNG_FILE = "rng.npz"
# The state of the callbacks beside the checkpoint callback (`callback_state.py`), when any has state.
CALLBACKS_FILE = "callbacks.npz"
# The position of the training data's reader (`data/resumable.py`), when the data keeps one.
INPUT_FILE = "input.bin"
CHECKPOINT_PREFIX = "ckpt-"
TEMP_PREFIX = ".tmp-ckpt-"
# Local: a checkpoint displaced by a new save of the same step keeps a `ckpt-` name (so it is
# still found) until the new one is in place: see `LocalStore.commit`.
REPLACED_MARK = ".replaced-"
# Object stores: a new save of a step already there goes to `ckpt-<step>.s<ns since epoch>`.
SAVED_AGAIN_MARK = ".s"
# The run log (`run_log.py`), beside the checkpoints and never one: `runs/<attempt>.jsonl` and `.step`,
# and `.stacks` when the step watchdog's backstop dumped a hung chief's stacks (`watchdog.py`).
RUNS_FOLDER = "runs"
RUN_LOG_SUFFIX = ".jsonl"
RUN_STEP_SUFFIX = ".step"
RUN_STACKS_SUFFIX = ".stacks"


def entry_name(step: int) -> str:
    """The entry of the checkpoint of training step `step`: `ckpt-<step>`."""
    return f"{CHECKPOINT_PREFIX}{step}"


def step_of(name: str) -> int | None:
    """The training step an entry's name says (`ckpt-<step>`, any mark after it), or None."""
    digits = name[len(CHECKPOINT_PREFIX):] if name.startswith(CHECKPOINT_PREFIX) else ""
    count = len(digits) - len(digits.lstrip("0123456789"))
    return int(digits[:count]) if count else None
