"""The strategy advisor: argument checks, the recommendation rules, and real timed runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kerasdist
from conftest import case_rows
from kerasdist.advisor import StrategyTiming, recommend

MODELS = Path(__file__).resolve().parent / "models" / "advisor_models.py"


@pytest.mark.parametrize("row", case_rows("advisor"))
def test_bad_arguments_are_refused_before_any_process(row, monkeypatch):
    args = dict(row["args"])
    if "x" in args:
        args["x"] = np.array(args["x"])
    monkeypatch.setattr(kerasdist.advisor, "_run_processes", _no_process_may_start)
    with pytest.raises(ValueError) as err:
        kerasdist.bench_strategies(row["model"], **args)
    assert row["error"] in str(err.value)


def _no_process_may_start(*args, **kwargs):
    raise AssertionError("bench_strategies started a timing process before refusing its arguments")


def timing(strategy, steps_per_second, compute_ms, step_ms=None, replicas=2, input_only_ms=0.1):
    step_ms = step_ms or 1000 / steps_per_second
    return StrategyTiming(strategy, replicas, "test", steps_per_second, steps_per_second * 64, step_ms,
                          compute_ms, max(0.0, step_ms - compute_ms), input_only_ms)


def test_small_model_on_simulated_devices_is_told_the_all_reduce_does_not_pay_off():
    choice, reason = recommend([timing("default", 200, 4.5, replicas=1), timing("mirrored", 40, 24)])
    assert choice == "default"
    assert "mirrored is slower here (0.20x default)" in reason
    assert "too small for the all-reduce to pay off" in reason


def test_a_clear_winner_is_recommended_with_its_speedup():
    choice, reason = recommend([timing("default", 10, 99, replicas=1), timing("mirrored", 19, 50)], gpus=2)
    assert choice == "mirrored"
    assert reason.startswith("mirrored is the fastest (1.90x of default")


def test_within_five_percent_the_simpler_strategy_wins():
    choice, reason = recommend([timing("default", 100, 9, replicas=1), timing("mirrored", 104, 9)], gpus=2)
    assert choice == "default"
    assert "within 5%" in reason


def test_input_bound_steps_are_pointed_out():
    slow_input = timing("default", 50, 5, step_ms=20, replicas=1, input_only_ms=18)
    choice, reason = recommend([slow_input])
    assert choice == "default"
    assert "75% of each step" in reason and "bottleneck" in reason


def test_a_costly_hand_off_points_to_steps_per_execution_on_one_replica():
    handed = timing("default", 100, 4, step_ms=10, replicas=1, input_only_ms=1)  # 6 ms waiting, 1 ms making
    choice, reason = recommend([handed])
    assert choice == "default" and "handing each batch to the step" in reason
    assert "steps_per_execution='auto'" in reason
    # under several replicas Keras cannot run several steps per call (keras-team/keras#19246)
    _, reason = recommend([timing("mirrored", 100, 4, step_ms=10, replicas=2, input_only_ms=1)])
    assert "handing each batch" in reason and "steps_per_execution" not in reason


def test_failed_runs_are_reported_and_not_recommended():
    failed = StrategyTiming("multi_worker", 2, "test", error="worker 1 exited with status 1")
    choice, reason = recommend([timing("default", 100, 9, replicas=1), failed])
    assert choice == "default"
    assert recommend([failed]) == (None, "No strategy ran: multi_worker: worker 1 exited with status 1")


def test_default_and_mirrored_really_run_and_are_compared(tmp_path):
    report = kerasdist.bench_strategies("kerasdist.example_models:tiny_dense", strategies=["default", "mirrored"],
                                        steps=20, batch_size=32, verbose=False, speed_options=True)
    by_name = {t.strategy: t for t in report.timings}
    assert set(by_name) == {"default", "mirrored"}
    assert by_name["mirrored"].replicas == 2 and by_name["default"].replicas == 1
    for t in report.timings:
        assert t.error is None and t.steps_per_second > 0 and t.compute_ms > 0
        assert t.examples_per_second == pytest.approx(t.steps_per_second * 32, rel=0.01)
    assert report.parameters == 2177
    assert report.recommendation in by_name
    text = str(report)
    assert "steps/s" in text and f"Recommendation: {report.recommendation}." in text
    # speed_options: the recommended strategy timed again, plain and with each option
    best = by_name[report.recommendation]
    assert [(t.option, t.strategy) for t in report.speed_options] == [
        ("mixed_precision", best.strategy), ("jit_compile", best.strategy)]
    for t in report.speed_options:
        assert t.error is None and t.steps_per_second > 0 and t.speedup > 0
        assert t.step_ms == pytest.approx(1000 / t.steps_per_second, rel=0.01)
        assert f"{t.speedup:.2f}x: " in report.reason
    assert f"Speed options under {best.strategy}: mixed_precision (mixed_bfloat16) " in report.reason


def test_speed_options_that_help_are_named_and_the_others_are_not():
    from kerasdist.advisor import SpeedOptionTiming, speed_note

    best = timing("mirrored", 100, 9)
    note = speed_note(best, [SpeedOptionTiming("mixed_precision", "mirrored", 130, 7.7, 1.3),
                             SpeedOptionTiming("jit_compile", "mirrored", 103, 9.7, 1.03)])
    assert note == ("Speed options under mirrored: mixed_precision (mixed_bfloat16) 1.30x: helps; "
                    "jit_compile 1.03x: does not help here; pass mixed_precision=True to distributed_fit "
                    "or custom_fit.")
    failed = SpeedOptionTiming("jit_compile", "mirrored", error="XLA compilation failed")
    note = speed_note(best, [SpeedOptionTiming("mixed_precision", "mirrored", 80, 12.5, 0.8), failed])
    assert note.endswith("0.80x: does not help here; jit_compile failed (XLA compilation failed); "
                         "train without them.")


def test_cli_runs_multi_worker_through_the_launcher_on_the_users_file_and_data(tmp_path):
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "kerasdist", "bench", "--model", f"{MODELS}:small_classifier",
         "--data", f"{MODELS}:classifier_data", "--strategies", "default,multi_worker",
         "--steps", "15", "--batch-size", "32", "--json", str(out)],
        capture_output=True, text=True, timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [t["strategy"] for t in report["timings"]] == ["default", "multi_worker"]
    assert all(t["error"] is None and t["steps_per_second"] > 0 for t in report["timings"])
    assert report["timings"][1]["devices"].startswith("2 processes (127.0.0.1)")
    assert report["parameters"] == 195
    assert "Recommendation:" in done.stdout


def test_a_model_that_fails_to_build_is_reported_not_raised():
    report = kerasdist.bench_strategies(f"{MODELS}:broken", strategies=["default"], steps=5, verbose=False)
    assert report.recommendation is None
    assert "layer sizes disagree" in report.timings[0].error
    assert report.reason.startswith("No strategy ran: default:")


def test_an_uncompiled_model_is_named_as_the_problem():
    report = kerasdist.bench_strategies(f"{MODELS}:uncompiled", strategies=["default"], steps=5, verbose=False)
    assert "must return a compiled Keras model" in report.timings[0].error


def test_the_example_models_are_still_found_under_their_old_advisor_name():
    from kerasdist import example_models
    from kerasdist.advisor import load_model_function

    assert load_model_function("kerasdist.advisor:tiny_dense") is example_models.tiny_dense
    assert load_model_function("kerasdist.example_models:mid_cnn") is example_models.mid_cnn


def test_one_gpu_is_not_mirrored_and_says_why(tmp_path):
    from kerasdist import advisor

    layout = advisor._layout("mirrored", 1, 2, 2)
    skipped, parameters = advisor._run_strategy("mirrored", layout, {}, str(tmp_path), 1, 2, 60)
    assert skipped.error == advisor.ONE_GPU and parameters == 0
    assert advisor._layout("mirrored", 4, 2, 2)[:2] == (4, "4 GPUs")
    assert advisor._layout("mirrored", 0, 3, 2) == (3, "3 simulated CPU devices", 3)
    assert recommend([timing("default", 100, 9, replicas=1), skipped])[0] == "default"


@pytest.mark.parametrize("loss,shape,kind", [
    ("sparse_categorical_crossentropy", (4096,), "classes"),
    ("categorical_crossentropy", (4096, 3), "one_hot"),
    ("mse", (4096, 3), "values"),
])
def test_random_targets_fit_the_loss(loss, shape, kind):
    import keras

    from kerasdist.advisor_worker import _synthetic_data

    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=loss)
    x, y = _synthetic_data(model, seed=0)
    assert x.shape == (4096, 5) and y.shape == shape
    if kind == "classes":
        assert set(np.unique(y)) == {0, 1, 2}
    elif kind == "one_hot":
        assert np.array_equal(y.sum(axis=1), np.ones(4096))
    else:
        assert y.dtype == np.float32 and y.std() > 0.5
