"""What a restore put into a model (`Restored`: through which manager, which checkpoint, the
callbacks' state and the data's position it read), kept beside the model in a weak side table,
never set on the model itself. Keras's own way is two calls, `make_or_restore_model` then
`model.fit(callbacks=[checkpoint_callback(dir)])`: the second learns here what the first
restored (on a worker without a shared disk only the chief's broadcast can tell it)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from kerasdist.checkpoint.record import CheckpointInfo


@dataclass(frozen=True)
class Restored:
    """What a model was restored with: through which manager (a `CheckpointManager`), from which
    checkpoint (None: there was none), with which callbacks' state (`callbacks.npz`'s bytes, None
    if none) and which position of the data (`input.bin`'s bytes, None if none)."""

    manager: Any
    info: CheckpointInfo | None
    callbacks: bytes | None = None
    input: bytes | None = None


# model -> what was restored into it, for as long as the model lives
_RESTORED: weakref.WeakKeyDictionary[Any, Restored] = weakref.WeakKeyDictionary()


def note_restored(model: Any, restored: Restored) -> None:
    """`model` now holds what `restored` says (`CheckpointManager.note_restored`)."""
    _RESTORED[model] = restored


def restored_of(model: Any) -> Restored | None:
    """What `model` was restored with (`make_or_restore_model`, `CheckpointManager.restore`)."""
    return _RESTORED.get(model)


def manager_of(model: Any) -> Any:
    """The `CheckpointManager` `model` was made or restored by, or None."""
    restored = restored_of(model)
    return restored.manager if restored is not None else None
