"""Fail the Ray recipe (examples/ray/train.py) on a Ray test cluster and time its recovery.

usage: python tools/ray_chaos.py [--kind worker|node] [--failures 5] [--out FILE.json]

Brings up a Ray cluster in network namespaces (tools/ray_cluster.py; needs root): one node bound to
127.0.0.1 for `--kind worker`, two nodes of 1 CPU each for `--kind node`. Runs the recipe unchanged
(2 workers, a checkpoint every 5 steps, 0.2 s a step) with FailureConfig(max_failures=N) and fails
it N times, each time once the current worker group has trained 8 steps: worker 1's process
SIGKILLed (`worker`), or node 1 lost (every process on it stopped, then SIGKILLed) and a new node
started in its place at once (`node`, as KubeRay replaces a pod). Each recovery is measured twice:
by an outside stopwatch, from the instant before the kill to the first step line a new chief process
writes (its log polled every 20 ms), and read back from the chief's run log
(`kerasdist.goodput`: from the failed attempt's last completed step to the first step after it,
split into detection, down, Python + TensorFlow, cluster, restore and first step). Prints one line
per failure, then the median, min and max of each and of their difference, with /proc/loadavg
before and after. RELIABILITY.md, "Ray Train", records the figures.

The tests (tests/python/test_ray.py) drive the recipe through `ExampleRun` from here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ray_cluster

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ray" / "train.py"
EVERY_STEPS, PACE = 5, 0.2
RUN_TIMEOUT = 300


def cluster_env() -> dict[str, str]:
    """What every Ray process of a test cluster needs: this checkout's kerasdist."""
    import kerasdist

    return {"PYTHONPATH": str(Path(kerasdist.__file__).resolve().parents[1]), "TF_CPP_MIN_LOG_LEVEL": "2"}


class ExampleRun:
    """One run of the recipe on `cluster` (one `RunConfig(name)`, possibly several drivers), its
    workers' logs and weights under `folder / name`. `result` collects what it left."""

    def __init__(self, cluster: ray_cluster.RayCluster, folder: Path, name: str, *args: str,
                 epochs: int = 3, storage: str | None = None):
        self.cluster, self.name = cluster, name
        self.storage = storage or str(cluster.shared)  # Ray's storage_path: the shared disk, or a URL
        self.out = folder / name
        self.out.mkdir(parents=True, exist_ok=True)
        self.args = ["--address", cluster.address, "--node-ip-address", cluster.node_ip(0),
                     "--storage-path", self.storage, "--name", name, "--out-dir", str(self.out),
                     "--epochs", str(epochs), "--every-steps", str(EVERY_STEPS), "--step-seconds", str(PACE),
                     *args]
        self.result: dict = {"name": name, "out": str(self.out), "drivers": []}

    def start(self, driver: str = "python", env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a driver in the head's namespace: train.py, or train.R with `driver="R"`."""
        log = open(self.out / f"driver{len(self.result['drivers'])}.log", "w")  # noqa: SIM115 (the driver's)
        if driver == "R":
            command = ["Rscript", str(EXAMPLE.with_suffix(".R")), *self.args]
            self.driver = self.cluster.command(command, env={"KERASDIST_PYTHON": sys.executable, **(env or {})},
                                               stdout=log, stderr=subprocess.STDOUT, cwd=self.out)
        else:
            self.driver = self.cluster.python([str(EXAMPLE), *self.args], env=env, stdout=log,
                                              stderr=subprocess.STDOUT, cwd=self.out)
        log.close()
        self.result["drivers"].append({"kind": driver, "log": log.name})
        return self.driver

    def log(self, rank: int) -> list[str]:
        path = self.out / f"rank{rank}.log"
        return path.read_text().splitlines() if path.exists() else []

    def pid(self, rank: int) -> int:
        """The process that runs rank `rank` now (the last one its log names)."""
        return int(re.findall(r"^pid (\d+)$", "\n".join(self.log(rank)), re.M)[-1])

    def steps_of_this_process(self) -> int:
        """The steps the chief's current process has logged (since its "pid" line)."""
        lines = self.log(0)
        starts = [i for i, line in enumerate(lines) if line.startswith("pid ")]
        return sum(line.startswith("step ") for line in lines[starts[-1]:]) if starts else 0

    def wait_step(self, step: int) -> None:
        """Wait until the chief has logged `step`."""
        deadline = time.monotonic() + RUN_TIMEOUT
        while f"step {step}" not in self.log(0):
            if self.driver.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no step {step} (driver {self.driver.poll()}):\n{self.driver_log()}")
            time.sleep(0.02)

    def stopwatch_to_first_resumed_step(self, lines_before: int) -> float:
        """Seconds from now (the failure) until the chief's log shows a step of a new process, its
        log read every 20 ms."""
        started = time.monotonic()
        deadline = started + RUN_TIMEOUT
        while True:
            lines = self.log(0)[lines_before:]
            starts = [i for i, line in enumerate(lines) if line.startswith("pid ")]
            if starts and any(line.startswith("step ") for line in lines[starts[-1]:]):
                return time.monotonic() - started
            if self.driver.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no resumed step:\n{self.driver_log()}")
            time.sleep(0.02)

    def driver_log(self) -> str:
        return Path(self.result["drivers"][-1]["log"]).read_text(errors="replace")[-4000:]

    def finish(self) -> dict:
        """Wait for the driver; note what the run left: the driver's output, Ray's metrics and
        checkpoint as it printed them, the chief's log, and what the run's directory in Ray's storage
        holds (`inspect_run`; read in the head's namespace when the storage is a URL, which only the
        cluster reaches)."""
        try:
            code = self.driver.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.driver.kill()
            code = "timeout"
        text = self.driver_log()
        metrics = re.findall(r"^metrics (.*)$", text, re.M)
        checkpoint = re.findall(r"^checkpoint (\S+)", text, re.M)
        run_dir = f"{self.storage.rstrip('/')}/{self.name}"
        if "://" in run_dir:
            done = self.cluster.python([__file__, "--inspect", run_dir], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
            out, err = done.communicate(timeout=120)
            if done.returncode != 0:
                raise RuntimeError(f"inspecting {run_dir} failed: {err[-2000:]}")
            stored = json.loads(out.splitlines()[-1])
        else:
            stored = inspect_run(run_dir)
        self.result.update(returncode=code, driver_output=text, metrics=metrics[-1] if metrics else None,
                           checkpoint=checkpoint[-1] if checkpoint else None, chief_log=self.log(0), **stored)
        return self.result


def inspect_run(run_dir: str) -> dict:
    """What a run's directory in Ray's storage (a path or a URL) holds: its entries, kerasdist's
    checkpoints and newest one (as Ray names paths: without a URL's scheme), goodput's attempts."""
    import fsspec

    import kerasdist

    filesystem, path = fsspec.core.url_to_fs(run_dir)
    if not filesystem.exists(path):
        return {"run_dir_entries": [], "checkpoints": [], "latest": None, "attempts": []}
    ckpt = f"{run_dir}/kerasdist"
    checkpoints = [info.path.split("://", 1)[-1] for info in kerasdist.list_checkpoints(ckpt)]
    listed = [entry.rstrip("/") for entry in filesystem.ls(path, detail=False)]
    entries = sorted(entry.rsplit("/", 1)[-1] for entry in listed if entry != path.rstrip("/"))  # s3fs lists a folder
    return {"run_dir_entries": entries, "checkpoints": checkpoints, "latest": checkpoints[-1] if checkpoints else None,
            "attempts": [attempt.__dict__ for attempt in kerasdist.goodput(ckpt).attempts]}


def listening_snapshot(cluster: ray_cluster.RayCluster) -> dict:
    """Where the cluster's processes live and listen, now: each process's network namespace, the
    namespaces' interfaces and listening sockets, and the machine's own listening sockets held by
    a process of the cluster."""
    ours = {ns: f"net:[{os.stat(ray_cluster.NETNS_DIR / ns).st_ino}]"
            for ns in [cluster.namespace(n) for n in range(cluster.nodes)]}
    pids = cluster.pids()
    namespaces = {}
    for pid in pids:
        try:
            namespaces[pid] = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            pass  # ended meanwhile
    interfaces = {}
    for node in range(cluster.nodes):
        out = subprocess.run(["ip", "-n", cluster.namespace(node), "-br", "addr"], capture_output=True,
                             text=True, check=True).stdout
        interfaces[node] = {line.split()[0].split("@")[0]: line.split()[2:] for line in out.splitlines()}
    return {"ours": ours, "process_namespaces": namespaces, "interfaces": interfaces,
            "inside": {node: [vars(x) for x in cluster.listeners(node)] for node in range(cluster.nodes)},
            "machine": [vars(x) for x in cluster.listeners(None) if x.pid in pids]}


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure_recovery(kind: str, failures: int, after_steps: int = 8) -> dict:
    """One run failed `failures` times, each `after_steps` steps into a worker group."""
    nodes, cpus = (1, (2,)) if kind == "worker" else (2, (1, 1))
    trials = []
    with tempfile.TemporaryDirectory(prefix="ray-chaos-") as folder, \
            ray_cluster.RayCluster(nodes, cpus=cpus, env=cluster_env()) as cluster:
        steps = failures * after_steps + 10  # each group trains at least after_steps - 4 new steps
        run = ExampleRun(cluster, Path(folder), "chaos", "--max-failures", str(failures), epochs=-(-steps // 10))
        run.start()
        loads = [load()]
        for index in range(failures):
            deadline = time.monotonic() + RUN_TIMEOUT
            while run.steps_of_this_process() < after_steps:
                if time.monotonic() > deadline or run.driver.poll() is not None:
                    raise RuntimeError(f"no step {after_steps} in attempt {index}:\n{run.driver_log()}")
                time.sleep(0.02)
            lines = len(run.log(0))
            if kind == "worker":
                os.kill(run.pid(1), signal.SIGKILL)
            else:
                cluster.kill_node(1)
                cluster.start_node(1)
            seconds = run.stopwatch_to_first_resumed_step(lines)
            trials.append({"stopwatch": round(seconds, 3), "load": load()})
            print(f"failure {index + 1}: first resumed step {seconds:.2f} s after the kill", flush=True)
        result = run.finish()
        loads.append(load())
    recoveries = [a["recovery"] for a in result["attempts"][1:]]
    for trial, recovery in zip(trials, recoveries, strict=False):
        trial["goodput"] = recovery
    return {"kind": kind, "failures": failures, "returncode": result["returncode"], "trials": trials,
            "load_before_after": loads}


def print_summary(measured: dict) -> None:
    trials = [t for t in measured["trials"] if t.get("goodput")]

    def spread(values: list[float]) -> str:
        return f"median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})"

    print(f"{measured['kind']}: {len(trials)} recoveries, run exit {measured['returncode']}, "
          f"load {measured['load_before_after']}")
    print("  stopwatch (kill to first resumed step):", spread([t["stopwatch"] for t in trials]))
    print("  goodput (last step to first resumed step):", spread([t["goodput"]["total"] for t in trials]))
    print("  goodput - stopwatch:", spread([t["goodput"]["total"] - t["stopwatch"] for t in trials]))
    for part in ("detection", "down", "python_and_tensorflow", "cluster", "restore", "first_step"):
        print(f"    {part}: {spread([t['goodput'][part] for t in trials])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inspect", metavar="RUN_DIR", help=argparse.SUPPRESS)  # ExampleRun.finish's, in a namespace
    parser.add_argument("--kind", choices=("worker", "node"), default="worker")
    parser.add_argument("--failures", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the measurements to this JSON file")
    args = parser.parse_args(argv)
    if args.inspect:
        print(json.dumps(inspect_run(args.inspect)))
        return 0
    reason = ray_cluster.missing_requirements()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    measured = measure_recovery(args.kind, args.failures)
    print_summary(measured)
    if args.out:
        Path(args.out).write_text(json.dumps(measured, indent=1))
    return 0 if measured["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
