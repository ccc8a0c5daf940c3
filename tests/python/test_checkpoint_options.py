"""The checkpoint options are one record (`CheckpointOptions`): every function that takes them has
each field as a keyword with the record's default and doc, flat calls and the record agree, and a
bad value or an unknown name is refused by the one check, naming it. No training here."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import kerasdist
from kerasdist.checkpoint import CheckpointOptions, option_docs

TAKERS = [kerasdist.checkpoint_callback, kerasdist.CheckpointCallback, kerasdist.distributed_fit, kerasdist.custom_fit]


@pytest.mark.parametrize("function", TAKERS, ids=lambda f: f.__name__)
def test_every_function_that_takes_checkpoint_options_has_each_field_with_its_default_and_doc(function):
    parameters = inspect.signature(function).parameters
    docs = inspect.getdoc(function if inspect.isfunction(function) else function.__init__)
    for field in dataclasses.fields(CheckpointOptions):
        assert parameters[field.name].default == field.default, field.name
        assert parameters[field.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert f"    {field.name}: {option_docs()[field.name].split()[0]}" in docs, field.name
    assert "**" not in str(inspect.signature(function))  # no catch-all left to see


def test_every_option_has_its_doc():
    docs = option_docs()
    assert list(docs) == [f.name for f in dataclasses.fields(CheckpointOptions)]
    assert all(len(text) > 10 for text in docs.values()), docs


def test_a_flat_call_and_the_record_give_the_same_options(tmp_path):
    flat = kerasdist.checkpoint_callback(tmp_path, keep=5, every_steps=2, async_save=False)
    record = kerasdist.checkpoint_callback(tmp_path, options=CheckpointOptions(keep=5, every_steps=2,
                                                                                async_save=False))
    assert flat.options == record.options == CheckpointOptions(keep=5, every_steps=2, async_save=False)
    both = kerasdist.checkpoint_callback(tmp_path, options=CheckpointOptions(keep=5), every_steps=2)
    assert (both.options.keep, both.options.every_steps) == (5, 2)
    assert (flat.keep, flat.every_steps, flat.async_save, flat.monitor) == (5, 2, False, "loss")  # as attributes
    with pytest.raises(AttributeError, match="no attribute 'kep'"):
        _ = flat.kep


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
    message = r"unexpected keyword argument 'kep': neither an argument of this function nor a checkpoint option \(every"
    with pytest.raises(TypeError, match=message):
        kerasdist.checkpoint_callback(tmp_path, kep=3)
    with pytest.raises(TypeError, match="'kep'"):
        kerasdist.distributed_fit(lambda: None, [], epochs=1, checkpoint_dir=tmp_path, kep=3)
    with pytest.raises(ValueError, match="options must be a CheckpointOptions, got dict"):
        kerasdist.checkpoint_callback(tmp_path, options={"keep": 3})
