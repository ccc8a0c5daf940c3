"""The run log (checkpoint/run_log.py), goodput() and `kerasdist goodput` on runs whose losses are
known, and time-based checkpoints (every_seconds)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest

import kerasdist
import kerasdist_cli
from kerasdist import RunLogWarning
from kerasdist.checkpoint.run_log import process_started_at
from kerasdist.goodput import PARTS, RECOVERY_PARTS

ROOT = Path(__file__).resolve().parents[2]
ANYWHERE = ROOT / "tests" / "python" / "scripts" / "train_anywhere.py"


def write_log(directory: Path, name: str, events: list[dict], heartbeat: dict | None = None) -> None:
    runs = directory / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    (runs / f"{name}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if heartbeat:
        (runs / f"{name}.step").write_text(json.dumps(heartbeat))


def test_the_report_splits_a_known_log_into_its_parts(tmp_path):
    # attempt 1: killed at step 7 (its heartbeat's last word), 3 steps after its step-4 checkpoint;
    # 10 s of downtime; attempt 2 restores step 4 and completes at step 20.
    write_log(tmp_path, "a1", [
        {"event": "start", "t": 0.0}, {"event": "ready", "t": 5.0},
        {"event": "restored", "t": 6.0, "seconds": 1.0, "checkpoint": None, "step": 0},
        {"event": "train_begin", "t": 6.0, "step": 0}, {"event": "first_step", "t": 10.0, "step": 1},
        {"event": "save", "t": 15.0, "step": 4, "blocked": 0.5},
        {"event": "committed", "t": 15.2, "step": 4, "checkpoint": "ckpt-4", "write": 0.4, "bytes": 10},
        {"event": "eval", "t": 20.0, "seconds": 1.0},
    ], heartbeat={"t": 30.0, "step": 7})
    write_log(tmp_path, "a2", [
        {"event": "start", "t": 40.0},
        {"event": "restored", "t": 46.0, "seconds": 2.0, "checkpoint": "ckpt-4", "step": 4},
        {"event": "train_begin", "t": 46.0, "step": 4}, {"event": "first_step", "t": 50.0, "step": 5},
        {"event": "save", "t": 60.0, "step": 12, "blocked": 1.5},
        {"event": "train_end", "t": 70.0, "step": 20, "status": "completed"}, {"event": "exit", "t": 71.0},
    ])
    report = kerasdist.goodput(tmp_path)
    assert [a.status for a in report.attempts] == ["killed or crashed", "completed"]
    assert [a.restored_step for a in report.attempts] == [0, 4] and report.attempts[0].last_step == 7
    assert report.redone_steps == 3 and report.failures == 1
    assert report.wall_seconds == pytest.approx(71.0)
    seconds = report.seconds
    assert seconds["downtime"] == pytest.approx(10.0)
    assert seconds["restore"] == pytest.approx(3.0)
    assert seconds["startup"] == pytest.approx((10 - 0 - 1) + (50 - 40 - 2))
    assert seconds["checkpoint_blocking"] == pytest.approx(2.0) and seconds["evaluation"] == pytest.approx(1.0)
    stepping_1 = (30 - 10) - 0.5 - 1.0  # attempt 1's training between its first step and its end
    assert seconds["redone"] == pytest.approx(stepping_1 * 3 / 7)
    assert seconds["productive"] == pytest.approx(stepping_1 * 4 / 7 + (70 - 50) - 1.5)
    assert seconds["other"] == pytest.approx(1.0)  # attempt 2's exit after its end of training
    assert sum(seconds.values()) == pytest.approx(report.wall_seconds)
    assert report.goodput == pytest.approx(seconds["productive"] / 71.0)
    assert report.goodput_excluding_downtime == pytest.approx(seconds["productive"] / 61.0)
    assert report.save_cost_seconds == pytest.approx(1.0)
    assert report.mean_time_between_failures == pytest.approx(61.0)
    assert report.suggested_interval_seconds == pytest.approx(math.sqrt(2 * 1.0 * 61.0))
    assert [row["part"] for row in report.rows()] == list(PARTS)
    assert "goodput" in str(report) and "Young/Daly" in str(report)
    # the recovery: attempt 1's last completed step (30, its last sign of life too: no detection)
    # to attempt 2's first step (50); the log has no imported/ready events, so start-up counts in
    # what follows
    assert report.attempts[0].recovery is None and report.attempts[0].last_step_at == 30.0
    assert report.attempts[1].recovery == {"detection": 0.0, "down": 10.0, "python_and_tensorflow": 0.0,
                                           "cluster": 0.0, "restore": 2.0, "first_step": 8.0, "total": 20.0}


def test_a_failed_attempts_time_after_its_last_completed_step_is_detection_not_training(tmp_path):
    """A chief whose peer died after step 9 (t=30) waits in a collective until the peer is
    declared lost and exits 76 at t=38.5: those 8.5 s are detection, part of the recovery, not
    productive; a killed attempt whose last save came after its last step counts from the save."""
    write_log(tmp_path, "a1", [
        {"event": "start", "t": 0.0}, {"event": "restored", "t": 1.0, "seconds": 0.5, "checkpoint": None, "step": 0},
        {"event": "first_step", "t": 10.0, "step": 1},
        {"event": "save", "t": 20.0, "step": 6, "blocked": 1.0},
        {"event": "train_end", "t": 38.5, "step": 9, "status": "peer lost"}, {"event": "exit", "t": 38.6},
    ], heartbeat={"t": 30.0, "step": 9})
    write_log(tmp_path, "a2", [
        {"event": "start", "t": 40.0}, {"event": "imported", "t": 42.0}, {"event": "ready", "t": 43.0},
        {"event": "restored", "t": 44.0, "seconds": 1.0, "checkpoint": "ckpt-6", "step": 6},
        {"event": "first_step", "t": 45.0, "step": 7},
        {"event": "save", "t": 50.0, "step": 12, "blocked": 0.5},  # killed 0.5 s after its step-12 save
        {"event": "committed", "t": 51.0, "step": 12, "checkpoint": "ckpt-12", "write": 0.4, "bytes": 10},
    ], heartbeat={"t": 49.5, "step": 12})
    report = kerasdist.goodput(tmp_path)
    first, second = report.attempts
    assert [first.status, second.status] == ["peer lost", "killed or crashed"]
    assert first.seconds["detection"] == pytest.approx(8.6) and second.seconds["detection"] == pytest.approx(1.0)
    stepping = (30 - 10) - 1.0
    assert first.seconds["redone"] == pytest.approx(stepping * 3 / 9)  # steps 7-9 trained again
    assert first.seconds["productive"] == pytest.approx(stepping * 6 / 9)
    assert second.seconds["productive"] == pytest.approx((50 - 45) - 0.5)  # nothing after it: none redone
    assert report.seconds["detection"] == pytest.approx(9.6)
    assert sum(report.seconds.values()) == pytest.approx(report.wall_seconds)
    assert second.recovery == {"detection": 8.6, "down": 1.4, "python_and_tensorflow": 2.0, "cluster": 1.0,
                               "restore": 1.0, "first_step": 1.0, "total": 15.0}  # from step 9's end to 45
    assert "detection" in str(report) and "recovery (failure to first step)" in str(report)
    # a step file created but not written yet (the reader came between) is no step record
    write_log(tmp_path / "empty", "a0", [{"event": "start", "t": 0.0}, {"event": "first_step", "t": 1.0, "step": 1}])
    (tmp_path / "empty" / "runs" / "a0.step").write_text("")
    assert kerasdist.goodput(tmp_path / "empty").attempts[0].last_step_at is None


def test_the_report_names_each_attempts_cluster_size_when_the_job_was_resized(tmp_path):
    """An elastic job (#30): 2 workers, a lost host, 1 worker, grown back to 2; a log of an older
    kerasdist (no size in its start event) gives None and no resize line."""
    for index, (workers, restored, status) in enumerate([(2, 0, None), (1, 8, "preempted"), (2, 14, "completed")]):
        t = 100.0 * index
        end = [{"event": "train_end", "t": t + 50, "step": restored + 6, "status": status}] if status else []
        write_log(tmp_path, f"a{index}", [
            {"event": "start", "t": t, "workers": workers, "replicas": workers, "strategy": "multi_worker"},
            {"event": "restored", "t": t + 5, "seconds": 0.5, "checkpoint": None, "step": restored},
            {"event": "first_step", "t": t + 10, "step": restored + 1}, *end,
        ], heartbeat={"t": t + 50, "step": restored + 6})
    report = kerasdist.goodput(tmp_path)
    assert [a.workers for a in report.attempts] == [2, 1, 2]
    assert "workers per attempt: 2 -> 1 -> 2 (the cluster was resized)" in str(report)
    older = tmp_path / "older"
    write_log(older, "a0", [{"event": "start", "t": 0.0}, {"event": "first_step", "t": 1.0, "step": 1}])
    assert kerasdist.goodput(older).attempts[0].workers is None and "workers per" not in str(kerasdist.goodput(older))


def test_an_attempt_that_ended_before_restoring_stands_at_the_next_attempts_step(tmp_path):
    """Preempted at step 14 (saved), then a start killed while Python started (no restore in its
    log), then a start that resumes at 14: nothing was trained twice."""
    write_log(tmp_path, "a0", [
        {"event": "start", "t": 0.0}, {"event": "restored", "t": 1.0, "seconds": 0.1, "checkpoint": None, "step": 0},
        {"event": "first_step", "t": 2.0, "step": 1},
        {"event": "train_end", "t": 20.0, "step": 14, "status": "preempted"}, {"event": "exit", "t": 20.5},
    ])
    write_log(tmp_path, "a1", [{"event": "start", "t": 30.0}, {"event": "imported", "t": 32.0}])
    write_log(tmp_path, "a2", [
        {"event": "start", "t": 40.0}, {"event": "restored", "t": 41.0, "seconds": 0.1, "checkpoint": "c", "step": 14},
        {"event": "first_step", "t": 42.0, "step": 15},
        {"event": "train_end", "t": 50.0, "step": 30, "status": "completed"},
    ])
    report = kerasdist.goodput(tmp_path)
    assert [a.restored_step for a in report.attempts] == [0, 14, 14]
    assert report.redone_steps == 0 and report.failures == 2 and report.seconds["redone"] == 0
    # at the run's end (nothing after it), such an attempt resumed from nothing known: 0
    write_log(tmp_path / "ended", "a0", [{"event": "start", "t": 0.0}, {"event": "first_step", "t": 1.0, "step": 3}])
    write_log(tmp_path / "ended", "a1", [{"event": "start", "t": 5.0}])
    assert [a.restored_step for a in kerasdist.goodput(tmp_path / "ended").attempts] == [0, 0]


def test_a_directory_without_a_run_log_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="holds no run log"):
        kerasdist.goodput(tmp_path)
    assert kerasdist_cli.main(["goodput", str(tmp_path)]) == 2
    with pytest.raises(ValueError, match="checkpoint_dir must be"):
        kerasdist.goodput(42)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "torn.jsonl").write_text('{"event": "start", "t": 1.0}\n{"event": "sa')
    with pytest.raises(ValueError, match=r"runs/torn.jsonl is not a kerasdist run log"):
        kerasdist.goodput(tmp_path)
    (tmp_path / "runs" / "torn.jsonl").write_text('{"event": "start", "t": 1.0}\n')
    report = kerasdist.goodput(tmp_path)
    with pytest.raises(ValueError, match="report must be what goodput"):
        kerasdist.plot_goodput(report.as_dict(), tmp_path / "timeline.png")
    with pytest.raises(ValueError, match="path must be the PNG file"):
        kerasdist.plot_goodput(report, None)


def test_the_process_start_time_comes_from_the_system_not_the_import():
    started = process_started_at()
    before = time.time()
    listed = int(subprocess.run(["ps", "-o", "etimes=", "-p", str(os.getpid())],
                                capture_output=True, text=True, check=True).stdout)
    after = time.time()
    # ps's whole seconds since the start (rounded either way by its own arithmetic), read between
    # before and after however late ps ran on a loaded machine
    assert before - started - 1.05 <= listed <= after - started + 1.05, (before - started, listed, after - started)


def run_anywhere(ckpt: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ANYWHERE), str(ckpt), str(out), "--strategy", "default",
                           "--every-steps", "4", *extra], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_a_killed_a_preempted_and_a_completed_run_report_their_known_losses(tmp_path, capsys):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.npz"
    killed = run_anywhere(ckpt, out, "--kill-at-step", "7", "--pause-before-kill", "1.5")
    assert killed.returncode == -9, killed.stderr[-2000:]
    time.sleep(3.0)  # nothing runs: downtime
    preempted = run_anywhere(ckpt, out, "--kill-at-step", "13", "--kill-signal", "TERM")
    assert preempted.returncode == kerasdist.PREEMPTED_EXIT_CODE, preempted.stderr[-2000:]
    completed = run_anywhere(ckpt, out)
    assert completed.returncode == 0, completed.stderr[-2000:]

    report = kerasdist.goodput(ckpt)
    attempts = report.attempts
    assert [a.status for a in attempts] == ["killed or crashed", "preempted", "completed"]
    assert attempts[0].last_step == 7 and attempts[1].restored_step == 4  # killed at k=7 after c=4
    assert attempts[2].restored_step == attempts[1].last_step == 14  # saved where it stopped
    assert report.redone_steps == 7 - 4 and report.failures == 2
    assert report.seconds["downtime"] >= 3.0
    assert all(a.seconds["startup"] > 0 and a.first_step_at is not None for a in attempts)
    assert report.seconds["restore"] > 0 and report.seconds["productive"] > 0
    assert sum(report.seconds.values()) == pytest.approx(report.wall_seconds)
    assert 0 < report.goodput < report.goodput_excluding_downtime < 1
    assert report.suggested_interval_seconds == pytest.approx(
        math.sqrt(2 * report.save_cost_seconds * report.mean_time_between_failures))
    for attempt in attempts[1:]:  # every part of a recovery measured, and they add up
        recovery = attempt.recovery
        assert recovery["python_and_tensorflow"] > 0 and recovery["cluster"] >= 0 and recovery["restore"] > 0
        assert sum(recovery[part] for part in RECOVERY_PARTS) == pytest.approx(recovery["total"], abs=0.01)
    assert attempts[1].recovery["down"] >= 3.0  # the pause between the runs
    steps_of_saves = [a.saves for a in attempts]
    assert steps_of_saves[0] >= 1 and steps_of_saves[2] >= 2

    png = tmp_path / "timeline.png"
    assert kerasdist_cli.main(["goodput", str(ckpt), "--json", "--plot", str(png)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["redone_steps"] == 3 and len(printed["attempts"]) == 3
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert kerasdist_cli.main(["goodput", str(ckpt)]) == 0
    text = capsys.readouterr().out
    assert "3 attempt(s), 2 failure(s)" in text
    assert _shape(text) == _shape(_documented_goodput()), "docs/checkpoints.md's sample output is stale"


def _shape(report_text: str) -> list[str]:
    """The report's lines with their figures left out (the same run prints other times)."""
    import re

    lines = [line for line in report_text.splitlines() if line.strip() and not line.startswith("timeline:")]
    return [" ".join(re.sub(r"\d+(\.\d+)?", "#", line.split(":", 1)[1] if i == 0 else line).split())
            for i, line in enumerate(lines)]


def _documented_goodput() -> str:
    """The sample output of `kerasdist goodput` in docs/checkpoints.md (the same run as above)."""
    text = (ROOT / "docs" / "checkpoints.md").read_text()
    block = text.split("$ kerasdist goodput ckpt --plot timeline.png\n", 1)[1].split("```", 1)[0]
    return block


def test_a_sigkill_right_after_a_step_counts_the_steps_redone_exactly(tmp_path, monkeypatch):
    """#43: SIGKILLed at step 27 with no pause, two steps after its step-25 checkpoint
    (saves on the training thread every 5 steps): the step record written at each step end says
    27, so the restart that resumes from 25 redid exactly 2 steps; the kill is the failure, and the
    time from step 27's end to the process's last sign of life is detection."""
    monkeypatch.setenv("KERASDIST_RUN_SPOOL", str(tmp_path / "spool"))
    report = kill_at_27_and_resume(str(tmp_path / "ckpt"), tmp_path / "out.npz", os.environ)
    assert report.attempts[0].seconds["detection"] >= 0


def test_a_sigkill_in_a_callback_at_a_steps_end_counts_that_step_redone(tmp_path):
    """#59: SIGKILLed inside a user's callback at the end of step 27 (before kerasdist's callback
    has taken it; checkpoint 25): the step record says step 27 began and 26 ended, so the step in
    progress counts too: 2 steps redone, not 1."""
    report = kill_at_27_and_resume(str(tmp_path / "ckpt"), tmp_path / "out.npz", os.environ, in_step_end=True)
    assert report.attempts[0].redone_steps == 2


def kill_at_27_and_resume(ckpt: str, out: Path, env: dict, in_step_end: bool = False) -> kerasdist.GoodputReport:
    """Train 3 epochs of 10 steps, saving every 5 on the training thread, SIGKILLed right after
    step 27 (or, `in_step_end`, in a callback at its end, before kerasdist's); then resume to the
    end. The report of `ckpt`, its known losses checked."""
    args = [sys.executable, str(ANYWHERE), ckpt, str(out), "--strategy", "default", "--every-steps", "5",
            "--sync-save", "--epochs", "3"]
    kill = ["--kill-at-step", "27", *(["--kill-in-step-end"] if in_step_end else [])]
    killed = subprocess.run([*args, *kill], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert killed.returncode == -9 and "step 27" in killed.stdout, killed.stderr[-2000:]
    resumed = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    report = kerasdist.goodput(ckpt)
    first, second = report.attempts
    completed = 26 if in_step_end else 27  # kerasdist's record: the last step its callback took
    assert first.status == "killed or crashed" and (first.last_step, second.restored_step) == (completed, 25)
    assert report.redone_steps == 2 and first.last_step_at is not None
    assert second.recovery["total"] == pytest.approx(second.first_step_at - first.last_step_at, abs=0.01)
    return report


def small_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def build_small():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


class SlowBatches(keras.callbacks.Callback):
    """Sleeps before the given batches (0-based, of the epoch), so time-based saves come due."""

    def __init__(self, batches, seconds):
        super().__init__()
        self.batches, self.seconds = set(batches), seconds

    def on_train_batch_begin(self, batch, logs=None):
        if batch in self.batches:
            time.sleep(self.seconds)


def events_of(checkpoint_dir: Path) -> list[dict]:
    logs = sorted((checkpoint_dir / "runs").glob("*.jsonl"))
    return [json.loads(line) for log in logs for line in log.read_text().splitlines()]


def test_every_seconds_saves_when_that_long_has_passed_and_resumes_like_step_saves(tmp_path):
    x, y = small_data()
    ckpt = tmp_path / "ckpt"
    kerasdist.distributed_fit(build_small, x, y, epochs=1, checkpoint_dir=ckpt, strategy="default",
                              batch_size=32, every_seconds=1.0, keep=20, steps_per_execution=1,
                              callbacks=[SlowBatches([3, 8], 1.2)], verbose=0)
    saves = [e for e in events_of(ckpt) if e["event"] == "save"]
    steps = [e["step"] for e in saves]
    assert {4, 9} <= set(steps) and steps[-1] == 10  # after each slow batch, and the epoch end
    begin = next(e["t"] for e in events_of(ckpt) if e["event"] == "train_begin")
    times = [begin] + [e["t"] - e["blocked"] for e in saves]
    assert all(later - earlier >= 1.0 - 0.05 for earlier, later in zip(times, times[1:-1], strict=False)), times
    table = {row["global_step"]: row for row in kerasdist.checkpoint_table(ckpt)}
    assert table[4]["epoch"] == 0 and table[4]["step_in_epoch"] == 4  # a step checkpoint, as every_steps writes

    # the mid-epoch checkpoint resumes like a step-based one: the run continues at step 10 of 20
    for entry in ckpt.glob("ckpt-1?"):
        shutil.rmtree(entry)
    assert kerasdist.latest_checkpoint(ckpt).global_step == 9
    history = kerasdist.distributed_fit(build_small, x, y, epochs=2, checkpoint_dir=ckpt, strategy="default",
                                        batch_size=32, every_seconds=3600, steps_per_execution=1, verbose=0)
    assert int(history.model.optimizer.iterations.numpy()) == 20
    resumed = [e for e in events_of(ckpt) if e["event"] == "restored"][-1]
    assert resumed["checkpoint"] == "ckpt-9" and resumed["step"] == 9


@pytest.mark.parametrize("value", [0, -1, float("nan"), "600", True])
def test_a_bad_every_seconds_is_refused_before_anything_is_written(tmp_path, value):
    x, y = small_data()
    with pytest.raises(ValueError, match="every_seconds must be None or a positive number of seconds"):
        kerasdist.distributed_fit(build_small, x, y, epochs=1, checkpoint_dir=tmp_path / "c", every_seconds=value)
    with pytest.raises(ValueError, match="every_seconds must be"):
        kerasdist.checkpoint_callback(tmp_path / "c", every_seconds=value)
    assert not (tmp_path / "c").exists()


def test_a_run_log_that_cannot_be_written_warns_and_training_and_checkpoints_go_on(tmp_path):
    x, y = small_data()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "runs").write_text("a file where the log's folder would go")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kerasdist.distributed_fit(build_small, x, y, epochs=2, checkpoint_dir=ckpt, strategy="default",
                                  batch_size=32, verbose=0)
    assert sum(isinstance(w.message, RunLogWarning) for w in caught) == 1
    assert kerasdist.latest_checkpoint(ckpt).global_step == 20


def test_ready_is_when_the_strategy_was_first_formed_not_the_latest_call():
    strategy = kerasdist.select_strategy("mirrored", devices=["/cpu:0"])
    formed = kerasdist.run_context(strategy).formed_at
    time.sleep(0.2)
    again = kerasdist.select_strategy("mirrored", devices=["/cpu:0"])  # the same strategy, reused
    assert again is strategy and kerasdist.run_context(again).formed_at == formed


def test_the_run_figures_goodput_is_what_goodput_says_of_the_attempt_so_far(tmp_path):
    """The TensorBoard figure comes from the log's own counts as it is written (no read back):
    mid-fit and at its end it equals goodput() of that one attempt, nothing redone."""
    from kerasdist.checkpoint.run_log import Event, RunLog, Status
    from kerasdist.checkpoint.store import open_store

    log = RunLog(open_store(tmp_path, None), heartbeat_seconds=1.0)
    log.event(Event.START, at=40.0)
    log.event(Event.RESTORED, at=46.0, seconds=2.0, checkpoint=None, step=0)
    log.event(Event.TRAIN_BEGIN, at=46.0, step=0)
    log.event(Event.FIRST_STEP, at=50.0, step=1)
    log.event(Event.SAVE, at=60.0, step=12, blocked=1.5)
    log.event(Event.EVAL, at=65.0, seconds=1.0)
    assert log.counts.goodput(40.0, 66.0) == pytest.approx(((66 - 50) - 1.5 - 1.0) / 26)  # mid-fit
    log.event(Event.TRAIN_END, at=70.0, step=20, status=Status.COMPLETED.value)
    report = kerasdist.goodput(tmp_path)
    assert report.attempts[0].status == "completed" and report.redone_steps == 0
    assert log.counts.goodput(40.0, 70.0) == pytest.approx(report.goodput) == pytest.approx(17.5 / 30)


def test_an_event_of_a_newer_kerasdist_is_read_and_left_aside(tmp_path):
    write_log(tmp_path, "a1", [
        {"event": "start", "t": 0.0}, {"event": "train_begin", "t": 1.0, "step": 0},
        {"event": "first_step", "t": 2.0, "step": 1}, {"event": "something_new", "t": 3.0, "step": 99},
        {"event": "train_end", "t": 4.0, "step": 5, "status": "completed"},
    ])
    report = kerasdist.goodput(tmp_path)
    assert report.attempts[0].status == "completed" and report.attempts[0].last_step == 99
