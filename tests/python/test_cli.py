"""The `kerasdist` command: help and version without TensorFlow, and `kerasdist checkpoints`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

import kerasdist
from kerasdist_cli import main

COMMANDS = ["info", "launch", "checkpoints", "demo", "bench"]
X = np.linspace(0, 1, 48, dtype="float32").reshape(16, 3)


@pytest.mark.cold_start  # a forked process has TensorFlow imported already
def test_help_version_and_every_commands_help_answer_without_importing_tensorflow():
    probe = textwrap.dedent(f"""
        import contextlib, io, sys
        from kerasdist_cli import main
        for argv in [["--help"], ["--version"], *[[c, "--help"] for c in {COMMANDS!r}]]:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    main(argv)
                except SystemExit as exit:
                    assert exit.code == 0, (argv, exit.code)
            print(repr(out.getvalue()))
        print(sorted(m for m in ("tensorflow", "keras", "kerasdist", "numpy") if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    *outputs, imported = done.stdout.strip().splitlines()
    assert imported == "[]"
    top, version, *commands = [eval(text) for text in outputs]
    assert "distributed, fault-tolerant Keras 3 training" in top
    assert all(f"kerasdist {command}" in top or command in top for command in COMMANDS)
    assert version.strip() == f"kerasdist {kerasdist.__version__}"
    for command, text in zip(COMMANDS, commands, strict=True):
        assert text.startswith(f"usage: kerasdist {command}"), text
        assert "example" in text, f"{command}'s help has no example"


def test_the_installed_script_is_the_command():
    script = Path(sys.executable).with_name("kerasdist")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, f"kerasdist {kerasdist.__version__}"), done.stderr


def build_model() -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_checkpoints_lists_valid_and_damaged_ones_and_where_a_restart_resumes(tmp_path, capsys):
    checkpoint_dir = tmp_path / "run"
    kerasdist.distributed_fit(build_model, X, X.sum(1), epochs=3, checkpoint_dir=checkpoint_dir, strategy="default",
                              batch_size=4, every_steps=2, keep=10, verbose=0)
    names = sorted((p.name for p in checkpoint_dir.glob("ckpt-*")), key=lambda name: int(name.split("-")[1]))
    assert names == [f"ckpt-{step}" for step in (2, 4, 6, 8, 10, 12)]
    newest = checkpoint_dir / "ckpt-12" / "model.keras"
    os.truncate(newest, newest.stat().st_size // 2)  # a disk that filled up
    (checkpoint_dir / "ckpt-14").mkdir()  # a save that never completed

    assert main(["checkpoints", str(checkpoint_dir), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["global_step"] for row in rows] == [2, 4, 6, 8, 10, 12, 14]
    assert [row["valid"] for row in rows] == [True] * 5 + [False] * 2
    assert [row["restart"] for row in rows] == [False] * 4 + [True] + [False] * 2
    with pytest.warns(kerasdist.CheckpointWarning):
        assert rows[4]["path"] == kerasdist.latest_checkpoint(checkpoint_dir).path
    assert (rows[4]["epoch"], rows[4]["step_in_epoch"]) == (2, 2)
    assert "model.keras has" in rows[5]["problem"] and "truncated" in rows[5]["problem"]
    assert "state.json is missing" in rows[6]["problem"]
    assert rows[0]["size"] > 1000 and rows[0]["saved_at"].endswith("+00:00")
    assert rows == kerasdist.checkpoint_table(checkpoint_dir)

    assert main(["checkpoints", str(checkpoint_dir)]) == 0
    header, *lines = capsys.readouterr().out.strip().splitlines()
    assert header.split() == ["step", "epoch", "batch", "saved", "at", "(UTC)", "size", "state"]
    assert [line.split()[0] for line in lines] == ["2", "4", "6", "8", "10", "12", "14"]
    assert lines[4].endswith("valid <- a restart resumes here")
    assert "damaged: " in lines[5] and "damaged: " in lines[6]


def test_checkpoints_of_a_missing_directory_is_an_error_naming_it(tmp_path, capsys):
    assert main(["checkpoints", str(tmp_path / "nothing")]) == 2
    assert f"checkpoint_dir '{tmp_path / 'nothing'}' does not exist" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()
    assert main(["checkpoints", str(tmp_path)]) == 0  # an empty directory: no checkpoints, not an error
    assert capsys.readouterr().out.strip() == f"{tmp_path}: no checkpoints"
