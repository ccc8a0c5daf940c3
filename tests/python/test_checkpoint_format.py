"""The checkpoint format stays readable: a checkpoint directory written by kerasdist as it was before
issue #42 (commit 6647a13: no callbacks.npz, the run log of then) is restored by today's code bit
for bit, weights, optimizer state, step and random-generator states, and training goes on from it.

The fixture, tests/python/data/checkpoint_pre42/, was written by its make_fixture.py run on the old
code (`git worktree add /tmp/old 6647a13`, then `PYTHONPATH=/tmp/old/python python make_fixture.py
OUT`): `ckpt/` is the checkpoint directory after 2 epochs of 4 steps (keep=1), `expected.npz` the
trained model's weights, optimizer variables and seed-generator states as that process held them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasdist
from kerasdist.checkpoint.model_state import seed_states

FIXTURE = Path(__file__).resolve().parent / "data" / "checkpoint_pre42"


def build_model() -> keras.Model:
    """The architecture make_fixture.py trained (its build_model)."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dropout(0.25, seed=3),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


@pytest.fixture
def old_checkpoint_dir(tmp_path) -> Path:
    directory = tmp_path / "ckpt"
    shutil.copytree(FIXTURE / "ckpt", directory)
    return directory


def expected(prefix: str) -> list[np.ndarray]:
    with np.load(FIXTURE / "expected.npz") as saved:
        names = sorted((n for n in saved.files if n.startswith(prefix)), key=lambda n: int(n.rsplit("_", 1)[1]))
        return [saved[name] for name in names]


def assert_bitwise_equal(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want) and want
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes()


def test_a_checkpoint_written_before_42_restores_bit_for_bit(old_checkpoint_dir):
    latest = kerasdist.latest_checkpoint(old_checkpoint_dir)
    assert (latest.epoch, latest.step_in_epoch, latest.global_step) == (2, 0, 8)
    assert len(latest.history) == 2

    model = kerasdist.make_or_restore_model(old_checkpoint_dir, build_model)

    assert int(model.optimizer.iterations.numpy()) == 8
    assert_bitwise_equal(model.get_weights(), expected("weight_"))
    assert_bitwise_equal([np.asarray(v.numpy()) for v in model.optimizer.variables], expected("optimizer_"))
    assert_bitwise_equal(seed_states(model), expected("seed_"))
    # it kept no callbacks' state (callbacks.npz came with #42): none, not an error
    manager = kerasdist.checkpoint.manager_of(model)
    assert manager.callback_state(model) == (latest, None)

    # and training goes on from it, writing today's format beside the old checkpoint
    x = np.linspace(0, 1, 48, dtype="float32").reshape(16, 3)
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).batch(4)
    kerasdist.resume_fit(model, data, 3, kerasdist.checkpoint_callback(old_checkpoint_dir, keep=2), verbose=0)
    assert [(c.epoch, c.global_step) for c in kerasdist.list_checkpoints(old_checkpoint_dir)] == [(2, 8), (3, 12)]
