"""Shared fixtures: the behaviour tables in tests/cases and fresh Python processes."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

CASES_DIR = Path(__file__).resolve().parents[1] / "cases"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# make_dataset keeps files' record counts in a cache folder (data/counts.py): the suite's own, not the home's
os.environ.setdefault("KERASDIST_CACHE_DIR", str(Path(__file__).resolve().parents[2] / ".check" / "cache"))
SOCKET_VARIABLE = "KERASDIST_WARM_START"  # kerasdist.launch.warm_start's, read before kerasdist is imported


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


@pytest.fixture(scope="session", autouse=True)
def warm_start_server():
    """Python processes the tests start (`[sys.executable, ...]`, and the launcher's tasks) fork
    from a warm-start server that has already imported TensorFlow (kerasdist.launch.warm_start):
    each skips about 6 s of CPU, most of what a short test process costs. A process whose
    import-time environment differs from the server's starts cold by itself; tests marked
    `cold_start` (what the import itself does, the CLI's speed without TensorFlow) always do.
    KERASDIST_TEST_COLD=1 turns it off."""
    from kerasdist.launch.warm_start import WarmServer

    if os.environ.get("KERASDIST_TEST_COLD") or SOCKET_VARIABLE in os.environ:
        yield None
        return
    server = WarmServer(sys.executable, os.environ)
    if not server.wait_ready(300):
        warnings.warn(f"the tests' warm-start server did not come up ({server.why_not_ready()}): all cold",
                      stacklevel=2)
        server.stop()
        yield None
        return
    os.environ[SOCKET_VARIABLE] = server.socket_path
    unpatched = subprocess.Popen
    subprocess.Popen = _WarmPopen  # type: ignore[misc]
    try:
        yield server
    finally:
        subprocess.Popen = unpatched  # type: ignore[misc]
        del os.environ[SOCKET_VARIABLE]
        _keep_server_log(server.log_path)
        server.stop()


def _keep_server_log(path: str) -> None:
    """Beside the test times (KERASDIST_TEST_LOGS, set by tools/test.sh): which processes were
    forked and which ran cold, and why."""
    folder = os.environ.get("KERASDIST_TEST_LOGS")
    if folder and os.path.exists(path):
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(folder).mkdir(parents=True, exist_ok=True)  # set by hand, it may not exist yet
        shutil.copy(path, Path(folder) / f"warm-start-{worker}-{os.getpid()}.log")


class _WarmPopen(subprocess.Popen):
    """`subprocess.Popen` whose `[sys.executable, script | -c code | -m module, ...]` runs warm."""

    def __init__(self, args, *rest, **kwargs):
        from kerasdist.launch.warm_start import client_command

        socket_path = os.environ.get(SOCKET_VARIABLE)
        if (socket_path and isinstance(args, (list, tuple)) and len(args) > 1 and str(args[0]) == sys.executable
                and (not str(args[1]).startswith("-") or str(args[1]) in ("-c", "-m", "-u"))):
            args = client_command(socket_path, [str(a) for a in args])
        super().__init__(args, *rest, **kwargs)


@pytest.fixture(autouse=True)
def _cold_start_when_marked(request, monkeypatch):
    if request.node.get_closest_marker("cold_start"):
        monkeypatch.delenv(SOCKET_VARIABLE, raising=False)


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
