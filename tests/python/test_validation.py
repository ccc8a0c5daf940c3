"""kerasdist.validation: the one argument-check module and its one message shape."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from kerasdist.validation import (
    boolean,
    choice,
    field_docs,
    fraction,
    integer,
    optional_integer,
    record_of,
    verbosity,
    with_field_docs,
)


@pytest.mark.parametrize("value", [3, np.int32(3), np.int64(3), np.uint8(3)])
def test_integer_accepts_python_and_numpy_integers(value):
    result = integer("steps", value, 1)
    assert result == 3 and type(result) is int


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "steps must be an integer >= 1, got True."),
        (np.bool_(True), "steps must be an integer >= 1, got "),
        (2.0, "steps must be an integer >= 1, got 2.0."),  # whole floats too: R converts its own
        (np.float64(2.0), "steps must be an integer >= 1, got "),
        (2.5, "steps must be an integer >= 1, got 2.5."),
        ("2", "steps must be an integer >= 1, got '2'."),
        (None, "steps must be an integer >= 1, got None."),
        (0, "steps must be an integer >= 1, got 0."),
    ],
)
def test_integer_refuses_with_name_expectation_and_value(value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        integer("steps", value, 1)


def test_integer_without_minimum_and_with_hint():
    assert integer("seed", -7) == -7
    with pytest.raises(ValueError, match=re.escape("seed must be an integer, got 1.5.")):
        integer("seed", 1.5)
    message = "keep must be an integer >= 1 (the newest checkpoint is always kept), got 0."
    with pytest.raises(ValueError, match=re.escape(message)):
        integer("keep", 0, 1, hint="the newest checkpoint is always kept")


def test_optional_integer():
    assert optional_integer("every_steps", None, 1) is None
    assert optional_integer("every_steps", np.int64(5), 1) == 5
    with pytest.raises(ValueError, match=re.escape("every_steps must be an integer >= 1 or None, got 5.0.")):
        optional_integer("every_steps", 5.0, 1)
    with pytest.raises(ValueError, match=re.escape("every_steps must be an integer >= 1 or None, got 0.")):
        optional_integer("every_steps", 0, 1)


def test_fraction():
    assert fraction("validation_split", 0.25) == 0.25
    for bad in (0, 1, 1.5, -0.1, True, float("nan"), "0.2", None):
        with pytest.raises(ValueError, match=re.escape(f"validation_split must be a fraction in (0, 1), got {bad!r}.")):
            fraction("validation_split", bad)


def test_boolean_and_choice():
    assert boolean("shuffle", False) is False
    with pytest.raises(ValueError, match=re.escape("shuffle must be True or False, got 1.")):
        boolean("shuffle", 1)
    assert choice("mode", "max", ("min", "max")) == "max"
    with pytest.raises(ValueError, match=re.escape("mode must be 'min' or 'max', got 'median'.")):
        choice("mode", "median", ("min", "max"))
    with pytest.raises(ValueError, match=re.escape("kind must be 'a', 'b' or 'c', got 3.")):
        choice("kind", 3, ("a", "b", "c"))


def test_verbosity():
    assert [verbosity("verbose", v) for v in ("auto", 0, np.int64(2))] == [1, 0, 2]
    for bad in (3, "silent", 1.0):
        with pytest.raises(ValueError, match=re.escape(f'verbose must be 0, 1, 2 or "auto", got {bad!r}.')):
            verbosity("verbose", bad)
    # What Keras's fit takes: custom_fit and ps_fit took False and True before the options were records.
    assert [verbosity("verbose", v) for v in (False, True)] == [0, 1]


def test_public_functions_share_the_checks():
    import kerasdist
    from kerasdist.launch.launcher import launch

    with pytest.raises(ValueError, match=re.escape("num_workers must be an integer >= 1, got 2.0.")):
        launch(["true"], num_workers=2.0)
    with pytest.raises(ValueError, match=re.escape("n must be an integer >= 1 (the number of CPU devices), got 2.0.")):
        kerasdist.simulate_devices(2.0)
    with pytest.raises(ValueError, match=re.escape("TF_CONFIG task index must be an integer, got 1.0.")):
        kerasdist.parse_tf_config({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1.0}})
    with pytest.raises(ValueError, match=re.escape('verbose must be 0, 1, 2 or "auto", got 5.')):
        kerasdist.custom_fit(lambda: None, None, epochs=1, verbose=5)
    with pytest.raises(ValueError, match=re.escape("kind must be 'auto', 'default', ")):
        kerasdist.plan_strategy("horovod")
    with pytest.raises(ValueError, match=re.escape("file_format must be 'tfrecord' or 'csv', got 'parquet'.")):
        kerasdist.plan_dataset("*.parquet", file_format="parquet")
    with pytest.raises(ValueError, match=re.escape("num_samples must be an integer >= 1 or None, got 10.0.")):
        kerasdist.batch_size_info(8, num_replicas=1, num_samples=10.0)
    with pytest.raises(ValueError, match=re.escape("drop_remainder must be True or False, got 'yes'.")):
        kerasdist.batch_size_info(8, num_replicas=1, drop_remainder="yes")


@dataclasses.dataclass(frozen=True)
class _Options:
    """A record of two options.

    Args:
        steps: how many steps,
            on two lines.
        name: what it is called.
    """

    steps: int = 1
    name: str = "x"

    def __post_init__(self):
        integer("steps", self.steps, 1)


def test_record_of_turns_a_dict_into_the_record_naming_a_bad_key_or_value():
    assert record_of(_Options, {"steps": 3}, "options") == _Options(steps=3)
    message = "options has a key that _Options does not take: 'stpes' (it takes steps, name)."
    with pytest.raises(ValueError, match=re.escape(message)):
        record_of(_Options, {"stpes": 3}, "options")
    with pytest.raises(ValueError, match=re.escape("steps must be an integer >= 1, got 0.")):
        record_of(_Options, {"steps": 0}, "options")
    with pytest.raises(ValueError, match=re.escape("options must be a dict of _Options fields, got list.")):
        record_of(_Options, [("steps", 3)], "options")


def test_a_function_taking_a_record_flat_gets_its_field_docs_once():
    assert field_docs(_Options) == {"steps": "steps: how many steps,\n    on two lines.",
                                    "name": "name: what it is called."}

    @with_field_docs(_Options, leave_out=("name",))
    def run(data, steps=1):
        """Run.

        Args:
            data: the data.

        The other arguments are fields of `_Options`.
        """

    assert run.__doc__ == ("Run.\n\nArgs:\n    data: the data.\n    steps: how many steps,\n        on two lines.\n\n"
                           "The other arguments are fields of `_Options`.")
