"""distributed_fit, the R-function guardrail, the bundled digits and the demo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasdist
from conftest import run_python
from kerasdist.training.distributed import check_step_functions
from kerasdist.training.resume_point import ResumePoint, Segment, segments_from


def digits(n: int = 256):
    x, y = kerasdist.load_digits(flatten=True)
    return x[:n], y[:n]


def build_model():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_load_digits_shapes_labels_and_range():
    x, y = kerasdist.load_digits()
    assert x.shape == (1797, 8, 8, 1) and x.dtype == np.float32
    assert y.shape == (1797,) and y.dtype == np.int32
    assert 0.0 == x.min() and x.max() == 1.0
    assert np.bincount(y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    flat, y2 = kerasdist.load_digits(flatten=True)
    assert flat.shape == (1797, 64) and np.array_equal(flat.reshape(-1, 8, 8, 1), x)
    assert np.array_equal(y, y2)
    with pytest.raises(ValueError, match="flatten"):
        kerasdist.load_digits(flatten="yes")


def test_distributed_fit_trains_then_resumes_to_the_total(tmp_path):
    x, y = digits()
    seen = []
    logger = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(epoch))
    args = dict(checkpoint_dir=tmp_path / "ckpt", strategy="default", batch_size=64, seed=3,
                validation_split=0.25, every_steps=2, verbose=0)
    first = kerasdist.distributed_fit(build_model, x, y, epochs=1, callbacks=[logger], **args)
    assert first.epoch == [0] and set(first.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert int(first.model.optimizer.iterations.numpy()) == 3  # 192 training rows / 64
    second = kerasdist.distributed_fit(build_model, x, y, epochs=2, callbacks=[logger],
                                       **{**args, "validation_split": None, "validation_data": (x[-64:], y[-64:])})
    assert second.epoch == [0, 1] and len(second.history["loss"]) == 2
    assert second.history["loss"][0] == first.history["loss"][0]  # epoch 1 comes from the checkpoint
    assert int(second.model.optimizer.iterations.numpy()) == 3 + 4  # continued, not restarted
    assert seen == [0, 1]
    assert kerasdist.latest_checkpoint(tmp_path / "ckpt").epoch == 2
    again = kerasdist.distributed_fit(build_model, x, y, epochs=2, **args)  # already done: no training
    assert again.epoch == [0, 1] and int(again.model.optimizer.iterations.numpy()) == 7


def test_distributed_fit_feeds_all_epochs_from_one_pipeline_in_the_per_epoch_order(tmp_path, monkeypatch):
    x, y = digits()
    calls = []

    def counting_replace_epochs(planned, **kwargs):
        calls.append((kwargs["initial_epoch"], kwargs["epochs"]))
        return kerasdist.data.replace_epochs(planned, **kwargs)

    monkeypatch.setattr(kerasdist.training.distributed, "replace_epochs", counting_replace_epochs)
    keras.utils.set_random_seed(5)
    ours = kerasdist.distributed_fit(build_model, x, y, epochs=4, checkpoint_dir=tmp_path / "ckpt",
                                     strategy="default", batch_size=64, seed=2, verbose=0)
    assert calls == [(0, 4)]  # planned once, then one stream built: one copy of the data, not one an epoch

    keras.utils.set_random_seed(5)
    model = build_model()
    per_epoch = lambda epoch: kerasdist.make_dataset(x, y, batch_size=64, seed=2, initial_epoch=epoch,  # noqa: E731
                                                     epochs=epoch + 1)
    kerasdist.resume_fit(model, per_epoch, 4, tmp_path / "reference", verbose=0)
    for a, b in zip(ours.model.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_distributed_fit_takes_a_strategy_object_and_early_stopping(tmp_path):
    x, y = digits(128)
    strategy = kerasdist.select_strategy("default")
    stop = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=100.0)
    history = kerasdist.distributed_fit(build_model, x, y, epochs=5, checkpoint_dir=tmp_path,
                                        strategy=strategy, batch_size=32, verbose=0, callbacks=[stop])
    assert history.epoch == [0, 1]  # stopped after the first epoch without a 100-point improvement


class StopAtStep(keras.callbacks.Callback):
    """A user's own stop in the middle of an epoch (a time budget, say)."""

    def __init__(self, step: int):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            self.model.stop_training = True


def test_a_fit_a_callback_stops_mid_epoch_resumes_at_the_next_batch_and_ends_as_one_run(tmp_path):
    x, y = digits()  # 4 steps an epoch
    args = dict(strategy="default", batch_size=64, seed=3, every_steps=4, verbose=0)
    keras.utils.set_random_seed(1)
    whole = kerasdist.distributed_fit(build_model, x, y, epochs=3, checkpoint_dir=tmp_path / "whole", **args)
    keras.utils.set_random_seed(1)
    stopped = kerasdist.distributed_fit(build_model, x, y, epochs=3, checkpoint_dir=tmp_path / "ckpt",
                                        callbacks=[StopAtStep(6)], **args)
    assert int(stopped.model.optimizer.iterations.numpy()) == 6
    latest = kerasdist.latest_checkpoint(tmp_path / "ckpt")
    assert (latest.global_step, latest.epoch, latest.step_in_epoch) == (6, 1, 2)
    # resumed mid-epoch and stopped within the rest of that epoch, then at its last batch: it stops
    # there each time (the rest of an epoch is a fit of its own, and the next would clear the request)
    for step, epoch, in_epoch in [(7, 1, 3), (8, 2, 0)]:
        ended = kerasdist.distributed_fit(build_model, x, y, epochs=3, checkpoint_dir=tmp_path / "ckpt",
                                          callbacks=[StopAtStep(step)], **args)
        assert int(ended.model.optimizer.iterations.numpy()) == step
        latest = kerasdist.latest_checkpoint(tmp_path / "ckpt")
        assert (latest.global_step, latest.epoch, latest.step_in_epoch) == (step, epoch, in_epoch)
    resumed = kerasdist.distributed_fit(build_model, x, y, epochs=3, checkpoint_dir=tmp_path / "ckpt", **args)
    assert int(resumed.model.optimizer.iterations.numpy()) == 12  # every batch of every epoch once
    assert resumed.epoch == [0, 1, 2]
    for a, b in zip(resumed.model.get_weights(), whole.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def _bad(tmp_path):
    x, y = digits(64)
    file = tmp_path / "a-file"
    file.write_text("")
    ckpt = kerasdist.checkpoint_callback(tmp_path / "other")
    batched = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    return [
        ("build_fn", dict(build_fn=build_model())),
        ("epochs", dict(epochs=0)),
        ("epochs", dict(epochs=1.5)),
        ("strategy", dict(strategy="bogus")),
        ("validation_split", dict(validation_split=1.5)),
        ("give one of them", dict(validation_split=0.2, validation_data=(x, y))),
        (r"callbacks\[0\] must be a Keras callback", dict(callbacks=["tensorboard"])),
        ("distributed_fit adds its own", dict(callbacks=[ckpt])),
        ("dataset_args may not set batch_size", dict(dataset_args={"batch_size": 8})),
        ("dataset_args has a key that DatasetOptions does not take: 'shuffle_bufer'",
         dict(dataset_args={"shuffle_bufer": 10})),
        ("dataset_args must be a dict", dict(dataset_args=[("drop_remainder", True)])),
        ("drop_remainder must be True or False, got 1", dict(dataset_args={"drop_remainder": 1})),
        ("shuffle must be True or False", dict(shuffle="no")),
        ("mixed_precision must be True or False", dict(mixed_precision=1)),
        ("steps_per_execution must be 'auto' or an integer >= 1", dict(steps_per_execution="many")),
        ("keep", dict(keep=0)),
        ("every_steps", dict(every_steps=0)),
        ("is a file", dict(checkpoint_dir=file)),
        ("batch_size", dict(batch_size=-1)),
        ("x", dict(x=x[:10])),  # length differs from y
        # batches of the user's own, read one per step
        ("x is read one batch per step", dict(x=batched, y=None, steps_per_execution=4)),
        ("validation_data must be a batched tf.data.Dataset", dict(x=batched, y=None, validation_data=(x, y))),
    ]


def test_a_resumed_run_is_the_rest_of_its_epoch_then_the_remaining_epochs():
    """The segments every trainer's resume runs (train_from): Keras fit and ps_fit take a partly
    trained epoch alone, custom_fit's loop takes everything in one call."""
    assert segments_from(ResumePoint(2, 0), 5) == [Segment(2, 5)]
    assert segments_from(ResumePoint(2, 3), 5) == [Segment(2, 3, 3), Segment(3, 5)]
    assert segments_from(ResumePoint(4, 3), 5) == [Segment(4, 5, 3)]
    assert segments_from(ResumePoint(2, 3), 5, one_call=True) == [Segment(2, 5, 3)]
    assert segments_from(ResumePoint(5, 0), 5) == [] == segments_from(ResumePoint(7, 2), 5)
    assert segments_from(ResumePoint(2, 4), 5, steps=4) == [Segment(2, 5)]  # a longer epoch's checkpoint


def test_distributed_fit_refuses_bad_input_before_touching_checkpoints(tmp_path):
    x, y = digits(64)
    for message, override in _bad(tmp_path):
        target = tmp_path / "ckpt"
        args = {**dict(build_fn=build_model, x=x, y=y, epochs=1, checkpoint_dir=target, strategy="default",
                       batch_size=32, verbose=0), **override}
        with pytest.raises(ValueError, match=message):
            kerasdist.distributed_fit(**args)
        assert not target.exists(), f"{message}: the checkpoint directory was created"


def test_the_speed_settings_record_only_what_a_resume_must_match():
    from kerasdist.training.speed import TrainingSettings

    settings = TrainingSettings(gradient_accumulation_steps=np.int64(1), steps_per_execution=np.int32(4))
    assert settings.record() == {"mixed_precision": False, "jit_compile": False, "gradient_accumulation_steps": None}
    assert type(settings.steps_per_execution) is int


class _TwoReplicas:
    num_replicas_in_sync = 2


def _r_function():
    """A stand-in for what reticulate makes of an R function (rpytools.call.make_python_function)."""
    def make_python_function(f):
        def python_function(*args, **kwargs):
            return f(*args, **kwargs)
        return python_function
    fn = make_python_function(keras.losses.mean_squared_error)
    fn.__module__ = "rpytools.call"
    return fn


def test_check_step_functions_finds_r_losses_metrics_and_wrapped_ones():
    r_fn = _r_function()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Lambda(lambda t: t), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss=r_fn, metrics=["mae", r_fn])
    assert check_step_functions(model, kerasdist.select_strategy("default")) == ["loss", "metrics[1]"]
    with pytest.raises(ValueError, match=r"loss, metrics\[1\] are R functions.*2 replicas.*built-in.*py_run_string"):
        check_step_functions(model, _TwoReplicas())
    wrapped = lambda y_true, y_pred: r_fn(y_true, y_pred)  # noqa: E731 - a closure holding one
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss=wrapped, metrics=[keras.metrics.MeanMetricWrapper(r_fn, name="r")])
    assert check_step_functions(model, kerasdist.select_strategy("default")) == ["loss", "metrics[0]"]
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", metrics=["accuracy"])
    assert check_step_functions(model, _TwoReplicas()) == []


def test_demo_runs_end_to_end_in_a_fresh_process(tmp_path):
    run = subprocess.run([sys.executable, "-m", "kerasdist", "demo", "--run-dir", str(tmp_path), "--epochs", "1"],
                         capture_output=True, text=True, timeout=150,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[run 1] epoch 1 step 13  SIGKILL" in run.stdout
    assert "killed by SIGKILL" in run.stdout and "test accuracy" in run.stdout
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["strategy"] == "mirrored" and result["replicas"] == 2
    assert result["resumed_from"] == {"epoch": 0, "step_in_epoch": 10, "global_step": 10}
    assert result["epochs"] == 1 and result["optimizer_steps"] == 22
    png = Path(result["png"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_steps_per_execution_is_checked_against_the_epoch_and_every_steps(tmp_path):
    x, y = digits(256)  # 4 steps of 64 an epoch
    args = dict(epochs=1, checkpoint_dir=tmp_path / "ckpt", strategy="default", batch_size=64, verbose=0)
    for message, override in [("steps_per_execution must be 'auto' or", dict(steps_per_execution="fast")),
                              ("steps_per_execution must be an integer >= 1", dict(steps_per_execution=0)),
                              ("does not divide the 4 steps of an epoch.*1, 2, 4", dict(steps_per_execution=3)),
                              ("every_steps=2 is not a multiple of steps_per_execution=4",
                               dict(steps_per_execution=4, every_steps=2))]:
        with pytest.raises(ValueError, match=message):
            kerasdist.distributed_fit(build_model, x, y, **{**args, **override})
    assert not (tmp_path / "ckpt").exists()
    # 'auto' on this tiny model: a whole epoch per call, unless a callback works per batch
    auto = kerasdist.distributed_fit(build_model, x, y, **args)
    assert auto.model.steps_per_execution == 4 and int(auto.model.optimizer.iterations.numpy()) == 4
    seen = []
    per_batch = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch))
    kept = kerasdist.distributed_fit(build_model, x, y, **{**args, "checkpoint_dir": tmp_path / "b",
                                                           "callbacks": [per_batch]})
    assert kept.model.steps_per_execution == 1 and seen == [0, 1, 2, 3]


def test_steps_per_execution_preempted_then_resumed_with_another_value_is_bitwise(tmp_path):
    """2 steps per call, every_steps=4: SIGTERM lands at a call's end, the checkpoint holds whole
    calls, and the run resumed with 4 steps per call (the interrupted epoch's rest in calls of
    gcd(4, 6) = 2) ends bitwise equal to a run of 1 step per call never interrupted."""
    x, y = digits(128)  # 8 steps of 16 an epoch
    sent = []

    class Term(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) >= 14 and not sent:
                sent.append(batch)
                os.kill(os.getpid(), signal.SIGTERM)

    def build():
        keras.utils.set_random_seed(4)
        return build_model()

    args = dict(epochs=3, strategy="default", batch_size=16, seed=1, every_steps=4, verbose=0)
    whole = kerasdist.distributed_fit(build, x, y, checkpoint_dir=tmp_path / "whole", steps_per_execution=1, **args)
    with pytest.raises(SystemExit) as stop:
        kerasdist.distributed_fit(build, x, y, checkpoint_dir=tmp_path / "ckpt", steps_per_execution=2,
                                  callbacks=[Term()], **args)
    assert stop.value.code == kerasdist.PREEMPTED_EXIT_CODE
    latest = kerasdist.latest_checkpoint(tmp_path / "ckpt")
    assert (latest.epoch, latest.step_in_epoch, latest.global_step) == (1, 6, 14)  # that call's end
    resumed = kerasdist.distributed_fit(build, x, y, checkpoint_dir=tmp_path / "ckpt", steps_per_execution=4, **args)
    assert resumed.model.steps_per_execution == 4 and int(resumed.model.optimizer.iterations.numpy()) == 24
    for a, b in zip(whole.model.get_weights(), resumed.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_steps_per_execution_is_1_under_several_replicas_where_upstream_keras_fails():
    """'auto' is 1 under 2 replicas and an integer is refused, because Keras 3.15's multi-step
    loop fails there (keras-team/keras#19246). Fails once upstream works: then allow it."""
    from kerasdist.context import RunContext
    from kerasdist.training.speed import choose_steps_per_execution

    two = RunContext(strategy=None, kind="mirrored", num_replicas=2)
    assert choose_steps_per_execution("auto", build_model(), two, 4, 64)[0] == 1
    with pytest.raises(ValueError, match="keras-team/keras#19246"):
        choose_steps_per_execution(2, build_model(), two, 4, 64)
    result = run_python("""
        import numpy as np, keras, tensorflow as tf, kerasdist
        kerasdist.simulate_devices(2)
        x = np.ones((32, 4), np.float32)
        try:
            kerasdist.distributed_fit(lambda: None, x, x[:, :1], epochs=1, checkpoint_dir="unused",
                                      strategy="mirrored", batch_size=8, steps_per_execution=2)
        except ValueError as error:
            assert "keras-team/keras#19246" in str(error), error
        with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
        try:
            model.fit(tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8), verbose=0)
            print("UPSTREAM WORKS")
        except tf.errors.InvalidArgumentError as error:
            assert "must feed a value for placeholder" in str(error), error
            print("UPSTREAM FAILS")
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "UPSTREAM FAILS" in result.stdout, "Keras runs several steps per call under replicas now: allow it"


@pytest.mark.parametrize("trainer", ["resume_fit", "custom_fit"])
def test_data_of_unknown_length_is_counted_once_and_a_resume_takes_the_checkpoints_count(tmp_path, monkeypatch,
                                                                                         trainer):
    x, y = digits(96)
    data = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda features, label: True).batch(32)
    assert int(data.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    passes = []
    reduce = tf.data.Dataset.reduce
    monkeypatch.setattr(tf.data.Dataset, "reduce", lambda self, *a, **k: passes.append(self) or reduce(self, *a, **k))

    def fit(epochs):
        model = kerasdist.make_or_restore_model(tmp_path, build_model)
        if trainer == "custom_fit":
            return kerasdist.custom_fit(model, data, epochs=epochs, verbose=0)
        return kerasdist.resume_fit(model, data, epochs, kerasdist.checkpoint_callback(tmp_path), verbose=0)

    assert fit(1).epoch == [0] and len(passes) == 1  # counted by one pass, before training
    history = fit(2)
    assert len(passes) == 1  # the resume took the count the checkpoint recorded: no pass over the data
    assert history.epoch == [0, 1] and int(history.model.optimizer.iterations.numpy()) == 2 * 3
