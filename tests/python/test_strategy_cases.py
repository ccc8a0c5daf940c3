"""The strategy rows of tests/cases, the same ones testthat runs from R."""

from __future__ import annotations

import re

import pytest

import kerasdist
from conftest import case_rows, field_of


@pytest.mark.parametrize("row", case_rows("strategy"))
def test_strategy_case(row):
    function = getattr(kerasdist, row["function"])
    if "error" in row:
        with pytest.raises((ValueError, RuntimeError), match=re.escape(row["error"])):
            function(**row["args"])
        return
    plan = function(**row["args"])
    for name, expected in row["expect"].items():
        actual = field_of(plan, name)
        if name == "reason":
            assert expected in actual
        else:
            assert actual == expected, name
