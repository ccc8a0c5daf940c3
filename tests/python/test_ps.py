"""Parameter-server training for real: a chief (the coordinator), 2 workers and 1 ps, each its
own process talking gRPC on 127.0.0.1, started by the launcher."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import keras
import pytest
import tensorflow as tf

import kerasdist

SCRIPT = Path(__file__).parent / "scripts" / "train_ps.py"
STEPS = 10  # steps per epoch in the script


def launch(tmp_path, *script_args, **options):
    out = tmp_path / "out.json"
    result = kerasdist.launch([sys.executable, str(SCRIPT), str(out), *script_args],
                              num_workers=2, num_ps=1, grace_period=2, timeout=120, **options)
    return result, (json.loads(out.read_text()) if out.exists() else None)


def test_chief_trains_a_keras3_model_with_ps_fit_and_validation(tmp_path, capfd):
    result, report = launch(tmp_path, "--direct", "--validation", "--epochs", "3", "--check-errors")
    out = capfd.readouterr().out
    assert result.ok, out[-3000:]
    assert report["kind"] == "parameter_server" and report["task"] == "chief:0" and report["chief"]
    assert report["epoch"] == [0, 1, 2]
    loss = report["history"]["loss"]
    assert loss[2] < loss[0] / 5, loss
    val_loss = report["history"]["val_loss"]
    assert len(val_loss) == 3 and val_loss[2] < val_loss[0], val_loss
    assert set(report["history"]) == {"loss", "mae", "val_loss", "val_mae"}
    assert report["step"] == 3 * STEPS  # no optimizer step lost to concurrent workers
    errors = report["errors"]
    assert "steps_per_epoch is required for parameter-server training" in errors["no_steps"]
    assert "validation_steps is required" in errors["no_validation_steps"]
    assert "every_steps is not supported with parameter-server training" in errors["every_steps"]


def test_resume_fit_checkpoints_on_the_chief_and_resumes_after_it_is_killed(tmp_path, capfd):
    ckpt = tmp_path / "ckpt"
    result, report = launch(tmp_path, "--checkpoint-dir", str(ckpt), "--epochs", "3",
                            "--die-after-epoch", "2", max_restarts=1)
    out = capfd.readouterr().out
    assert result.ok and result.restarts == 1, out[-3000:]
    assert [f.description for f in result.failures] == ["chief 0 was killed by SIGKILL"]
    restored = [json.loads(m)["restored_step"] for m in re.findall(r"^\[chief 0\] (\{\"restored_step.*\})$", out, re.M)]
    assert restored == [0, 2 * STEPS]
    assert report["epoch"] == [0, 1, 2] and report["step"] == 3 * STEPS
    assert report["counted_batches"] == 3 * STEPS  # a callback's state came back with the checkpoint
    loss = report["history"]["loss"]
    assert loss[2] < loss[0] / 5, loss
    assert sorted(p.name for p in ckpt.iterdir()) == [*(f"ckpt-{n * STEPS}" for n in (1, 2, 3)), "runs"]
    report = kerasdist.goodput(ckpt)  # ps_fit keeps the run log too: the chief's two starts
    assert [a.status for a in report.attempts] == ["killed or crashed", "completed"]
    assert report.attempts[1].restored_step == 2 * STEPS and report.attempts[1].first_step_at is not None
    latest = kerasdist.latest_checkpoint(ckpt)
    assert (latest.epoch, latest.step_in_epoch, latest.global_step) == (3, 0, 3 * STEPS)
    assert [round(h["loss"], 6) for h in latest.history] == [round(v, 6) for v in loss]


def test_a_preempted_chief_saves_the_settled_state_mid_epoch_and_the_next_run_finishes_the_epoch(tmp_path, capfd):
    ckpt = tmp_path / "ckpt"
    # --epochs 3 and a callback stopping training at the end of epoch 2: the restart, which
    # finishes epoch 2 in a fit of its own, stops there too
    result, report = launch(tmp_path, "--checkpoint-dir", str(ckpt), "--epochs", "3",
                            "--term-at", "1", "3", "--stop-after-epoch", "2", max_restarts=1)
    out = capfd.readouterr().out
    assert result.ok and result.restarts == 1, out[-3000:]
    assert [f.description for f in result.failures] == ["chief 0 exited with status 75 (preempted, checkpoint saved)"]
    saved = [(c.epoch, c.step_in_epoch, c.global_step) for c in kerasdist.list_checkpoints(ckpt)]
    # SIGTERM after batch 3 was scheduled (from a callback before the checkpoint callback): that
    # batch end waits for the steps in flight and saves 4 steps into epoch 2 with exactly
    # STEPS + 4 optimizer steps; the restart runs the other STEPS - 4.
    assert saved == [(1, 0, STEPS), (1, 4, STEPS + 4), (2, 0, 2 * STEPS)]
    assert report["epoch"] == [0, 1] and report["step"] == 2 * STEPS
    assert report["counted_batches"] == 2 * STEPS  # restored mid-epoch, and across the resumed epoch's own fit


def small_model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_ps_fit_refuses_a_model_not_under_a_parameter_server_strategy():
    data = tf.data.Dataset.from_tensor_slices((tf.zeros((4, 2)), tf.zeros((4, 1)))).batch(2)
    with pytest.raises(ValueError, match="model is not under a parameter-server strategy "
                                         ".*_DefaultDistributionStrategy"):
        kerasdist.ps_fit(small_model(), data, 1, steps_per_epoch=2)
    with pytest.raises(ValueError, match="model must be a Keras model, got str"):
        kerasdist.ps_fit("model", data, 1, steps_per_epoch=2)


def test_run_server_returns_on_the_chief_and_outside_a_ps_cluster():
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    assert kerasdist.run_server({"cluster": cluster, "task": {"type": "chief", "index": 0}}) is None
    no_ps = {"worker": ["127.0.0.1:2", "127.0.0.1:4"]}
    assert kerasdist.run_server({"cluster": no_ps, "task": {"type": "worker", "index": 1}}) is None
    with pytest.raises(ValueError):
        kerasdist.run_server("not json")
