"""The data rows of tests/cases, the same ones testthat runs from R."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

import kerasdist
from conftest import case_rows


def build(spec):
    """A data spec of tests/cases/data.json as Python data (see its "about")."""
    if not isinstance(spec, dict):
        return spec
    if "frame" in spec:
        return pd.DataFrame(spec["frame"])
    shape = spec["seq"]
    data = np.arange(int(np.prod(shape)), dtype="float64").reshape(shape)
    if "nan_at" in spec:
        data[tuple(spec["nan_at"])] = np.nan
    return data


def call(row):
    args = dict(row["args"])
    for name in ("x", "y", "sample_weight"):
        if name in args:
            args[name] = build(args[name])
    return getattr(kerasdist, row["function"])(**args)


@pytest.mark.parametrize("row", case_rows("data"))
def test_data_case(row):
    if "error" in row:
        with pytest.raises(ValueError, match=re.escape(row["error"])):
            call(row)
        return
    result = call(row)
    if row["function"] == "epoch_order":
        assert result.tolist() == row["expect"]["order"]
        return
    if row["function"] == "batch_size_info":
        info, dataset = result, None
    else:
        dataset = result.train if row["function"] == "make_dataset_split" else result
        info = kerasdist.dataset_info(dataset)
    batches = list(dataset) if dataset is not None else []
    for name, expected in row["expect"].items():
        if name == "batch_rows":
            assert [int(b[0].shape[0]) for b in batches] == expected
        elif name == "first_batch_y":
            assert batches[0][1].numpy().tolist() == expected
        else:
            assert getattr(info, name) == expected, name
