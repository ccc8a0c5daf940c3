"""The checkpoint options are one record (`CheckpointOptions`): a bad value or an unknown name is
refused by the one check, naming it, wherever the options are given (the functions that take them
flat: test_signatures.py). No training here."""

from __future__ import annotations

import pytest

import kerasdist
from kerasdist.checkpoint import CheckpointOptions


@pytest.mark.parametrize(("options", "message"), [
    ({"keep": 0}, r"keep must be an integer >= 1 \(the newest checkpoint is always kept\), got 0"),
    ({"mode": "avg"}, "mode must be 'min' or 'max', got 'avg'"),
    ({"monitor": ""}, "monitor must be a metric name"),
    ({"every_steps": 2.0}, "every_steps must be an integer >= 1 or None, got 2.0"),
    ({"every_epoch": False}, "the callback would never save"),
    ({"async_save": "yes"}, "async_save must be True or False"),
    ({"keep_best": 1}, "keep_best must be True or False, got 1"),
    ({"handle_sigterm": None}, "handle_sigterm must be True or False, got None"),
])
def test_a_bad_option_is_refused_by_the_one_check_wherever_it_is_given(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        CheckpointOptions(**options)
    with pytest.raises(ValueError, match=message):
        kerasdist.checkpoint_callback(tmp_path / "c", **options)
    with pytest.raises(ValueError, match=message):
        kerasdist.custom_fit(lambda: None, [], epochs=1, checkpoint_dir=tmp_path / "c", **options)
    assert not (tmp_path / "c").exists()


def test_an_unknown_option_is_a_type_error_naming_it(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'kep'"):
        kerasdist.checkpoint_callback(tmp_path, kep=3)
    with pytest.raises(TypeError, match="'kep'"):
        kerasdist.distributed_fit(lambda: None, [], epochs=1, checkpoint_dir=tmp_path, kep=3)
    with pytest.raises(ValueError, match="options must be a CheckpointOptions, got dict"):
        kerasdist.checkpoint_callback(tmp_path, options={"keep": 3})
