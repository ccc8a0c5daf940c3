"""Multi-worker restores when the hosts share no disk: the chief's checkpoint wins.

Under MultiWorkerMirroredStrategy every worker must start from the same weights and the same
resume point, or the first collective fails ("The following tasks are unhealthy", "Collective
instance ... expected type 1 but got type 0") or, worse, the workers train apart. Only the chief
is sure to see the checkpoints (it is the one that writes them); a worker on another host may see
none (node-local scratch, a pod's own disk), an older copy, or a directory of its own.

So under multi-worker only the chief reads checkpoints: it restores its newest valid one as on a
single host, then sends every worker (1) the checkpoint's record, the resume point and history,
or the error it met, and (2) the restored state, the bytes of every variable (weights, optimizer
slots and counters, random-generator states). Both travel as one all-reduce sum of int64 words
to which only the chief contributes: adding zeros to integers is exact, so each worker receives
the chief's bytes bit for bit. Workers therefore never restore from checkpoint files. They may
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

from kerasdist.checkpoint.record import CheckpointInfo, read_record

SHARED_STORAGE_HINT = (
    "put checkpoint_dir on storage every worker reads (a shared filesystem, or an object store URL "
    "such as s3://bucket/run)"
)


def restore_from_chief(manager: Any, model: Any, context: Any) -> CheckpointInfo | None:
    """On every worker of a multi-worker `context`: the chief restores `manager`'s newest valid
    checkpoint into `model`, the others receive its state and resume point. Returns the
    checkpoint restored (the chief's), or None when there is none."""
    strategy = context.strategy
    _build_optimizer_quietly(model)  # its variables are made by collectives: on every worker alike
    header: dict[str, Any] = {}
    chief_callbacks: bytes | None = None  # what the chief restored of the other callbacks
    if context.is_chief:
        try:
            info = manager.restore(model)
            restored = manager.callback_state(model, read=False)
            chief_callbacks = restored[1] if restored is not None else None
            header = {"checkpoint": None if info is None else dataclasses.asdict(info),
                      "callbacks": chief_callbacks is not None}
        except Exception as err:
            _broadcast_json(strategy, True, {"error": f"{type(err).__name__}: {err}"})
            raise
    header = _broadcast_json(strategy, context.is_chief, header)
    if "error" in header:
        raise ValueError(
            f"The chief could not restore checkpoint_dir {str(manager.directory)!r}, so no worker "
            f"starts: {header['error']}"
        )
    if header["checkpoint"] is None:
        return None
    variables = state_variables(model)
    state = _broadcast_bytes(strategy, context.is_chief, _state_bytes(variables) if context.is_chief else b"")
    callbacks = None
    if header["callbacks"]:  # the other callbacks' state, as the chief read it
        callbacks = _broadcast_bytes(strategy, context.is_chief, chief_callbacks or b"")
    if context.is_chief:
        return manager.resume_point(model)
    _assign_state(variables, state, manager)
    info = CheckpointInfo(**header["checkpoint"])
    manager.note_restored(model, info, callbacks)
    return info


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


def _broadcast_json(strategy: Any, is_chief: bool, value: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(value).encode() if is_chief else b""
    return json.loads(_broadcast_bytes(strategy, is_chief, text).decode())


def _broadcast_bytes(strategy: Any, is_chief: bool, payload: bytes) -> bytes:
    """The chief's `payload` on every worker (the others pass b"")."""
    length = int(_sum_over_workers(strategy, np.array([len(payload)], np.int64), contribute=is_chief)[0])
    words = np.zeros((length + 7) // 8, np.int64)
    if is_chief:
        words.view(np.uint8)[:length] = np.frombuffer(payload, np.uint8)
    received = _sum_over_workers(strategy, words, contribute=is_chief)
    return received.view(np.uint8)[:length].tobytes()


def _sum_over_workers(strategy: Any, words: np.ndarray, contribute: bool = True) -> np.ndarray:
    """Sum of `words` over the workers that `contribute` (one replica each), on every worker."""
    calls = []

    def value_fn(ctx: Any) -> tf.Tensor:
        first_here = not calls
        calls.append(ctx.replica_id_in_sync_group)
        return tf.constant(words if (contribute and first_here) else np.zeros_like(words))

    per_replica = strategy.experimental_distribute_values_from_function(value_fn)
    return np.asarray(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None))
