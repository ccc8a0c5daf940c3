"""Importing kerasdist: TensorFlow's start-up lines stay out of the console (unless asked for),
other output passes, and logical CPU devices asked for before the import are set up in time."""

from __future__ import annotations

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import kerasdist
from kerasdist import startup

pytestmark = pytest.mark.cold_start  # what the import of TensorFlow itself does

NOISE = ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard")


def _run(code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "KERASDIST_VERBOSE")}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={**environ, **env})


# Registered before kerasdist's import, so it runs after kerasdist's exit handlers; a file left
# open (outside any reference cycle) is still flushed when the interpreter frees it.
AT_EXIT = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))
left_open = open(sys.argv[1], "w"); left_open.write("written")
"""


def test_import_is_quiet_its_exit_skips_the_last_collections_and_verbose_brings_the_lines_back(tmp_path):
    quiet = _run(AT_EXIT + "import kerasdist, tensorflow as tf; print(int(tf.constant(2) + 1))",
                 str(tmp_path / "left-open.txt"))
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.split() == ["3", "frozen", "at", "exit:", "True"]
    assert (tmp_path / "left-open.txt").read_text() == "written"
    assert not any(noise in quiet.stderr for noise in NOISE), quiet.stderr
    loud = _run("import kerasdist", KERASDIST_VERBOSE="1")
    # fails once TensorFlow stops printing them (which lines depends on the CPU: no oneDNN line
    # on a CPU without the instructions its custom operations use)
    assert any(noise in loud.stderr for noise in NOISE), loud.stderr


def test_only_the_start_up_lines_are_dropped(capsys):
    startup._pass_on(
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1795429931.868770    4876 port.cc:153] oneDNN custom operations are on. You may see\n"
        "E0000 00:00:1795429931.868770    4876 cuda.cc:10] a real error\n"
        "a Python warning\n"
    )
    assert capsys.readouterr().err.splitlines() == [
        "E0000 00:00:1795429931.868770    4876 cuda.cc:10] a real error", "a Python warning"]


def test_launched_workers_that_import_tensorflow_first_print_no_start_up_lines(tmp_path, capfd):
    script = tmp_path / "worker.py"
    script.write_text("import tensorflow\nprint('worker ran', flush=True)\n")
    result = kerasdist.launch([sys.executable, str(script)], num_workers=1, timeout=120)
    out, err = capfd.readouterr()
    assert result.ok, err
    assert "[worker 0] worker ran" in out
    assert not any(noise in out + err for noise in NOISE), err


def test_devices_requested_before_the_import_are_split_and_the_request_forgotten():
    result = _run("import os, kerasdist, tensorflow as tf; "
                  "print(len(tf.config.list_logical_devices('CPU')), os.environ.get('KERASDIST_SIMULATE_DEVICES'))",
                  KERASDIST_SIMULATE_DEVICES="3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "None"]


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_resume_fit_takes_the_checkpoint_dir_the_model_was_made_from(tmp_path):
    x = np.arange(64, dtype="float32").reshape(16, 4) / 64
    data = kerasdist.make_dataset(x, x.sum(axis=1), batch_size=8, epochs=1)
    model = kerasdist.make_or_restore_model(tmp_path / "ckpt", _model)
    history = kerasdist.resume_fit(model, data, 2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert kerasdist.latest_checkpoint(tmp_path / "ckpt").epoch == 2
    with pytest.raises(ValueError, match="checkpoint is required"):
        kerasdist.resume_fit(_model(), data, 1)


def test_a_users_own_fit_checks_its_step_for_r_functions(monkeypatch):
    """Any model.fit once kerasdist is imported (keras3's fit() in R), on a model kerasdist did
    not make, checks its step under the model's strategy before Keras's own fit runs."""
    import kerasdist.training.resume as resume_module

    model = _model()
    checked = []
    monkeypatch.setattr(resume_module, "check_step_functions", lambda m, s: checked.append((m, s)) or [])
    model.fit(np.zeros((8, 4), "float32"), np.zeros((8, 1), "float32"), verbose=0)
    assert checked == [(model, model.distribute_strategy)]


# Under -OO, Python reads and writes `.opt-2.pyc` files, which pip does not make: every module of
# TensorFlow and Keras would be compiled again (about 100 s of CPU on a loaded machine). Only
# kerasdist's own docstrings matter here, so the other packages load from their installed bytecode.
OPTIMIZED_KERASDIST_ONLY = """
import importlib._bootstrap_external as bootstrap, importlib.util, os
ours = os.path.dirname(importlib.util.find_spec("kerasdist").origin) + os.sep
installed_bytecode = bootstrap.cache_from_source
def cache_from_source(path, debug_override=None, *, optimization=None):
    if not path.startswith(ours):
        optimization = ""
    return installed_bytecode(path, debug_override, optimization=optimization)
bootstrap.cache_from_source = cache_from_source
"""


def test_kerasdist_imports_with_docstrings_stripped():
    """`python -OO` drops docstrings; the decorators that put the option records' docs into the
    trainers' docstrings must then leave them alone, not fail the import."""
    code = OPTIMIZED_KERASDIST_ONLY + (
        "import sys, kerasdist, kerasdist.validation\n"
        "print(sys.flags.optimize, kerasdist.validation.__doc__, kerasdist.distributed_fit.__doc__)")
    done = subprocess.run([sys.executable, "-OO", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "2 None None"
