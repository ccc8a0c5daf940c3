"""A stand-in for a training process, for the launcher tests (no TensorFlow).

usage: launch_probe.py RECORD_DIR [--fail TASK --exit N | --signal NAME] [--always]
                       [--serve TYPE,...] [--sleep S] [--clash-once MARKER] [--wait-all]

Writes RECORD_DIR/<restart>-<type>-<index>.json (TF_CONFIG, the KERASDIST_* variables, its pid),
prints one line on stdout and one on stderr, then: the task named by --fail ("worker 1") exits
with --exit N or kills itself with --signal NAME, on the first attempt only unless --always;
tasks whose type is in --serve sleep until stopped, like TensorFlow servers; the others sleep
--sleep seconds if the first attempt has a failure pending, then exit 0. --clash-once prints a
port-clash message and exits 1 the first time MARKER does not exist (creating it). --wait-all:
wait (at most 10 s) until every task of the cluster has written its record before going on.
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("record_dir")
parser.add_argument("--fail", default="")
parser.add_argument("--exit", type=int, default=1)
parser.add_argument("--signal", default="")
parser.add_argument("--always", action="store_true")
parser.add_argument("--serve", default="")
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--clash-once", default="")
parser.add_argument("--wait-all", action="store_true")
args = parser.parse_args()

task_type = os.environ["KERASDIST_TASK_TYPE"]
index = int(os.environ["KERASDIST_TASK_INDEX"])
restart = int(os.environ["KERASDIST_RESTART"])
me = f"{task_type} {index}"
record = {
    "tf_config": json.loads(os.environ["TF_CONFIG"]),
    "task_type": task_type, "task_index": index, "restart": restart, "pid": os.getpid(),
    "cwd": os.getcwd(), "extra": os.environ.get("PROBE_EXTRA"),
}
# written whole, then renamed: the test polls the folder and must never read a file half written
written = Path(args.record_dir, f".{restart}-{task_type}-{index}.json.tmp")
written.write_text(json.dumps(record))
os.replace(written, Path(args.record_dir, f"{restart}-{task_type}-{index}.json"))
print(f"hello from {me} (restart {restart})", flush=True)
print(f"note on stderr from {me}", file=sys.stderr, flush=True)

if args.wait_all:
    tasks = sum(len(a) for a in record["tf_config"]["cluster"].values())
    deadline = time.monotonic() + 10
    while len(list(Path(args.record_dir).glob(f"{restart}-*.json"))) < tasks:
        if time.monotonic() > deadline:
            sys.exit(f"{me}: the other tasks did not start")
        time.sleep(0.05)

if args.clash_once and not os.path.exists(args.clash_once):
    Path(args.clash_once).touch()
    print("E0000 server.cc: bind: Address already in use", file=sys.stderr, flush=True)
    sys.exit(1)

first_attempt = restart == 0 or args.always
if me == args.fail and first_attempt:
    time.sleep(0.3)  # let the others start, so the launcher has a group to stop
    if args.signal:
        os.kill(os.getpid(), getattr(signal, f"SIG{args.signal}"))
        time.sleep(10)
    sys.exit(args.exit)
if task_type in args.serve.split(","):
    while True:
        time.sleep(1)
if first_attempt and args.fail:
    time.sleep(args.sleep)
Path(args.record_dir, f"{restart}-{task_type}-{index}.done").touch()
print(f"{me} done", flush=True)
