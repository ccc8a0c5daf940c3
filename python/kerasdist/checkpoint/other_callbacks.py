"""The checkpoint callback's hold on the other callbacks of a fit: which have state
(`callback_state.py`), what they resume with (the state carried from the trainer's previous fit,
else the checkpoint of the model's step), given back before the first batch, and what each
checkpoint keeps of them (and, mid-epoch, of the epoch's running means)."""

from __future__ import annotations

import warnings
from typing import Any

from kerasdist import compat
from kerasdist.checkpoint.callback_state import (
    CallbackStates,
    has_state,
    pack,
    running_metrics,
    set_running_metrics,
    unpack,
)
from kerasdist.checkpoint.model_state import optimizer_step
from kerasdist.checkpoint.record import CheckpointWarning


class OtherCallbacks:
    """The other callbacks of the fit the checkpoint callback runs in, and their state."""

    def __init__(self) -> None:
        self.states = CallbackStates()
        self._to_restore: tuple[str, dict[str, Any]] | None = None  # (from where, what)
        self._carried: tuple[int, bytes] | None = None  # (step, packed state) at the last fit's end

    def find(self, checkpoint_callback: Any, kind: type, model: Any, manager: Any, is_chief: bool) -> None:
        """At a fit's begin: the callbacks of this fit that have state (not `checkpoint_callback`
        nor another of its `kind`), and the state they resume with: the one carried from the end
        of the last fit when the model has not trained since (a trainer's next fit), else the
        checkpoint of the model's step, if any (on the chief, or as the chief's restore sent it
        to the others)."""
        callback_list = compat.calling_callback_list()
        others = [c for c in (callback_list.callbacks if callback_list is not None else [])
                  if c is not checkpoint_callback and not isinstance(c, kind)]
        self.states = CallbackStates(others)
        self.states.check()
        _warn_if_after(others, callback_list.callbacks.index(checkpoint_callback) if callback_list is not None else 0)
        self._to_restore = None
        step = optimizer_step(model)
        if self._carried is not None and self._carried[0] == step:
            self._to_restore = ("the previous fit", unpack(self._carried[1]))
        elif step > 0:
            found = manager.callback_state(model, read=is_chief)
            if found is not None:
                self._to_restore = (found[0].path, unpack(found[1]) if found[1] is not None else {})
        self._carried = None

    def restore(self, model: Any, mid_epoch: bool) -> None:
        """At the fit's first epoch begin (every callback's on_train_begin has reset it by now):
        give back the state found, and mid-epoch the running means Keras has just reset."""
        if self._to_restore is None:
            return
        where, saved = self._to_restore
        self._to_restore = None
        if self.states or saved.get("callbacks"):
            self.states.restore(saved.get("callbacks", {}), where)
        if mid_epoch and saved.get("running_metrics") is not None:
            set_running_metrics(model, saved["running_metrics"])

    def checkpointed(self, model: Any, mid_epoch: bool, one_worker: bool) -> bytes | None:
        """What a checkpoint keeps of the fit besides the model: the callbacks' state (what they
        wrote made durable first) and, mid-epoch, the epoch's running means."""
        self.states.flush()
        state: dict[str, Any] = {"callbacks": self.states.states()} if self.states else {}
        if mid_epoch and one_worker:  # a worker's metrics are its own: the chief's would not do for the others
            state["running_metrics"] = running_metrics(model)
        return pack(state) if state else None

    def carry_into_next_fit(self, model: Any) -> None:
        """At an epoch end after which the trainer starts its next fit at once: the state goes on."""
        self._carried = (optimizer_step(model), pack({"callbacks": self.states.states()}))
        self.states.before_continued_end()

    def carry_at_fit_end(self, model: Any) -> None:
        """At the fit's end: the state the next fit resumes with, unless carried at this step already."""
        step = optimizer_step(model)
        if self._carried is None or self._carried[0] != step:
            self._carried = (step, pack({"callbacks": self.states.states()}))


def _warn_if_after(others: list[Any], position: int) -> None:
    """Callbacks with state after the checkpoint callback (`position` in the fit's list) run
    their epoch end after its save, so an epoch-end checkpoint would keep their state from before
    that epoch."""
    late = [type(c).__name__ for c in others[position:] if has_state(c)]
    if late:
        warnings.warn(
            f"callbacks {', '.join(late)} come after the kerasdist checkpoint callback: a checkpoint at an "
            "epoch's end would keep their state from before that epoch. Put checkpoint_callback(...) last.",
            CheckpointWarning, stacklevel=4,
        )
