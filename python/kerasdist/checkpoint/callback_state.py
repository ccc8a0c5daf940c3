"""The state of the user's Keras callbacks, kept in every checkpoint so a resumed run's callbacks
go on as if never interrupted (Lightning's `Callback.state_dict()`; Keras's own BackupAndRestore
keeps none: tf-keras#430).

Keras's stateful callbacks keep their state in attributes that `on_train_begin` resets
(EarlyStopping's patience counter, ReduceLROnPlateau's, ModelCheckpoint's best, TensorBoard's
step counters): `KERAS_STATE` names them, per class, for the Keras version installed (a canary
test checks them). Any other callback opts in with two methods:

```python
class Counter(keras.callbacks.Callback):
    def get_state(self):          # JSON values and NumPy arrays, nested in dicts and lists
        return {"batches": self.batches}
    def set_state(self, state):   # called before the first batch of a resumed run
        self.batches = state["batches"]
```

Each callback's state is stored under a key made from its class and the arguments that tell two
of a kind apart (a monitor, a file's name), so a resume with other callbacks restores what still
matches, warns once naming the rest, and never puts state into a callback of another kind.

A mid-epoch checkpoint also keeps the running means of the epoch in progress (the model's metric
variables, which Keras resets at each epoch's start), so the epoch a run resumes in logs the same
loss to the callbacks, the history, CSV and TensorBoard as if never interrupted. It all travels as
one file, `callbacks.npz` (`pack`: the arrays, and the rest as JSON).
"""

from __future__ import annotations

import io
import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from kerasdist import compat
from kerasdist.checkpoint.record import CheckpointWarning

_TREE = "__tree__"  # the JSON part in callbacks.npz; arrays are a0, a1, ...
_ARRAY = "__ndarray__"


@dataclass(frozen=True)
class KerasState:
    """What a checkpoint keeps of one Keras callback class: `attributes` (restored as they were),
    `key` (the arguments telling two callbacks of the class apart; a path counts by its last
    part, as on other workers it is a temporary folder's)."""

    attributes: tuple[str, ...]
    key: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()


# Checked against Keras 3.15's sources (tests/python/test_callback_state.py fails when one changes).
KERAS_STATE: dict[type, KerasState] = {
    keras.callbacks.EarlyStopping: KerasState(
        ("wait", "stopped_epoch", "best", "best_epoch", "best_weights"), key=("monitor", "mode")),
    keras.callbacks.ReduceLROnPlateau: KerasState(("wait", "cooldown_counter", "best"), key=("monitor", "mode")),
    keras.callbacks.ModelCheckpoint: KerasState(
        ("best", *compat.MODEL_CHECKPOINT_COUNTERS), key=("monitor",), paths=("filepath",)),
    keras.callbacks.TensorBoard: KerasState(compat.TENSORBOARD_COUNTERS, paths=("log_dir",)),
    keras.callbacks.CSVLogger: KerasState(("keys",), paths=("filename",)),
}
# Keras callbacks whose behaviour depends on nothing but their arguments and the model's state
# (the learning rate is the optimizer's, in the checkpoint already).
STATELESS = (keras.callbacks.History, keras.callbacks.ProgbarLogger, keras.callbacks.LearningRateScheduler,
             keras.callbacks.TerminateOnNaN, keras.callbacks.LambdaCallback, keras.callbacks.RemoteMonitor)


def has_state(callback: Any) -> bool:
    """Whether a checkpoint keeps `callback`'s state: a Keras callback of `KERAS_STATE`, or one
    with `get_state` and `set_state`."""
    return _keras_state(callback) is not None or _user_protocol(callback)


def _keras_state(callback: Any) -> KerasState | None:
    for kind in type(callback).__mro__:
        if kind in KERAS_STATE:
            return KERAS_STATE[kind]
    return None


def _user_protocol(callback: Any) -> bool:
    return callable(getattr(callback, "get_state", None)) and callable(getattr(callback, "set_state", None))


def state_key(callback: Any) -> str:
    """The name a callback's state is kept under: its class and distinguishing arguments, e.g.
    `EarlyStopping(monitor=loss, mode=auto)`, `TensorBoard(log_dir=logs)`; a user's callback may
    give its own with a `state_key` attribute."""
    kind = type(callback).__name__
    own = getattr(callback, "state_key", None)
    if isinstance(own, str) and own:
        return f"{kind}({own})"
    known = _keras_state(callback)
    if known is None or _user_protocol(callback):
        return kind
    fields = [f"{name}={getattr(callback, name, None)}" for name in known.key]
    fields += [f"{name}={_last_part(getattr(callback, name, ''))}" for name in known.paths]
    return f"{kind}({', '.join(fields)})"


def _last_part(path: Any) -> str:
    return os.path.basename(os.path.normpath(os.fspath(path))) if path else ""


class CallbackStates:
    """The stateful callbacks beside a checkpoint callback in one `fit`: their state taken for a
    checkpoint (`states`), and given back when a run resumes (`restore`)."""

    def __init__(self, callbacks: Iterable[Any] = ()):
        self.callbacks: dict[str, Any] = {}
        for callback in callbacks:
            if has_state(callback) and not isinstance(callback, STATELESS):
                key, count = state_key(callback), 2
                unique = key
                while unique in self.callbacks:
                    unique, count = f"{key}#{count}", count + 1
                self.callbacks[unique] = callback

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def check(self) -> None:
        """Take every state once, so a `get_state` that returns what cannot be kept fails before
        training, naming the callback."""
        pack(self.states())

    def states(self) -> dict[str, Any]:
        """Each callback's state by its key: {"class": its class's name, "state": ...}."""
        taken = {}
        for key, callback in self.callbacks.items():
            try:
                state = _state_of(callback)
            except Exception as err:
                raise ValueError(f"callback {key}: get_state() failed: {type(err).__name__}: {err}") from err
            taken[key] = {"class": type(callback).__name__, "state": state}
        return taken

    def restore(self, saved: dict[str, Any], where: str) -> None:
        """Give each callback the state `saved` (from `states`) holds under its key; warn once,
        naming the callbacks that start fresh and the states left unused (`where`: the
        checkpoint, for the message)."""
        fresh = [key for key in self.callbacks if key not in saved]
        unused = [key for key in saved if key not in self.callbacks]
        for key, callback in self.callbacks.items():
            if key not in saved:
                continue
            if saved[key]["class"] != type(callback).__name__:
                fresh.append(key)
                continue
            try:
                _set_state(callback, saved[key]["state"])
            except Exception as err:  # noqa: BLE001 - a user's set_state must not fail the resume
                fresh.append(f"{key} (set_state failed: {type(err).__name__}: {err})")
        if fresh or unused:
            warnings.warn(_mismatch_message(where, fresh, unused), CheckpointWarning, stacklevel=3)

    def flush(self) -> None:
        """Make what the callbacks wrote so far durable: TensorBoard's queued events (its writer
        flushes every 2 minutes otherwise, so a kill loses them while the checkpoint says they
        were written)."""
        for callback in self.callbacks.values():
            if isinstance(callback, keras.callbacks.TensorBoard):
                for writer in compat.tensorboard_writers(callback):
                    writer.flush()

    def before_continued_end(self) -> None:
        """The fit ends only for kerasdist to start the next one at once (the rest of a resumed
        epoch, then the other epochs): EarlyStopping's best weights are not put back into the
        model there, as a run that never stopped would not (its state is restored in the next fit)."""
        for callback in self.callbacks.values():
            if isinstance(callback, keras.callbacks.EarlyStopping):
                callback.best_weights = None


def pack(tree: dict[str, Any]) -> bytes:
    """`tree` (JSON values and NumPy arrays, in dicts and lists) as the bytes of `callbacks.npz`."""
    arrays: list[np.ndarray] = []
    text = json.dumps({name: _to_tree(value, arrays, name) for name, value in tree.items()}).encode()
    buffer = io.BytesIO()
    np.savez(buffer, **{_TREE: np.frombuffer(text, np.uint8)}, **{f"a{i}": a for i, a in enumerate(arrays)})
    return buffer.getvalue()


def unpack(blob: bytes) -> dict[str, Any]:
    """The tree `pack` made."""
    with np.load(io.BytesIO(blob), allow_pickle=False) as saved:
        arrays = {name: saved[name] for name in saved.files}
    return _from_tree(json.loads(arrays.pop(_TREE).tobytes().decode()), arrays)


def running_metrics(model: Any) -> list[list[np.ndarray]]:
    """The model's metric variables now (totals and counts of the epoch's running means), each as
    its replicas' values: read one by one, with no collective (only the chief saves)."""
    return [[np.array(part.numpy()) for part in compat.replica_variables(variable)]
            for variable in model.metrics_variables]


def set_running_metrics(model: Any, values: list[list[np.ndarray]]) -> None:
    """Put `running_metrics`' values back, after Keras reset them at the epoch's start; a model
    compiled with other metrics, or run over other replicas, starts the epoch's means over."""
    variables = model.metrics_variables
    if [len(parts) for parts in values] != [len(compat.replica_variables(variable)) for variable in variables]:
        return
    for variable, parts in zip(variables, values, strict=True):
        for replica, value in zip(compat.replica_variables(variable), parts, strict=True):
            replica.assign(value)


def _state_of(callback: Any) -> Any:
    if _user_protocol(callback):
        return callback.get_state()
    known = _keras_state(callback)
    assert known is not None
    state = {name: getattr(callback, name, None) for name in known.attributes}
    if isinstance(callback, keras.callbacks.CSVLogger):
        state["rows"] = _file_text(callback.filename)
    return state


def _set_state(callback: Any, state: Any) -> None:
    if _user_protocol(callback):
        callback.set_state(state)
        return
    known = _keras_state(callback)
    assert known is not None
    for name in known.attributes:
        if name in state:
            setattr(callback, name, state[name])
    if isinstance(callback, keras.callbacks.CSVLogger):
        _reopen_csv(callback, state.get("rows"))


def _file_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except OSError:
        return None


def _reopen_csv(callback: Any, rows: str | None) -> None:
    """The CSV file as it was at the checkpoint (its rows of epochs trained again are dropped),
    open for appending with no second header."""
    if rows is None:
        return
    if callback.csv_file is not None and not callback.csv_file.closed:
        callback.csv_file.close()
    with open(callback.filename, "w", encoding="utf-8") as file:
        file.write(rows)
    callback.csv_file = open(callback.filename, "a", encoding="utf-8")  # noqa: SIM115 - CSVLogger closes it
    callback.append_header = not rows
    callback.writer = None


def _to_tree(value: Any, arrays: list[np.ndarray], where: str) -> Any:
    """`value` as JSON with its arrays moved to `arrays` (`{"__ndarray__": index}` in their place);
    `where` names it in errors."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if not all(isinstance(name, str) for name in value):
            raise ValueError(f"{where}: a dict whose keys are not all strings cannot be kept in a checkpoint.")
        return {name: _to_tree(item, arrays, f"{where}/{name}") for name, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_tree(item, arrays, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, np.ndarray) or hasattr(value, "__array__"):
        arrays.append(np.array(value))
        return {_ARRAY: len(arrays) - 1}
    raise ValueError(
        f"{where} is a {type(value).__name__}: a callback's state must be JSON values (numbers, strings, "
        "booleans, None) and NumPy arrays, in dicts and lists (get_state() returns it)."
    )


def _from_tree(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, dict):
        if set(value) == {_ARRAY}:
            return arrays[f"a{value[_ARRAY]}"]
        return {name: _from_tree(item, arrays) for name, item in value.items()}
    if isinstance(value, list):
        return [_from_tree(item, arrays) for item in value]
    return value


def _mismatch_message(where: str, fresh: list[str], unused: list[str]) -> str:
    parts = []
    if fresh:
        parts.append(f"these callbacks start fresh (no state of theirs there): {', '.join(fresh)}")
    if unused:
        parts.append(f"these saved states match no callback of this run and are not used: {', '.join(unused)}")
    return f"Resuming from {where} with other callbacks than it was saved with: " + "; ".join(parts) + "."

