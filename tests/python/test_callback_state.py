"""The user's callbacks resume as if never interrupted (checkpoint/callback_state.py): the rows of
tests/cases/callbacks.json against the same run uninterrupted, resuming with other callbacks, the
get_state/set_state protocol's errors, and canaries for the Keras attributes kerasdist keeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasdist
from conftest import case_rows, run_python
from kerasdist import compat
from kerasdist.checkpoint import manager as checkpoint_manager
from kerasdist.checkpoint.callback_state import KERAS_STATE, CallbackStates, pack, state_key, unpack
from kerasdist_testing.s3_test_server import start_s3_server

SCRIPT = Path(__file__).parent / "scripts" / "train_callbacks.py"
PYTHON_ROWS = [row for row in case_rows("callbacks") if "python" in row.values[0]["languages"]]


def run_script(trainer: str, run_dir: Path, *fault: str,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    run_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, str(SCRIPT), trainer, str(run_dir), *fault], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})


def reference(made_once, trainer: str) -> Path:
    """The run never interrupted, made once per session."""
    def make(folder: Path) -> Path:
        done = run_script(trainer, folder)
        assert done.returncode == 0, done.stderr[-3000:]
        return folder

    return made_once(f"callbacks-{trainer.replace('.', '_')}", make)


def weights_of(path: Path) -> list[np.ndarray]:
    with np.load(path) as saved:
        return [saved[name] for name in saved.files]


def model_weights(path: Path) -> list[np.ndarray]:
    return keras.models.load_model(path, compile=False).get_weights()


def tensorboard_records(log_dir: Path) -> dict[tuple[str, str, int], float]:
    """Every scalar Keras's TensorBoard wrote, as TensorBoard shows it: per (folder, tag, step) the
    last value written (a step trained again after a failure writes the same value again).
    kerasdist's own figures (`kerasdist/`: step time, goodput) are timings, not compared."""
    records = {}
    for events in sorted(log_dir.rglob("events.out.tfevents.*"), key=lambda p: (p.stat().st_mtime_ns, p.name)):
        if events.parent.name == "kerasdist":
            continue
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "scalars":
                    records[(events.parent.name, value.tag, event.step)] = float(tf.make_ndarray(value.tensor))
    return records


def outcome(run_dir: Path, local_checkpoints: bool = True) -> dict:
    found = {
        "result": json.loads((run_dir / "result.json").read_text()),
        "weights": weights_of(run_dir / "weights.npz"),
        "best file": model_weights(run_dir / "best.keras"),
        "csv": (run_dir / "history.csv").read_text(),
        "tensorboard": tensorboard_records(run_dir / "logs"),
    }
    if local_checkpoints:  # the trained weights, before EarlyStopping put the best ones back
        latest = kerasdist.latest_checkpoint(run_dir / "ckpt")
        found["newest checkpoint"] = model_weights(Path(latest.path) / "model.keras")
    return found


def assert_same_run(resumed: dict, whole: dict) -> None:
    for name in whole:
        np.testing.assert_equal(resumed[name], whole[name], err_msg=name)


def fault_args(row: dict) -> list[str]:
    return [f"--{row['fault'].replace('_', '-')}", str(row["at"])]


@pytest.mark.parametrize("row", PYTHON_ROWS)
def test_a_run_failed_and_run_again_ends_as_the_run_never_interrupted_callbacks_included(row, tmp_path, made_once):
    whole = outcome(reference(made_once, row["trainer"]))
    assert whole["result"]["steps"] == 80 and whole["result"]["stopped_epoch"] == 3  # EarlyStopping's stop
    assert whole["result"]["learning_rate"] == pytest.approx(0.01 / 8)  # three plateaus
    failed = run_script(row["trainer"], tmp_path, *fault_args(row))
    assert failed.returncode in (row["exit"], -9 if row["exit"] == 137 else row["exit"]), failed.stderr[-3000:]
    assert not (tmp_path / "result.json").exists()
    resumed = run_script(row["trainer"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "start fresh" not in resumed.stderr and "other callbacks" not in resumed.stderr, resumed.stderr[-2000:]
    assert_same_run(outcome(tmp_path), whole)


def test_callback_state_on_an_object_store_resumes_the_same(tmp_path, made_once, s3):
    """The same with the checkpoints on S3 (the SeaweedFS test server): callbacks.npz goes up and
    comes back with the checkpoint."""
    url = f"s3://{s3.make_bucket()}/run"
    whole = outcome(reference(made_once, "distributed_fit"), local_checkpoints=False)
    failed = run_script("distributed_fit", tmp_path, "--kill-at-step", "58", "--checkpoint-dir", url,
                        env=s3.environment())
    assert failed.returncode in (137, -9), failed.stderr[-3000:]
    resumed = run_script("distributed_fit", tmp_path, "--checkpoint-dir", url, env=s3.environment())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(outcome(tmp_path, local_checkpoints=False), whole)


@pytest.fixture(scope="module")
def s3():
    server = start_s3_server()
    try:
        yield server
    finally:
        server.stop()


# -- in one process ------------------------------------------------------------------------------

class Counter(keras.callbacks.Callback):
    def __init__(self, state_key=None):
        super().__init__()
        self.batches = 0
        if state_key:
            self.state_key = state_key

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def get_state(self):
        return {"batches": self.batches}

    def set_state(self, state):
        self.batches = state["batches"]


def small_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def small_data(epochs=None):
    x = np.arange(48, dtype="float32").reshape(16, 3) / 48
    return kerasdist.make_dataset(x, x.sum(1), batch_size=4, seed=1, shuffle=False, epochs=epochs)


def fit(directory, callbacks, epochs, **kwargs):
    model = kerasdist.make_or_restore_model(directory, small_model)
    return kerasdist.resume_fit(model, small_data(), epochs, kerasdist.checkpoint_callback(directory, **kwargs),
                                callbacks=callbacks, verbose=0)


@pytest.mark.parametrize("where", ["local", "memory"])
@pytest.mark.parametrize("async_save", [True, False], ids=["background", "sync"])
def test_resuming_with_other_callbacks_restores_what_matches_and_warns_once_naming_the_rest(tmp_path, where,
                                                                                          async_save):
    directory = str(tmp_path / "ckpt") if where == "local" else f"memory://callbacks-{tmp_path.name}-{async_save}"
    first = [Counter(), keras.callbacks.EarlyStopping(monitor="loss", patience=5), Counter(state_key="second")]
    fit(directory, first, 2, async_save=async_save)
    assert [c.batches for c in (first[0], first[2])] == [8, 8]
    # the same callbacks in another order, one removed, one added, one with another monitor
    again = [Counter(state_key="second"), keras.callbacks.EarlyStopping(monitor="val_loss"),
             keras.callbacks.ReduceLROnPlateau(monitor="loss"), Counter()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(directory, again, 3, async_save=async_save)
    said = [str(w.message) for w in caught if issubclass(w.category, kerasdist.CheckpointWarning)]
    assert len(said) == 1, said
    assert "EarlyStopping(monitor=val_loss, mode=auto)" in said[0] and "ReduceLROnPlateau(monitor=loss" in said[0]
    assert "EarlyStopping(monitor=loss, mode=auto)" in said[0]  # saved, not used
    assert "Counter" not in said[0].split("not used")[0].split("fresh")[1]  # both counters matched
    assert [again[0].batches, again[3].batches] == [12, 12]  # 8 restored + 4 trained


@pytest.mark.parametrize("where", ["local", "memory"])
def test_a_store_gives_the_kept_callbacks_state_alike_to_a_restore_and_to_a_listing(tmp_path, where):
    """The callbacks' state a checkpoint kept reaches a model the same way whether the restore read it
    (its verified copy) or `callback_state` reads it from the store (a model that was not restored);
    a checkpoint that kept none gives None both ways."""
    directory = str(tmp_path / "ckpt") if where == "local" else f"memory://kept-callbacks-{tmp_path.name}"
    manager = kerasdist.CheckpointManager(directory)
    for callbacks, epochs in (([], 1), ([Counter()], 2)):
        fit(directory, callbacks, epochs)
        latest = manager.latest()
        kept = manager.store.read(manager.store.entry_of(latest.path), "callbacks.npz") if callbacks else None
        restored = kerasdist.make_or_restore_model(directory, small_model)
        assert checkpoint_manager.restored_of(restored).callbacks == kept
        listed = small_model()
        listed.optimizer.build(listed.trainable_variables)
        listed.optimizer.iterations.assign(latest.global_step)
        assert manager.callback_state(listed) == (latest, kept)


def test_a_state_that_cannot_be_kept_is_refused_before_training_naming_the_callback(tmp_path):
    class Bad(Counter):
        def get_state(self):
            return {"model": self.model}

    model = kerasdist.make_or_restore_model(tmp_path / "ckpt", small_model)
    with pytest.raises(ValueError, match=r"Bad/state/model is a Sequential: a callback's state must be JSON values"):
        kerasdist.resume_fit(model, small_data(), 1, callbacks=[Bad()], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0 and kerasdist.latest_checkpoint(tmp_path / "ckpt") is None


def test_a_callback_after_the_checkpoint_callback_in_plain_fit_is_warned_of(tmp_path):
    model = kerasdist.make_or_restore_model(tmp_path / "ckpt", small_model)
    with pytest.warns(kerasdist.CheckpointWarning, match="EarlyStopping come after the kerasdist checkpoint callback"):
        model.fit(small_data(epochs=1), epochs=1, verbose=0,
                  callbacks=[kerasdist.checkpoint_callback(tmp_path / "ckpt"), keras.callbacks.EarlyStopping()])


def test_a_function_of_the_epoch_keeps_the_run_record(tmp_path):
    x = np.arange(48, dtype="float32").reshape(16, 3)
    model = kerasdist.make_or_restore_model(tmp_path / "ckpt", small_model)

    def data(epoch):
        return kerasdist.make_dataset(x, x.sum(1), batch_size=4, seed=1, initial_epoch=epoch, epochs=epoch + 1)

    kerasdist.resume_fit(model, data, 1, verbose=0)
    latest = kerasdist.latest_checkpoint(tmp_path / "ckpt")
    assert latest.global_batch_size == 4 and latest.epoch_order is not None


def test_state_keys_tell_callbacks_apart_by_kind_and_arguments():
    assert state_key(keras.callbacks.EarlyStopping(monitor="loss")) == "EarlyStopping(monitor=loss, mode=auto)"
    assert state_key(keras.callbacks.TensorBoard("/runs/a/logs")) == "TensorBoard(log_dir=logs)"
    assert state_key(keras.callbacks.ModelCheckpoint("out/best.keras", monitor="val_loss")) == \
        "ModelCheckpoint(monitor=val_loss, filepath=best.keras)"
    assert state_key(Counter(state_key="mine")) == "Counter(mine)"
    states = CallbackStates([Counter(), Counter(), keras.callbacks.History(), keras.callbacks.TerminateOnNaN()])
    assert list(states.callbacks) == ["Counter", "Counter#2"]
    tree = {"a": [np.arange(3), {"b": 1.5, "c": None}], "d": "text"}
    back = unpack(pack(tree))
    np.testing.assert_array_equal(back["a"][0], np.arange(3))
    assert back["a"][1] == {"b": 1.5, "c": None} and back["d"] == "text"


# -- canaries: what kerasdist keeps of Keras's callbacks ------------------------------------------

def test_canary_keras_callbacks_keep_state_in_the_attributes_kerasdist_saves_and_reset_it_each_fit(tmp_path):
    """Fails when Keras renames one of the attributes `KERAS_STATE` names (the state would silently
    not be kept), or stops resetting them in on_train_begin (Keras would then keep state itself)."""
    made = {keras.callbacks.EarlyStopping: lambda: keras.callbacks.EarlyStopping(),
            keras.callbacks.ReduceLROnPlateau: lambda: keras.callbacks.ReduceLROnPlateau(),
            keras.callbacks.ModelCheckpoint: lambda: keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras")),
            keras.callbacks.TensorBoard: lambda: keras.callbacks.TensorBoard(str(tmp_path / "logs")),
            keras.callbacks.CSVLogger: lambda: keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))}
    assert set(made) == set(KERAS_STATE)
    reset_on_train_begin = {keras.callbacks.EarlyStopping: ("wait", "best"),
                            keras.callbacks.ReduceLROnPlateau: ("wait", "cooldown_counter"),
                            keras.callbacks.TensorBoard: ("_global_train_batch",)}
    for kind, make in made.items():
        callback = make()
        callback.set_model(small_model())
        callback.on_train_begin()
        for name in KERAS_STATE[kind].attributes:
            assert hasattr(callback, name), f"{kind.__name__}.{name} is gone in Keras {keras.__version__}"
        for name in reset_on_train_begin.get(kind, ()):
            setattr(callback, name, 7)
            callback.on_train_begin()
            assert getattr(callback, name) != 7, f"{kind.__name__}.on_train_begin no longer resets {name}"
        callback.on_train_end()
    assert hasattr(keras.callbacks.TensorBoard(str(tmp_path / "logs")), "_writers")


def test_canary_a_callback_finds_the_callback_list_calling_it():
    found = []

    class Finder(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            found.append(compat.calling_callback_list())

    finder = Finder()
    small_model().fit(np.zeros((4, 3)), np.zeros(4), verbose=0, callbacks=[finder])
    assert isinstance(found[0], keras.callbacks.CallbackList) and finder in found[0].callbacks


def test_the_epoch_a_run_resumes_in_logs_the_whole_epochs_means_under_two_replicas():
    """A mid-epoch checkpoint keeps the epoch's running means (each replica's metric variables):
    the resumed epoch's loss and metric, in the history and to the callbacks, are those of the run
    never interrupted, bit for bit (they covered only the batches after the resume before)."""
    done = run_python("""
        import tempfile
        import keras, numpy as np, tensorflow as tf
        import kerasdist
        kerasdist.simulate_devices(2)
        tf.config.experimental.enable_op_determinism()

        class StopAt(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if int(self.model.optimizer.iterations.numpy()) == 11:
                    self.model.stop_training = True

        def build():
            keras.utils.set_random_seed(3)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                      keras.layers.Dense(1)])
            model.compile(optimizer="adam", loss="mse", metrics=["mae"])
            return model

        x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
        args = dict(epochs=3, strategy="mirrored", batch_size=32, seed=1, every_steps=3, verbose=0)
        whole = kerasdist.distributed_fit(build, x, x.sum(1), checkpoint_dir=tempfile.mkdtemp(), **args)
        ckpt = tempfile.mkdtemp()
        kerasdist.distributed_fit(build, x, x.sum(1), checkpoint_dir=ckpt, callbacks=[StopAt()], **args)
        latest = kerasdist.latest_checkpoint(ckpt)
        assert (latest.epoch, latest.step_in_epoch) == (1, 3), latest
        resumed = kerasdist.distributed_fit(build, x, x.sum(1), checkpoint_dir=ckpt, **args)
        assert resumed.model.distribute_strategy.num_replicas_in_sync == 2
        assert resumed.history == whole.history, (resumed.history, whole.history)
        print("OK")
    """)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]
