"""A real Ray cluster of N nodes on this machine, each in a network namespace of its own (needs root).

usage: python tools/ray_cluster.py up [--nodes 2]   # start one, print how to use it, wait for Ctrl-C
       python tools/ray_cluster.py cleanup          # remove what runs that died left behind

Ray picks the machine's own interface unless told otherwise, and TensorFlow's collective server
(which Ray's TensorflowTrainer starts in every worker) listens on every interface whatever
TF_CONFIG says: here neither can be reached from outside. One node (`RayCluster(1)`) is a namespace
with only a loopback interface, every Ray process bound to 127.0.0.1. Several nodes are one
namespace each with a veth onto a bridge, which lives in a namespace of its own (as
tools/slurm_cluster.py builds its hosts), node i at 10.x.y.(10+i), its Ray processes bound to that
address (`ray start --node-ip-address`); node 0 is the head. The nodes share this machine's disk,
as nodes share a network filesystem: `cluster.shared` is Ray's storage_path.

Names carry the prefix `kdray-` and a random run id, the subnet is random (10.20-99.x.0/24, apart
from the Slurm cluster's 10.100-249): runs never collide. `down()` (the context manager, an atexit
hook) kills every process in the run's namespaces by its pid (never `ray stop`, which stops every
Ray process on the machine), deletes them and the run's directory; `cleanup()` does the same for
runs whose owner process is gone (each `up()` calls it first).
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import netns_runs
from netns_runs import namespaces_of, netns_pids

PREFIX = "kdray-"
RUN_NAME = re.compile(rf"{PREFIX}[0-9a-f]{{6}}")  # a run's name: the prefix and its run id
NETNS_DIR = Path("/run/netns")
GCS_PORT = 6379
REQUIRED_PROGRAMS = ("ip", "nsenter", "ss")


class ClusterError(RuntimeError):
    """The cluster could not start, or a node did not come up."""


def missing_requirements() -> str | None:
    """Why a cluster cannot start here (not root, a program or Ray missing), or None when it can."""
    if os.geteuid() != 0:
        return "the Ray test cluster needs root (network namespaces)"
    missing = [p for p in REQUIRED_PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"the Ray test cluster needs {', '.join(missing)}"
    if shutil.which("ray", path=str(Path(sys.executable).parent)) is None:
        return "the Ray test cluster needs Ray (pip install 'ray[train]', kerasdist[ray])"
    return None


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket as `ss -ltnp` shows it."""

    address: str
    port: int
    process: str
    pid: int


@dataclass
class RayCluster:
    """A Ray cluster of `nodes` nodes (node 0 the head) with `cpus[i]` CPUs each.

    Use it as a context manager (`with RayCluster(2, cpus=(1, 1)) as cluster:`). `env` is added to
    the environment of every Ray process and of `python()` (e.g. PYTHONPATH for the workers).
    `prepare(cluster)`, when given, runs once the namespaces exist and before any node starts (a
    storage server in the head's namespace, say); what it returns is added to `env`."""

    nodes: int = 1
    cpus: tuple[int, ...] = (2,)
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[RayCluster], dict[str, str]] | None = None
    run_id: str = field(default_factory=lambda: f"{random.getrandbits(24):06x}")
    root: Path = field(init=False)
    _processes: dict[int, subprocess.Popen] = field(init=False, default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"nodes must be a positive integer, got {self.nodes!r}")
        if len(self.cpus) != self.nodes:
            raise ValueError(f"cpus must give one count per node ({self.nodes}), got {self.cpus!r}")
        self.name = f"{PREFIX}{self.run_id}"
        self.root = Path(tempfile.gettempdir()) / self.name
        self.subnet = f"10.{random.randrange(20, 100)}.{random.randrange(0, 255)}"

    # names and addresses -----------------------------------------------------------------------
    def namespace(self, node: int) -> str:
        return f"{self.name}-n{node}"

    @property
    def bridge_namespace(self) -> str:
        return f"{self.name}-br"

    def node_ip(self, node: int) -> str:
        return "127.0.0.1" if self.nodes == 1 else f"{self.subnet}.{10 + node}"

    @property
    def address(self) -> str:
        """The head's GCS address, for `ray.init(address=...)` from inside node 0's namespace."""
        return f"{self.node_ip(0)}:{GCS_PORT}"

    @property
    def shared(self) -> Path:
        """A directory every node sees (Ray's storage_path)."""
        return self.root / "shared"

    # lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> RayCluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self, timeout: float = 120) -> RayCluster:
        """Make the namespaces, start the head, then every other node."""
        reason = missing_requirements()
        if reason:
            raise ClusterError(reason)
        cleanup()
        atexit.register(self.down)
        try:
            self.shared.mkdir(parents=True, exist_ok=True)
            (self.root / "owner").write_text(str(os.getpid()))
            self._make_network()
            if self.prepare is not None:
                self.env.update(self.prepare(self))
            for node in range(self.nodes):
                self.start_node(node, timeout)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Kill every process of the cluster, delete its namespaces and its directory."""
        _teardown(self.name, self.root)
        for process in self._processes.values():
            _reap(process)
        self._processes.clear()

    def start_node(self, node: int, timeout: float = 120) -> None:
        """Start node `node`'s Ray (the head for node 0) in its namespace; wait until it has joined."""
        temp = self.root / f"n{node}"
        temp.mkdir(parents=True, exist_ok=True)
        log_path = self.root / f"node{node}.log"
        head = ["--head", f"--port={GCS_PORT}", "--include-dashboard=false"]
        role = head if node == 0 else [f"--address={self.address}"]
        command = [str(Path(sys.executable).parent / "ray"), "start", "--block", *role,
                   f"--node-ip-address={self.node_ip(node)}", f"--num-cpus={self.cpus[node]}", "--num-gpus=0",
                   f"--temp-dir={temp}", "--disable-usage-stats"]
        with open(log_path, "ab") as log:
            self._processes[node] = subprocess.Popen(
                ["nsenter", f"--net={NETNS_DIR / self.namespace(node)}", *command], stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.environment(), start_new_session=True)
        deadline = time.monotonic() + timeout
        while b"Ray runtime started" not in log_path.read_bytes():
            if self._processes[node].poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise ClusterError(f"Ray node {node} did not start:\n{tail}")
            time.sleep(0.2)

    def kill_node(self, node: int) -> list[int]:
        """Lose node `node` as a crash does: every process in its namespace SIGSTOPped (listed
        again until no new one shows), then SIGKILLed. Returns the pids."""
        pids: list[int] = []
        while fresh := [pid for pid in netns_pids(self.namespace(node)) if pid not in pids]:
            for pid in fresh:
                _signal(pid, signal.SIGSTOP)
            pids += fresh
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        process = self._processes.pop(node, None)
        if process is not None:
            _reap(process)
        return pids

    # using it ----------------------------------------------------------------------------------
    def environment(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "KERASDIST_WARM"))}
        return {**env, "RAY_USAGE_STATS_ENABLED": "0", **self.env, **(extra or {})}

    def python(self, args: list[str], node: int = 0, env: dict[str, str] | None = None,
               **popen: object) -> subprocess.Popen:
        """Start `python ARGS` (a driver) in node `node`'s namespace."""
        return subprocess.Popen(["nsenter", f"--net={NETNS_DIR / self.namespace(node)}", sys.executable, *args],
                                env=self.environment(env), **popen)

    def command(self, args: list[str], node: int = 0, env: dict[str, str] | None = None,
                **popen: object) -> subprocess.Popen:
        """Start any program in node `node`'s namespace (e.g. Rscript)."""
        return subprocess.Popen(["nsenter", f"--net={NETNS_DIR / self.namespace(node)}", *args],
                                env=self.environment(env), **popen)

    def listeners(self, node: int | None = None) -> list[Listener]:
        """The listening TCP sockets in node `node`'s namespace (None: this process's own, the
        machine's)."""
        prefix = [] if node is None else ["nsenter", f"--net={NETNS_DIR / self.namespace(node)}"]
        out = subprocess.run([*prefix, "ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
        return [listener for line in out.splitlines() if (listener := _listener(line))]

    def pids(self) -> set[int]:
        """Every process of the cluster (in any of its namespaces)."""
        return {pid for ns in namespaces_of(self.name) for pid in netns_pids(ns)}

    def _make_network(self) -> None:
        if self.nodes == 1:
            _check(["ip", "netns", "add", self.namespace(0)])
            _check(["ip", "-n", self.namespace(0), "link", "set", "lo", "up"])
            return
        bridge, hub = f"kr{self.run_id}", self.bridge_namespace
        _check(["ip", "netns", "add", hub])
        _check(["ip", "-n", hub, "link", "add", bridge, "type", "bridge"])
        _check(["ip", "-n", hub, "link", "set", bridge, "up"])
        for node in range(self.nodes):
            ns, inner, outer = self.namespace(node), f"ki{self.run_id}{node}", f"ko{self.run_id}{node}"
            _check(["ip", "netns", "add", ns])
            _check(["ip", "link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer, "netns", hub])
            _check(["ip", "-n", hub, "link", "set", outer, "master", bridge])
            _check(["ip", "-n", hub, "link", "set", outer, "up"])
            _check(["ip", "-n", ns, "addr", "add", f"{self.node_ip(node)}/24", "dev", inner])
            _check(["ip", "-n", ns, "link", "set", inner, "up"])
            _check(["ip", "-n", ns, "link", "set", "lo", "up"])


# helpers -------------------------------------------------------------------------------------
def _listener(line: str) -> Listener | None:
    """One line of `ss -Hltnp`: state, queues, local address:port, peer, users:(("name",pid=P,...))."""
    fields = line.split()
    if len(fields) < 5:
        return None
    address, _, port = fields[3].rpartition(":")
    users = " ".join(fields[5:])
    name = users.split('"')[1] if users.count('"') >= 2 else ""
    pid = int(users.split("pid=")[1].split(",")[0]) if "pid=" in users else 0
    return Listener(address.strip("[]"), int(port), name, pid)


def _check(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterError(f"{' '.join(command)} failed: {result.stderr.strip()}")


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(process: subprocess.Popen) -> None:
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _teardown(name: str, root: Path) -> None:
    """Kill every process in the run's namespaces (by pid), delete them and the run's directory."""
    netns_runs.delete_namespaces(namespaces_of(name))
    shutil.rmtree(root, ignore_errors=True)


def cleanup(include_live: bool = False) -> list[str]:
    """Tear down the runs whose owner process has died (all runs with include_live). Returns them."""
    return netns_runs.cleanup(RUN_NAME, _teardown, include_live)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster and keep it until Ctrl-C")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--cpus", type=int, default=1, help="CPUs per node")
    sub.add_parser("cleanup", help="remove the leftovers of runs whose owner died")
    args = parser.parse_args(argv)
    if args.command == "cleanup":
        print("\n".join(cleanup()) or "nothing to clean up")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with RayCluster(args.nodes, cpus=(args.cpus,) * args.nodes) as cluster:
        print(f"run {cluster.run_id}: head {cluster.address}; a driver:\n"
              f"  nsenter --net={NETNS_DIR / cluster.namespace(0)} {sys.executable} examples/ray/train.py "
              f"--address {cluster.address} --storage-path {cluster.shared}\nCtrl-C stops it", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
