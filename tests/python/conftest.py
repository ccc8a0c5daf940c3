"""Shared fixtures: the behaviour tables in tests/cases and fresh Python processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

CASES_DIR = Path(__file__).resolve().parents[1] / "cases"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def case_rows(name: str) -> list[Any]:
    """The rows of tests/cases/NAME.json as pytest params named by their id."""
    rows = json.loads((CASES_DIR / f"{name}.json").read_text())["rows"]
    return [pytest.param(row, id=row["id"]) for row in rows]


def field_of(obj: Any, dotted: str) -> Any:
    """`cluster.num_ps` -> obj.cluster.num_ps, with tuples as lists for comparison with JSON."""
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return list(obj) if isinstance(obj, tuple) else obj


def run_python(code: str, *args: str, env: dict[str, str] | None = None, timeout: int = 180):
    """Run code in a fresh interpreter (TensorFlow device set-up can happen only once a process)."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, env=full_env, timeout=timeout,
    )


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm cluster of 2 hosts (tools/slurm_cluster.py), shared by the tests that need one.

    Skipped with the reason where it cannot run (not root, slurm-wlm/munge missing) unless CI=true:
    there these tests must run, so a cluster that cannot start fails them."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from slurm_cluster import ClusterError, SlurmCluster, missing_requirements

    in_ci = os.environ.get("CI") == "true"
    reason = missing_requirements()
    if reason:
        (pytest.fail if in_ci else pytest.skip)(reason)
    cluster = SlurmCluster(2)
    try:
        cluster.up()
    except ClusterError as error:
        pytest.fail(f"the Slurm test cluster did not start: {error}")
    try:
        yield cluster
    finally:
        cluster.down()
