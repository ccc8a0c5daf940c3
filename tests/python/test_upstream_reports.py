"""The museum of upstream reports: each report's minimal code (synthetic data), run as Keras is
released, where it must still fail the upstream way (a canary: when one passes, upstream fixed it
and the shim in kerasdist/compat/ can go), and with `import kerasdist`, where it must train as
one device does. docs/upstream.md lists them.

Also covered elsewhere, not repeated here: TensorFlow's multi-worker tutorial (keras#20585) in
test_multi_worker.py (`test_tensorflows_multi_worker_tutorial_trains_with_one_import`, and its
canary `test_upstream_multi_worker_fit_still_needs_the_shim`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from kerasdist import compat

SCRIPTS = Path(__file__).parent / "scripts"
TOLERANCE = 1e-5  # float32 sums in another order


def forced() -> list[str]:
    """make upstream-check runs the museum against the next Keras with the patches forced."""
    return ["--forced"] if os.environ.get("KERASDIST_FORCE_COMPAT") else []


@pytest.fixture(scope="module")
def multi_worker() -> dict:
    """2 workers launched on 127.0.0.1 and one process on one device (the reference), every
    multi-worker case in each (tests/python/scripts/upstream_multi_worker.py)."""
    import re
    import subprocess

    script = [str(SCRIPTS / "upstream_multi_worker.py"), *forced()]
    done = subprocess.run([sys.executable, "-m", "kerasdist", "launch", "-n", "2", "--", sys.executable, *script],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers = [json.loads(m) for m in re.findall(r"^\[worker \d\] (\{.*\})$", done.stdout, re.M)]
    one = subprocess.run([sys.executable, *script, "--single"], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    assert len(workers) == 2, done.stdout[-3000:]
    return {"workers": workers, "single": json.loads(one.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize(("report", "upstream"), [
    ("keras_20329", "Attempt to convert a value (PerReplica"),
    ("ray_47464", "Attempt to convert a value (PerReplica"),
    ("tensorflow_72388", "Invalid reduction dimension 0"),
])
def test_multi_worker_report_fails_as_released_and_trains_after_the_import(multi_worker, report, upstream):
    """As released (the canary) each worker fails the upstream way; with `import kerasdist` both
    workers log the same losses, those of one device. When a canary fails, Keras fixed it: see
    compat.apply_multi_worker_fixes."""
    first, second = multi_worker["workers"]
    assert first[f"{report}_plain"] == second[f"{report}_plain"] == upstream
    assert first[report] == second[report]
    assert_same_losses([first[report], multi_worker["single"][report]])


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory) -> dict:
    """One process, 3 simulated CPU devices, every mirrored case (tests/python/scripts/upstream_mirrored.py)."""
    import subprocess

    done = subprocess.run([sys.executable, str(SCRIPTS / "upstream_mirrored.py"),
                           str(tmp_path_factory.mktemp("mirrored")), *forced()],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_same_losses(pair: list[list[float]]) -> None:
    mine, one_device = pair
    assert len(mine) == len(one_device) == 2
    assert mine == pytest.approx(one_device, rel=TOLERANCE)


def test_canary_uneven_batch_still_fails_in_keras_fit(mirrored):
    """Keras's symbolic build averages the first batch's replica slices (22, 22 and 20 rows):
    AddN fails. When this fails, Keras handles an uneven batch: see compat.apply_uneven_batch_fixes."""
    assert compat.keras_needs_uneven_batch_fixes() or os.environ.get("KERASDIST_FORCE_COMPAT")
    assert mirrored["uneven_plain"] == "AddN must have the same size and shape"


def test_canary_uneven_batch_is_still_weighted_by_replicas_not_rows(mirrored):
    """With the build fixed alone, Keras weights each replica's mean loss by 1/replicas: the
    weights end away from one device's. When this fails, drop the loss-scaling half of the shim."""
    assert mirrored["uneven_build_only_gap"] > 100 * TOLERANCE


def test_uneven_batch_trains_in_plain_fit_as_one_device_does(mirrored):
    """64 over 3 replicas (22 + 22 + 20, the last batch 3 + 3 + 2), 5 over 3 (2 + 2 + 1): the
    losses and the weights of one device, and evaluate's metrics too."""
    assert_same_losses(mirrored["uneven_fit_losses"])
    assert_same_losses(mirrored["uneven_small_losses"])
    assert mirrored["uneven_fit_gap"] < TOLERANCE and mirrored["uneven_small_gap"] < TOLERANCE
    assert mirrored["uneven_evaluate_gap"] < TOLERANCE


@pytest.mark.parametrize("trainer", ["distributed_fit", "custom_fit", "resume_fit"])
def test_uneven_batch_trains_in_kerasdists_trainers_as_one_device_does(mirrored, trainer):
    assert_same_losses(mirrored[f"{trainer}_losses"])
    if trainer != "distributed_fit":
        assert mirrored[f"{trainer}_gap"] < TOLERANCE


def test_canary_keras_23085_custom_loop_with_adam_still_fails(mirrored):
    """keras-team/keras#23085: the reporter's strategy.run loop with Adam under MirroredStrategy.
    When this fails, Keras has keras#23087: see compat.keras_training.apply_optimizer_variables_fix."""
    assert mirrored["custom_loop_plain"] == "You must feed a value for placeholder tensor"


def test_keras_23085_custom_loop_trains_after_the_import_as_one_device_does(mirrored):
    assert mirrored["custom_loop_moved"] > 1e-3
    assert mirrored["custom_loop_gap"] < TOLERANCE


def test_import_puts_the_uneven_batch_and_optimizer_fixes_in_place():
    from keras.src.backend.tensorflow import optimizer as tf_optimizer
    from keras.src.losses import loss as loss_module

    from kerasdist.compat import keras_training

    assert compat.keras_needs_uneven_batch_fixes() and compat.keras_needs_optimizer_variables_fix()
    assert compat.TRAINER.compute_loss is keras_training._compute_loss
    assert loss_module.scale_loss_for_distribution is keras_training._scale_loss
    assert tf_optimizer.TFOptimizer.add_variable is keras_training._add_variable
    with compat.keras_as_released():
        assert compat.TRAINER.compute_loss is keras_training._original_compute_loss
        assert tf_optimizer.TFOptimizer.add_variable is keras_training._original_add_variable
    assert compat.TRAINER._maybe_symbolic_build is keras_training._maybe_symbolic_build
    assert not compat.keras_needs_uneven_batch_fixes("3.16.0")
