"""Shared fixtures: the behaviour tables in tests/cases and fresh Python processes."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
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
def made_once(tmp_path_factory):
    """`made_once(name, make)`: what `make(folder)` returned (a path), made by the first of the
    pytest-xdist workers that asks and read back by the others, for the runs several tests compare
    against (a reference training, the built packages). A `make` that fails is tried again by the
    next one to ask."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own

    def make_once(name: str, make) -> Path:
        with open(root / f"made-once-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            done = root / f"made-once-{name}.json"
            if not done.exists():
                folder = root / f"made-once-{name}"
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                done.write_text(json.dumps(str(make(folder))))
            return Path(json.loads(done.read_text()))

    return make_once


def require_slurm_cluster():
    """tools/slurm_cluster.py, once this machine can run it: skips with the reason where it cannot
    (not root, slurm-wlm/munge missing), unless CI=true, where these tests must run and fail."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import slurm_cluster

    reason = slurm_cluster.missing_requirements()
    if reason:
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(reason)
    return slurm_cluster


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm cluster of 2 hosts (tools/slurm_cluster.py), shared by the tests that need one;
    a cluster that cannot start fails them."""
    harness = require_slurm_cluster()
    cluster = harness.SlurmCluster(2)
    try:
        cluster.up()
    except harness.ClusterError as error:
        pytest.fail(f"the Slurm test cluster did not start: {error}")
    try:
        yield cluster
    finally:
        cluster.down()
