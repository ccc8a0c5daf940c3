"""How fast the `kerasdist` command answers (issue #29: `--help`, `--version` and every command's
`--help` in under 0.5 s, no TensorFlow import until a command needs it).

Side by side, alternating, `--repeats` times: `kerasdist --help`, `kerasdist checkpoints --help`,
`kerasdist --version` and `python -c pass` (the interpreter's own start, the floor), wall seconds
of each process; once, `python -m kerasdist --help` (which imports the package, and so TensorFlow)
for comparison. Figures: each command's seconds (target < 0.5) and its ratio to the floor.

    .venv/bin/python bench/bench_cli.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import figure, write_result  # noqa: E402

SCRIPT = Path(sys.executable).with_name("kerasdist")
COMMANDS = {"help": [str(SCRIPT), "--help"], "checkpoints_help": [str(SCRIPT), "checkpoints", "--help"],
            "version": [str(SCRIPT), "--version"]}
FLOOR = [sys.executable, "-c", "pass"]


def seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {name: [] for name in [*COMMANDS, "floor"]}
    for _ in range(args.repeats):
        for name, command in [*COMMANDS.items(), ("floor", FLOOR)]:
            runs[name].append(seconds(command))
    with_package = seconds([sys.executable, "-m", "kerasdist", "--help"])
    figures = []
    for name in COMMANDS:
        figures.append(figure(f"kerasdist {name.replace('_', ' ')} seconds", runs[name], "< 0.5",
                              f"wall seconds of `{' '.join(COMMANDS[name][1:])}`"))
        figures.append(figure(f"kerasdist {name.replace('_', ' ')} / python -c pass",
                              [a / b for a, b in zip(runs[name], runs["floor"], strict=True)], None,
                              "the same over the interpreter's own start, run by run"))
    write_result("cli", figures, floor_seconds=runs["floor"], python_m_kerasdist_help_seconds=with_package)


if __name__ == "__main__":
    main()
