"""#30 items 1 and 6 on one machine: how fast a lost peer is seen, and how fast a launch goes on
without it (the figures in RELIABILITY.md, "A lost peer").

  python tools/lost_peer.py --trials 5 [--network-down]

Each trial runs two things on 127.0.0.1:
- seen: two workers started as separate processes with TF_CONFIG (as on two hosts, no launcher
  in between); worker 1 SIGKILLs itself after step 11 (tests/python/scripts/train_multi_worker.py
  --die-at-step); the seconds from its death to worker 0's exit, which must be status 76.
  With --network-down (needs root) each worker is on a host of its own instead (a network
  namespace; the two joined by a veth pair) and worker 1 sets its link down after step 11: no
  reset reaches worker 0, only silence; the seconds from then to worker 0's exit.
- shrink: `kerasdist launch -n 2 --min-workers 1` of tests/python/scripts/train_anywhere.py
  (resume_fit, a checkpoint every step), worker 1 SIGKILLed after step 13; the seconds from the
  kill to the first step of the one-worker group, and the steps that group trained again.
Prints one line per trial, then the median and the range of each figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from kerasdist.launch.ports import free_ports

ROOT = Path(__file__).resolve().parents[1]
MULTI_WORKER = ROOT / "tests" / "python" / "scripts" / "train_multi_worker.py"
ANYWHERE = ROOT / "tests" / "python" / "scripts" / "train_anywhere.py"
KILL_AT = 13


def seen(work: Path) -> tuple[int, float, str, float | None, float]:
    """(worker 0's exit status, seconds from worker 1's death to worker 0's exit, worker 0's stderr,
    seconds from that death to worker 0's line saying the peer was lost, or None without one: the
    exit also counts the interpreter's end after it, which a loaded machine can stretch; seconds
    from the end of worker 1's last step to worker 0's exit: the death waits for the chief's save
    of that step, and worker 0 counts its wait from the step's end)."""
    workers = [f"127.0.0.1:{port}" for port in free_ports("127.0.0.1", 2)]
    processes = []
    for index in (0, 1):
        processes.append(start_worker(work, workers, index, "--die-at-step", "11", stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE if index == 0 else subprocess.DEVNULL))
    timer = threading.Timer(300, lambda: [process.kill() for process in processes])  # nothing hangs
    timer.start()
    try:
        processes[1].wait()
        died = time.monotonic()
        lines, said = [], None
        for line in processes[0].stderr:  # type: ignore[union-attr]
            lines.append(line)
            if said is None and "of this multi-worker cluster was lost" in line:
                said = time.monotonic() - died
        processes[0].wait()
        waited = time.monotonic() - died
        after_step_end = float((work / "weights-killed-after-step-end").read_text())
        return processes[0].returncode, waited, "".join(lines), said, waited + after_step_end
    finally:
        timer.cancel()
        for process in processes:
            process.kill()


def start_worker(work: Path, workers: list[str], index: int, *fault: str, prefix: tuple[str, ...] = (),
                  **streams: object) -> subprocess.Popen:
    """Worker `index` of `workers` (train_multi_worker.py, a checkpoint every step in work/ckpt),
    with its `fault` options, started through `prefix` (e.g. `ip netns exec NS`)."""
    config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
    return subprocess.Popen(
        [*prefix, sys.executable, str(MULTI_WORKER), str(work / "weights"), "--checkpoint-dir", str(work / "ckpt"),
         "--every-steps", "1", "--epochs", "40", *fault],
        text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_CONFIG": config}, **streams)  # type: ignore[call-overload]


def stalled(work: Path, *stalls: str) -> list[tuple[int, str, str]]:
    """Two workers started as in `seen`, training 2 epochs with train_multi_worker.py's
    `--stall TASK:STEP:SECONDS` options (a step or save that long): (status, stdout, stderr) of each."""
    workers = [f"127.0.0.1:{port}" for port in free_ports("127.0.0.1", 2)]
    options = [item for stall in stalls for item in ("--stall", stall)]
    processes = [start_worker(work, workers, index, "--epochs", "2", *options, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for index in (0, 1)]
    try:
        outputs = [process.communicate(timeout=300) for process in processes]
        return [(process.returncode, *output) for process, output in zip(processes, outputs, strict=True)]
    finally:
        for process in processes:
            process.kill()
            process.wait()


def seen_network_down(work: Path) -> tuple[int, int, float, str, str]:
    """(worker 0's exit status, worker 1's, seconds from worker 1's link going down to worker 0's
    exit, worker 0's stderr, worker 1's), each worker in a network namespace of its own (needs root)."""
    processes: list[subprocess.Popen] = []
    work.mkdir(parents=True, exist_ok=True)
    peer_err = work / "worker-1.err"
    deadline = threading.Timer(300, lambda: [process.kill() for process in processes])  # nothing hangs
    with _two_hosts() as (namespaces, links, addresses), peer_err.open("w") as peer_stderr:
        try:
            workers = [f"{address}:8888" for address in addresses]  # each host has its own ports
            for index in (0, 1):
                processes.append(start_worker(
                    work, workers, index, "--link-down-at-step", "11", "--link", links[1],
                    prefix=("ip", "netns", "exec", namespaces[index]),
                    stdout=subprocess.PIPE if index == 1 else subprocess.DEVNULL,
                    stderr=subprocess.PIPE if index == 0 else peer_stderr))
            deadline.start()
            for line in processes[1].stdout:  # type: ignore[union-attr]
                if line.strip() == "link down":
                    break
            down = time.monotonic()
            _, err = processes[0].communicate(timeout=300)
            waited = time.monotonic() - down
            peer_status = processes[1].wait(timeout=300)
        finally:
            deadline.cancel()
            for process in processes:
                process.kill()
                process.wait()
    return processes[0].returncode, peer_status, waited, err, peer_err.read_text()


@contextlib.contextmanager
def _two_hosts() -> Iterator[tuple[list[str], list[str], list[str]]]:
    """Two network namespaces joined by a veth pair, each end up with an address: (namespaces,
    links, addresses), the namespaces deleted on the way out."""
    tag = f"kdln{os.getpid() % 100000}"
    namespaces, links = [f"{tag}w0", f"{tag}w1"], [f"{tag}a", f"{tag}b"]
    addresses = [f"10.253.{os.getpid() % 250}.{host}" for host in (1, 2)]
    try:
        for ns in namespaces:
            _ip("netns", "add", ns)
        _ip("link", "add", links[0], "netns", namespaces[0], "type", "veth", "peer", "name", links[1],
            "netns", namespaces[1])
        for ns, link, address in zip(namespaces, links, addresses, strict=True):
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", ns, "link", "set", link, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield namespaces, links, addresses
    finally:
        for ns in namespaces:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def shrink(work: Path) -> tuple[float, int]:
    """(seconds from the kill to the one-worker group's first step, steps it trained again)."""
    command = [sys.executable, "-m", "kerasdist", "launch", "-n", "2", "--min-workers", "1", "--grace-period", "2",
               "--", str(ANYWHERE), str(work / "ckpt"), str(work / "final.npz"), "--strategy", "auto",
               "--api", "resume_fit", "--kill-at-step", str(KILL_AT), "--kill-task", "worker:1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"})
    killed = going_on = None
    last_step = first_step = 0
    for line in process.stdout:
        now = time.monotonic()
        if line.startswith(f"[worker 1] step {KILL_AT}"):
            killed = now
        elif "going on with 1 worker" in line:
            going_on = now
        elif going_on and (step := re.match(r"\[worker 0\] step (\d+)$", line.strip())):
            first_step = int(step[1])
            process.kill()
            break
        elif step := re.match(r"\[worker 0\] step (\d+)$", line.strip()):
            last_step = int(step[1])
    process.wait()
    if killed is None or not first_step:
        raise RuntimeError("the launch did not go on with one worker")
    return now - killed, max(0, last_step - first_step + 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--network-down", action="store_true", help="a host's network goes down instead")
    args = parser.parse_args()
    if args.network_down:
        return network_down_trials(args.trials)
    seen_seconds, shrink_seconds, redone = [], [], []
    for trial in range(args.trials):
        with tempfile.TemporaryDirectory(prefix="kerasdist-lost-peer-") as work:
            status, seconds, *_ = seen(Path(work) / "seen")
            if status != 76:
                raise RuntimeError(f"trial {trial}: worker 0 exited with {status}, not 76")
            continued, steps = shrink(Path(work) / "shrink")
        seen_seconds.append(seconds)
        shrink_seconds.append(continued)
        redone.append(steps)
        print(f"trial {trial}: lost peer seen, exit 76 after {seconds:.1f} s; one worker trains again "
              f"{continued:.1f} s after the kill, {steps} step(s) redone", flush=True)
    for name, values, unit in (("exit 76 after the peer's death", seen_seconds, " s"),
                               ("first step of the smaller group after the kill", shrink_seconds, " s"),
                               ("steps redone", redone, "")):
        print(f"{name}: median {statistics.median(values):.1f}{unit}, range {min(values):.1f}-{max(values):.1f}{unit}"
              f" ({len(values)} trials)")
    return 0


def network_down_trials(trials: int) -> int:
    waited = []
    for trial in range(trials):
        with tempfile.TemporaryDirectory(prefix="kerasdist-network-down-") as work:
            status, peer_status, seconds, err, _ = seen_network_down(Path(work))
        if status != 76:
            raise RuntimeError(f"trial {trial}: worker 0 exited with {status}, not 76: {err[-2000:]}")
        waited.append(seconds)
        print(f"trial {trial}: host 1's network down, worker 0 exits 76 after {seconds:.1f} s "
              f"(worker 1 exits {peer_status})", flush=True)
    print(f"exit 76 after the peer's network went down: median {statistics.median(waited):.1f} s, "
          f"range {min(waited):.1f}-{max(waited):.1f} s ({len(waited)} trials)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
