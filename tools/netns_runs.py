"""What the test clusters (tools/slurm_cluster.py, tools/ray_cluster.py) share about their runs.

A run is a folder /tmp/<prefix><id> holding an `owner` file (the pid of the process that started
it) and network namespaces named <prefix><id>-<host>. A run whose owner is gone was left behind by
a process that died; `cleanup` tears such runs down with the cluster's own teardown.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def list_netns() -> list[str]:
    result = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]


def namespaces_of(run: str) -> list[str]:
    return [ns for ns in list_netns() if ns.startswith(f"{run}-")]


def netns_pids(ns: str) -> list[int]:
    result = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in result.stdout.split()] if result.returncode == 0 else []


def delete_namespaces(namespaces: list[str], timeout: float = 15) -> None:
    """Kill every process in the namespaces (by pid, until none is left or `timeout` passed), then
    delete them."""
    deadline = time.monotonic() + timeout
    while (pids := [pid for ns in namespaces for pid in netns_pids(ns)]) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    for ns in namespaces:
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


def owner_alive(root: Path) -> bool:
    try:
        owner = int((root / "owner").read_text())
    except (OSError, ValueError):
        return False
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    return True


def cleanup(run_name: re.Pattern[str], teardown: Callable[[str, Path], None],
            include_live: bool = False) -> list[str]:
    """Tear down the runs named like `run_name` whose owner has died (all of them with
    include_live), found by their namespaces or their folders. Returns their names."""
    runs = {ns.rsplit("-", 1)[0] for ns in list_netns()}
    runs |= {p.name for p in Path(tempfile.gettempdir()).iterdir() if p.is_dir()}
    removed = []
    for name in sorted(r for r in runs if run_name.fullmatch(r)):
        root = Path(tempfile.gettempdir()) / name
        if include_live or not owner_alive(root):
            teardown(name, root)
            removed.append(name)
    return removed
