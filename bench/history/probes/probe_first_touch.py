"""What touching fresh memory costs on this machine, apart from any disk (issue #47: a process's
first save and a cold restore both fill memory the process never held). Prints one JSON line.

Each round starts a fresh Python process (numpy only, no TensorFlow) that, for SIZE bytes:
- `first_touch`: writes one byte per page of a new buffer (memory the process never held);
- `touched_again`: writes them again (memory it holds);
- `freed_then_touched`: frees the buffer, makes a new one and touches it (pages the kernel just got
  back from this process);
- `read_into_fresh` / `read_into_touched`: reads a SIZE file (the page cache dropped before each
  read when run as root) into a new buffer, then into a buffer already touched.
With `--drop-caches`, the page cache is dropped before each process starts, as bench_checkpoint_scale's
cold restores do. The memory it frees is reported to the hypervisor a few seconds later (this VM's
virtio-balloon free page reporting); `--settle S` has the child wait S seconds before touching
anything, as a restore's process does while it imports TensorFlow and builds the model. A first
touch slower after settling than before is the VM's cost, not the process's.

usage: .venv/bin/python bench/history/probes/probe_first_touch.py 600M [--rounds 4] [--drop-caches] [--settle 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")

CHILD = r"""
import json, os, sys, time
import numpy as np

size, path, drop = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"  # argv[4]: seconds to settle
page = os.sysconf("SC_PAGE_SIZE")

def touch(buffer):
    started = time.perf_counter()
    buffer[::page] = 1
    return time.perf_counter() - started

def drop_caches():
    if drop:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")

def read_into(buffer):
    drop_caches()
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        view, done = memoryview(buffer), 0
        while done < size:
            done += f.readinto(view[done:done + (64 << 20)])
    return time.perf_counter() - started

time.sleep(float(sys.argv[4]))
out = {}
buffer = np.empty(size, np.uint8)
out["first_touch"] = touch(buffer)
out["touched_again"] = touch(buffer)
del buffer
buffer = np.empty(size, np.uint8)
out["freed_then_touched"] = touch(buffer)
del buffer
out["read_into_fresh"] = read_into(np.empty(size, np.uint8))
touched = np.empty(size, np.uint8)
touch(touched)
out["read_into_touched"] = read_into(touched)
print(json.dumps(out))
"""


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")


def one_round(size: int, path: Path, drop: bool, settle: float) -> dict[str, float]:
    if drop:
        drop_caches()
    done = subprocess.run([sys.executable, "-c", CHILD, str(size), str(path), "1" if drop else "0", str(settle)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--drop-caches", action="store_true")
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds the child waits before touching anything (the VM reports freed memory "
                             "to the hypervisor a few seconds after it is freed)")
    args = parser.parse_args()
    size = parse_size(args.size)
    with tempfile.TemporaryDirectory(dir=Path.home()) as folder:
        path = Path(folder) / "bytes"
        with open(path, "wb") as f:
            for _ in range(0, size, 64 << 20):
                f.write(os.urandom(min(64 << 20, size - f.tell())))
        rounds = [one_round(size, path, args.drop_caches, args.settle) for _ in range(args.rounds)]
    summary = {key: {"median": statistics.median(r[key] for r in rounds),
                     "min": min(r[key] for r in rounds), "max": max(r[key] for r in rounds)} for key in rounds[0]}
    print(json.dumps({"size": size, "drop_caches": args.drop_caches, "settle": args.settle, "load": os.getloadavg()[0],
                      "rounds": rounds, "summary": summary}))


if __name__ == "__main__":
    main()
