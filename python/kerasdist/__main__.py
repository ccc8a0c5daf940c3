"""Command line: `python -m kerasdist COMMAND`."""

from __future__ import annotations

import argparse
import os
import sys


def _info(args: argparse.Namespace) -> int:
    from kerasdist.about import kerasdist_info
    from kerasdist.strategy import simulate_devices

    if args.devices:
        simulate_devices(args.devices)
    print(kerasdist_info(args.kind))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kerasdist", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = commands.add_parser("info", help="show versions and the strategy chosen here, and why")
    info.add_argument("--kind", default="auto", help='strategy kind (default "auto")')
    info.add_argument(
        "--devices", type=int, default=0, metavar="N",
        help="split the CPU into N logical devices first (simulate_devices)",
    )
    info.set_defaults(run=_info)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ValueError, RuntimeError) as err:
        print(f"kerasdist: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
