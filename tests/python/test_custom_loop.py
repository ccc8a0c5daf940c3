"""custom_fit: fit's step on one device, 2 replicas, kill/resume bitwise, settings recorded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasdist
from conftest import run_python

SCRIPT = Path(__file__).parent / "scripts" / "custom_fit_resumable.py"


def _build():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", jit_compile=False)
    return model


def _data():
    rng = np.random.default_rng(0)
    x = rng.random((40, 4), dtype=np.float32)
    return x, x.sum(axis=1, keepdims=True)


def test_default_step_equals_fit_on_one_device(tmp_path):
    tf.config.experimental.enable_op_determinism()
    x, y = _data()
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    reference = _build()
    expected = reference.fit(batches, epochs=2, shuffle=False, verbose=0)
    history = kerasdist.custom_fit(_build, batches, epochs=2, checkpoint_dir=tmp_path, verbose=0)
    for got, want in zip(history.model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    assert history.epoch == [0, 1]
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-5)
    assert kerasdist.latest_checkpoint(tmp_path).settings == {
        "mixed_precision": False, "jit_compile": False, "gradient_accumulation_steps": None}
    attempt = kerasdist.goodput(tmp_path).attempts[-1]  # custom_fit keeps the run log
    assert attempt.status == "completed" and attempt.saves == 2 and attempt.last_step == 2 * len(batches)


def test_history_spans_earlier_runs_and_settings_mismatch_is_refused(tmp_path):
    x, y = _data()
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    kerasdist.custom_fit(_build, batches, epochs=1, checkpoint_dir=tmp_path, verbose=0)
    before = [info.path for info in kerasdist.list_checkpoints(tmp_path)]
    with pytest.raises(ValueError, match="gradient_accumulation_steps=2 differs from the checkpoint"):
        kerasdist.custom_fit(_build, batches, epochs=2, checkpoint_dir=tmp_path, verbose=0,
                             gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="jit_compile=True differs"):
        kerasdist.custom_fit(_build, batches, epochs=2, checkpoint_dir=tmp_path, verbose=0, jit_compile=True)
    assert [info.path for info in kerasdist.list_checkpoints(tmp_path)] == before  # nothing written
    history = kerasdist.custom_fit(_build, batches, epochs=2, checkpoint_dir=tmp_path, verbose=0)
    assert history.epoch == [0, 1] and len(history.history["loss"]) == 2


def test_other_settings_are_refused_before_any_warning_about_the_checkpoint(tmp_path):
    """A model restored by make_or_restore_model (no checkpoint_dir given) from a mid-epoch
    checkpoint of another global batch and other settings: custom_fit refuses the settings
    before it says anything of the batch (the warning would describe a resume that never runs)."""
    x, y = _data()
    model = kerasdist.make_or_restore_model(tmp_path, _build)
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(2)
    kerasdist.checkpoint.save_checkpoint(model, tmp_path, epoch=0, step_in_epoch=2, run=kerasdist.checkpoint.RunRecord(
        {"gradient_accumulation_steps": 2}, global_batch_size=16))
    model = kerasdist.make_or_restore_model(tmp_path, _build)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="gradient_accumulation_steps=None differs from the checkpoint"):
            kerasdist.custom_fit(model, kerasdist.make_dataset(x, y, batch_size=8), epochs=1, verbose=0)
    assert [str(w.message) for w in caught if issubclass(w.category, kerasdist.CheckpointWarning)] == []


def test_checkpoint_without_settings_still_resumes(tmp_path):
    x, y = _data()
    model = kerasdist.make_or_restore_model(tmp_path, _build)
    kerasdist.checkpoint.save_checkpoint(model, tmp_path, epoch=1, history=[{"loss": 9.0}])
    record = json.loads(next(tmp_path.glob("ckpt-*/state.json")).read_text())
    assert "settings" not in record  # as written before settings existed
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    history = kerasdist.custom_fit(_build, batches, epochs=2, checkpoint_dir=tmp_path, verbose=0,
                                   gradient_accumulation_steps=2)
    assert history.history["loss"][0] == 9.0 and len(history.epoch) == 2


def test_bad_arguments_are_named(tmp_path):
    x, y = _data()
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    with pytest.raises(ValueError, match="step_fn must be a function"):
        kerasdist.custom_fit(_build, batches, 3, epochs=1, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        kerasdist.custom_fit(_build, lambda context: batches, epochs=1, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="mixed_precision must be"):
        kerasdist.custom_fit(_build, batches, epochs=1, checkpoint_dir=tmp_path, mixed_precision="yes")
    unbuilt = keras.Sequential([keras.layers.Dense(1)])
    for bad, match in [(dict(model="m"), "model must be a Keras model"), (dict(model=unbuilt), "model is not built"),
                       (dict(data=[1, 2]), "data must be a tf.data.Dataset"),
                       (dict(model=_build(), optimizer=keras.optimizers.SGD()), "optimizer differs")]:
        with pytest.raises(ValueError, match=match):  # refused before the checkpoint directory is made
            kerasdist.custom_fit(**{"model": _build, "data": batches, **bad}, epochs=1, checkpoint_dir=tmp_path / "c")
        assert not (tmp_path / "c").exists()


def test_two_replicas_match_one_device():
    result = run_python("""
        import numpy as np, keras, tensorflow as tf, kerasdist, tempfile
        kerasdist.simulate_devices(2)
        def build():
            keras.utils.set_random_seed(2)
            m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
            m.compile(optimizer=keras.optimizers.SGD(0.05))
            return m
        def step(model, optimizer, batch):
            x, y = batch
            with tf.GradientTape() as tape:
                loss = kerasdist.scaled_loss(keras.losses.mean_squared_error(y, model(x, training=True)))
            optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            return {"loss": loss}
        rng = np.random.default_rng(0)
        x = rng.random((30, 4), dtype=np.float32); y = x.sum(axis=1, keepdims=True)
        weights, losses = [], []
        for kind in ("mirrored", "default"):
            strategy = kerasdist.select_strategy(kind)
            data = kerasdist.make_dataset(x, y, batch_size=8, seed=1, epochs=2, strategy=strategy)
            h = kerasdist.custom_fit(build, data, step, epochs=2, checkpoint_dir=tempfile.mkdtemp(),
                                     strategy=strategy, verbose=0)
            assert h.model.distribute_strategy.num_replicas_in_sync == (2 if kind == "mirrored" else 1)
            weights.append(h.model.get_weights()); losses.append(h.history["loss"])
        for a, b in zip(*weights):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
        print("OK", losses[0])
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK" in result.stdout


def test_killed_run_resumes_bitwise_on_default_strategy(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                              text=True, timeout=300)

    whole = run(tmp_path / "whole", tmp_path / "whole.npz")
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = run(tmp_path / "ckpt", tmp_path / "resumed.npz", 12)  # mid epoch 2 (8 batches an epoch)
    assert killed.returncode == -9
    latest = kerasdist.latest_checkpoint(tmp_path / "ckpt")
    assert (latest.epoch, latest.step_in_epoch) == (1, 4)
    resumed = run(tmp_path / "ckpt", tmp_path / "resumed.npz")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with np.load(tmp_path / "whole.npz") as a, np.load(tmp_path / "resumed.npz") as b:
        assert a.files == b.files
        for name in a.files:
            if name != "loss":
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        # the interrupted epoch's mean comes from the checkpoint's running mean plus the rest
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-6)


def test_speed_options_train_are_recorded_and_restore_the_policy(tmp_path):
    x, y = _data()
    before = keras.config.dtype_policy().name
    history = kerasdist.distributed_fit(_build, x, y, epochs=1, checkpoint_dir=tmp_path / "fit", batch_size=8,
                                        strategy="default", mixed_precision=True, gradient_accumulation_steps=2,
                                        verbose=0)
    assert history.model.dtype_policy.name == "mixed_bfloat16"  # no GPU here
    assert history.model.optimizer.gradient_accumulation_steps == 2
    assert keras.config.dtype_policy().name == before
    assert kerasdist.latest_checkpoint(tmp_path / "fit").settings["mixed_precision"] is True
    with pytest.raises(ValueError, match="mixed_precision=False differs"):
        kerasdist.distributed_fit(_build, x, y, epochs=2, checkpoint_dir=tmp_path / "fit", batch_size=8,
                                  strategy="default", gradient_accumulation_steps=2, verbose=0)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    history = kerasdist.custom_fit(_build, batches, epochs=2, checkpoint_dir=tmp_path / "custom", verbose=0,
                                   mixed_precision=True, jit_compile=True, gradient_accumulation_steps=2)
    assert np.isfinite(history.history["loss"]).all() and len(history.epoch) == 2
    assert int(history.model.optimizer.iterations.numpy()) == 5  # 10 batches, applied every 2
    assert keras.config.dtype_policy().name == before


@pytest.mark.parametrize("trainer", ["custom_fit", "distributed_fit"])
def test_every_steps_counts_batches_under_gradient_accumulation(trainer, tmp_path):
    """Keras's `optimizer.iterations` is batches // k under accumulation: it stays put for k
    batches, so `every_steps` fired k times in a row (and at batch 1, step 0) and the
    checkpoints, named after it, replaced each other and the epoch-end one."""
    x, y = _data()  # 40 rows, batches of 4: 10 batches an epoch, an update every 3
    common = dict(epochs=2, checkpoint_dir=tmp_path, every_steps=4, keep=100, verbose=0,
                  gradient_accumulation_steps=3)
    if trainer == "custom_fit":
        batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
        history = kerasdist.custom_fit(_build, batches, **common)
    else:
        history = kerasdist.distributed_fit(_build, x, y, batch_size=4, strategy="default", shuffle=False,
                                            **common)
    saved = [(info.epoch, info.step_in_epoch, info.global_step) for info in kerasdist.list_checkpoints(tmp_path)]
    assert saved == [(0, 4, 4), (0, 8, 8), (1, 0, 10), (1, 2, 12), (1, 6, 16), (2, 0, 20)]
    assert [Path(info.path).name for info in kerasdist.list_checkpoints(tmp_path)] == [
        "ckpt-4", "ckpt-8", "ckpt-10", "ckpt-12", "ckpt-16", "ckpt-20"]
    assert int(history.model.optimizer.iterations.numpy()) == 6  # applied updates: 20 // 3


def test_one_epoch_make_dataset_trains_each_epoch_in_its_own_order(tmp_path):
    """make_dataset's default form is one epoch per pass; custom_fit took it for a stream over
    epochs and ran out of data at the second epoch. Each epoch must get that epoch's order, as
    in the stream form, also when resumed mid-epoch."""
    tf.config.experimental.enable_op_determinism()
    x, y = _data()
    stream = kerasdist.make_dataset(x, y, batch_size=8, seed=3, epochs=2)
    one_epoch = kerasdist.make_dataset(x, y, batch_size=8, seed=3)
    want = kerasdist.custom_fit(_build, stream, epochs=2, checkpoint_dir=tmp_path / "stream", verbose=0)
    got = kerasdist.custom_fit(_build, one_epoch, epochs=2, checkpoint_dir=tmp_path / "one", verbose=0,
                               every_steps=3, keep=100)
    for a, b in zip(got.model.get_weights(), want.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got.history["loss"], want.history["loss"])
    shutil.rmtree(tmp_path / "one" / "ckpt-10")  # back to ckpt-9: epoch 1, 4 of 5 batches done
    latest = kerasdist.latest_checkpoint(tmp_path / "one")
    assert latest.order == (1, 4, 9)
    assert (latest.global_batch_size, latest.epoch_order) == (8, kerasdist.data.order.EPOCH_ORDER)
    resumed = kerasdist.custom_fit(_build, one_epoch, epochs=2, checkpoint_dir=tmp_path / "one", verbose=0)
    for a, b in zip(resumed.model.get_weights(), want.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
