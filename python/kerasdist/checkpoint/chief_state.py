"""Multi-worker restores when the hosts share no disk: the chief's checkpoint wins.

Under MultiWorkerMirroredStrategy every worker must start from the same weights and the same
resume point, or the first collective fails ("The following tasks are unhealthy", "Collective
instance ... expected type 1 but got type 0") or, worse, the workers train apart. Only the chief
is sure to see the checkpoints (it is the one that writes them); a worker on another host may see
none (node-local scratch, a pod's own disk), an older copy, or a directory of its own.

So under multi-worker only the chief reads checkpoints: it restores its newest valid one as on a
single host, then sends every worker, in one message, the checkpoint's record (the resume point
and history) or the error it met, the restored state (the bytes of every variable: weights,
optimizer slots and counters, random-generator states), the other callbacks' state and the
position of the data's reader (every worker reads the same pipeline: `data/resumable.py`). The
message is two all-reduce sums to which only the chief contributes, its parts' lengths and then
their bytes as int64 words: adding zeros to integers is exact, so each worker receives the
chief's bytes bit for bit. Workers therefore never restore from checkpoint files. They may
still list and verify what they see: `distributed_fit` and `custom_fit` read the newest record
on every worker to refuse other speed settings before anything loads (`speed`), which on a disk
of a worker's own finds nothing, or an older record, and is harmless there. The `build_fn`-less
path (`load_model`), which needs the files themselves, checks that every worker sees the chief's
checkpoint and otherwise stops everywhere with an error naming `checkpoint_dir`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import tensorflow as tf

from kerasdist import compat
from kerasdist.checkpoint.record import CheckpointInfo, read_record

SHARED_STORAGE_HINT = (
    "put checkpoint_dir on storage every worker reads (a shared filesystem, or an object store URL "
    "such as s3://bucket/run)"
)


def restore_into(manager: Any, model: Any, context: Any) -> None:
    """Load `manager`'s newest valid checkpoint (if any) into `model`, a built model made
    outside it, in the scope of its strategy: under a multi-worker strategy the chief reads and
    every worker gets its state (`restore_from_chief`), as in `make_or_restore_model`."""
    with context.strategy.scope():
        if compat.is_multi_worker(context.strategy):
            restore_from_chief(manager, model, context)
        else:
            manager.restore(model)


def restore_from_chief(manager: Any, model: Any, context: Any) -> CheckpointInfo | None:
    """On every worker of a multi-worker `context`: the chief restores `manager`'s newest valid
    checkpoint into `model`, the others receive its state and resume point. Returns the
    checkpoint restored (the chief's), or None when there is none."""
    strategy = context.strategy
    _build_optimizer_quietly(model)  # its variables are made by collectives: on every worker alike
    # the header (record or error), the variables' bytes, the callbacks' state, the data's position
    parts = [b"", b"", b"", b""]
    info = None
    if context.is_chief:
        try:
            info, parts = _chief_restore(manager, model)
        except Exception as err:
            _broadcast_parts(strategy, True, [_json({"error": f"{type(err).__name__}: {err}"}), b"", b"", b""])
            raise
    text, state, callbacks, position = _broadcast_parts(strategy, context.is_chief, parts)
    header = json.loads(text.decode())
    if "error" in header:
        raise ValueError(
            f"The chief could not restore checkpoint_dir {str(manager.directory)!r}, so no worker "
            f"starts: {header['error']}"
        )
    if context.is_chief:
        return info
    if header["checkpoint"] is None:  # a fresh start: noted as the chief's restore noted it, so every
        manager.note_restored(model, None)  # worker's later `manager.holds(model)` answers alike
        return None
    _assign_state(state_variables(model), state, manager)
    info = CheckpointInfo(**header["checkpoint"])
    manager.note_restored(model, info, callbacks if header["callbacks"] else None,
                          position if header.get("input") else None)
    return info


def chief_resume_point(manager: Any, model: Any, context: Any) -> tuple[CheckpointInfo | None, bytes | None]:
    """On every worker of a multi-worker `context`: the checkpoint `model` continues from and the
    data position kept there (`manager.resume_point`, `input_state`), as the chief finds them. A
    worker's own listing may not show the chief's last save yet (still being written after the
    previous fit), or may be of a disk it does not share."""
    parts = [b"", b""]
    if context.is_chief:
        point = manager.resume_point(model)
        position = _restored(manager.input_state(model)) if point is not None else None
        parts = [_json({"checkpoint": None if point is None else dataclasses.asdict(point)}), position or b""]
    text, position = _broadcast_parts(context.strategy, context.is_chief, parts)
    header = json.loads(text.decode())
    return (None if header["checkpoint"] is None else CheckpointInfo(**header["checkpoint"])), position or None


def _chief_restore(manager: Any, model: Any) -> tuple[CheckpointInfo | None, list[bytes]]:
    """The chief's restore, and what it sends: the header, the variables' bytes, the callbacks'
    state, the data's position."""
    info = manager.restore(model)
    callbacks, position = (_restored(manager.callback_state(model, read=False)),
                           _restored(manager.input_state(model, read=False)))
    header = {"checkpoint": None if info is None else dataclasses.asdict(info), "callbacks": callbacks is not None,
              "input": position is not None}
    state = _state_bytes(state_variables(model)) if info is not None else b""
    return info, [_json(header), state, callbacks or b"", position or b""]


def _restored(kept: tuple[Any, bytes | None] | None) -> bytes | None:
    """The bytes of what the chief restored (`manager.callback_state` / `input_state`), or None."""
    return kept[1] if kept is not None else None


def check_chief_checkpoint_is_seen(manager: Any, context: Any) -> None:
    """For the `build_fn`-less path, where every worker loads the model from its own files: the
    chief's newest checkpoint must be the newest each worker sees, else every worker stops with
    the same error before anything is built."""
    strategy = context.strategy
    mine = manager.latest()
    record = None if mine is None else read_record(manager.store, manager.store.entry_of(mine.path))
    chief = _broadcast_json(strategy, context.is_chief, {"record": record} if context.is_chief else {})
    missing = int(_sum_over_workers(strategy, np.array([int(record != chief["record"])], np.int64))[0])
    if missing:
        raise ValueError(
            f"checkpoint_dir {str(manager.directory)!r}: {missing} worker(s) do not see the chief's "
            "newest checkpoint (hosts that share no disk?). Give make_or_restore_model a build_fn, "
            f"so the state comes from the chief, or {SHARED_STORAGE_HINT}."
        )


def state_variables(model: Any) -> list[Any]:
    """Every variable a restore sets: the model's (weights and random-generator states) and its
    optimizer's, each once, in an order every worker shares."""
    found: list[Any] = []
    seen: set[int] = set()
    optimizer = getattr(model, "optimizer", None)
    for variable in [*model.variables, *(optimizer.variables if optimizer is not None else [])]:
        if id(variable) not in seen:
            seen.add(id(variable))
            found.append(variable)
    return found


def _build_optimizer_quietly(model: Any) -> None:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        optimizer.build(model.trainable_variables)


def _state_bytes(variables: list[Any]) -> bytes:
    return b"".join(np.ascontiguousarray(np.asarray(v.numpy())).tobytes() for v in variables)


def _assign_state(variables: list[Any], state: bytes, manager: Any) -> None:
    arrays = [np.asarray(v.numpy()) for v in variables]
    if sum(a.nbytes for a in arrays) != len(state):
        raise ValueError(
            f"checkpoint_dir {str(manager.directory)!r}: the chief's model state has {len(state)} "
            f"bytes, this worker's model {sum(a.nbytes for a in arrays)}: build_fn built different "
            "models on different workers."
        )
    offset = 0
    for variable, array in zip(variables, arrays, strict=True):
        chunk = state[offset:offset + array.nbytes]
        variable.assign(np.frombuffer(chunk, dtype=array.dtype).reshape(array.shape))
        offset += array.nbytes


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()


def _broadcast_json(strategy: Any, is_chief: bool, value: dict[str, Any]) -> dict[str, Any]:
    (text,) = _broadcast_parts(strategy, is_chief, [_json(value) if is_chief else b""])
    return json.loads(text.decode())


def _broadcast_parts(strategy: Any, is_chief: bool, parts: list[bytes]) -> list[bytes]:
    """The chief's `parts` on every worker (the others pass as many, empty), in two
    collectives: their lengths, then their bytes."""
    lengths = _sum_over_workers(strategy, np.array([len(part) for part in parts], np.int64), contribute=is_chief)
    ends = np.cumsum(lengths)
    words = np.zeros((int(ends[-1]) + 7) // 8, np.int64)
    if is_chief:
        view = words.view(np.uint8)
        for part, end in zip(parts, ends, strict=True):
            view[end - len(part):end] = np.frombuffer(part, np.uint8)
    received = _sum_over_workers(strategy, words, contribute=is_chief).view(np.uint8)
    return [received[end - length:end].tobytes() for length, end in zip(lengths, ends, strict=True)]


def _sum_over_workers(strategy: Any, words: np.ndarray, contribute: bool = True) -> np.ndarray:
    """Sum of `words` over the workers that `contribute` (one replica each), on every worker."""
    calls = []

    def value_fn(ctx: Any) -> tf.Tensor:
        first_here = not calls
        calls.append(ctx.replica_id_in_sync_group)
        return tf.constant(words if (contribute and first_here) else np.zeros_like(words))

    per_replica = strategy.experimental_distribute_values_from_function(value_fn)
    return np.asarray(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None))
