"""The `kerasdist` command (also `python -m kerasdist`).

A package of its own, beside `kerasdist`, because importing `kerasdist` imports TensorFlow (its
Keras fixes must be in before any strategy is made): `--help`, `--version` and every command's
`--help` answer without it, and each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys

DESCRIPTION = """\
kerasdist: distributed, fault-tolerant Keras 3 training on TensorFlow, from Python and R.
The Python API is `import kerasdist`; these commands show what this machine would run, start a
cluster of processes here, run the demo, time the strategies, list checkpoints and say what a
run's failures cost (goodput)."""

EXAMPLES = """\
examples:
  kerasdist info --devices 2                   the strategy "auto" picks here, and why
  kerasdist launch -n 2 -- train.py            train.py as a 2-worker cluster on this machine
  srun kerasdist supervise -- python train.py  each task restarts in place, warm, after a SIGKILL or a lost peer
  kerasdist checkpoints runs/demo/checkpoints  what a restart would resume from
  kerasdist goodput runs/demo/checkpoints      where the run's time went, failures included
  kerasdist demo                               train, kill, resume and plot on 2 CPU replicas

`kerasdist COMMAND --help` says more about each."""


def _info(args: argparse.Namespace) -> int:
    from kerasdist.about import kerasdist_info
    from kerasdist.strategy import simulate_devices

    if args.devices:
        simulate_devices(args.devices)
    print(kerasdist_info(args.kind))
    return 0


def _launch(args: argparse.Namespace) -> int:
    from kerasdist.launch import INTERRUPTED_EXIT_CODE, launch
    from kerasdist.preemption import SigtermHold

    command = list(args.launch_command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ValueError("launch: no command given: put it after --, e.g. "
                         "`kerasdist launch -n 2 -- train.py`.")

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        with SigtermHold(interrupted):  # a stopped launcher stops its group
            result = launch(
                command, num_workers=args.num_workers, num_ps=args.ps,
                max_restarts=args.max_restarts, host=args.host, timeout=args.timeout,
                grace_period=args.grace_period, startup_timeout=args.startup_timeout,
                min_workers=args.min_workers, warm_start=args.warm_start,
            )
    except KeyboardInterrupt:
        print("kerasdist launch: interrupted; the group was stopped.", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    return result.exit_code


def _demo(args: argparse.Namespace) -> int:
    from kerasdist import demo

    if args.kill_at:  # the demo's own child process, the run that gets killed
        return demo.run_child(args.run_dir, args.epochs, args.kill_at)
    demo.kerasdist_demo(args.run_dir, args.epochs)
    return 0


def _bench(args: argparse.Namespace) -> int:
    if args.worker_spec:  # one strategy's own process
        from kerasdist import advisor_worker

        advisor_worker.run_worker(args.worker_spec)
        return 0
    if not args.model:
        raise ValueError("bench: --model is required, e.g. --model kerasdist.example_models:tiny_dense")
    from kerasdist import advisor

    x = y = None
    if args.data:
        x, y = advisor.load_model_function(args.data)()
    report = advisor.bench_strategies(
        args.model, x, y, strategies=args.strategies, steps=args.steps, batch_size=args.batch_size,
        devices=args.devices, workers=args.workers, seed=args.seed, timeout=args.timeout,
        speed_options=args.speed_options,
    )
    print(report)
    if args.json:
        import json

        with open(args.json, "w") as out:
            json.dump(report.to_dict(), out, indent=1)
    return 0


def _add_bench(commands) -> None:
    bench = commands.add_parser(
        "bench",
        help="time your model under each strategy this machine can run and recommend one",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "The strategy advisor: trains --steps steps of the model under default, mirrored\n"
            "(over the GPUs, or --devices simulated CPU devices) and multi_worker (--workers\n"
            "processes on 127.0.0.1 through the launcher), each in its own process, at the same\n"
            "global batch; prints steps/s, the step time split into compute and input wait,\n"
            "and the strategy to use with the reason."
        ),
        epilog="example:\n  kerasdist bench --model kerasdist.example_models:mid_cnn --batch-size 128",
    )
    bench.add_argument("--model", metavar="MODULE:FUNCTION",
                       help="function returning a compiled Keras model, as module:function or file.py:function")
    bench.add_argument("--data", metavar="MODULE:FUNCTION",
                       help="function returning (x, y) to train on (default random data shaped for the model)")
    bench.add_argument("--strategies", type=lambda text: text.split(","), default=None,
                       metavar="S1,S2", help="subset of default,mirrored,multi_worker (default all)")
    bench.add_argument("--steps", type=_at_least(1), default=200, metavar="N",
                       help="timed steps per strategy (default 200)")
    bench.add_argument("--batch-size", type=_at_least(1), default=64, metavar="B",
                       help="global batch size, the same under every strategy (default 64)")
    bench.add_argument("--devices", type=_at_least(2), default=2, metavar="N",
                       help="CPU devices to simulate for mirrored when there is no GPU (default 2)")
    bench.add_argument("--workers", type=_at_least(2), default=2, metavar="N",
                       help="worker processes for multi_worker (default 2)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the data and shuffle (default 0)")
    bench.add_argument("--timeout", type=_positive_seconds, default=600, metavar="S",
                       help="seconds allowed per strategy (default 600)")
    bench.add_argument("--speed-options", action="store_true",
                       help="also time the recommended strategy with mixed precision and with XLA")
    bench.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    bench.add_argument("--worker-spec", help=argparse.SUPPRESS)
    bench.set_defaults(run=_bench)


def _add_demo(commands) -> None:
    demo = commands.add_parser(
        "demo",
        help="train a CNN on the bundled digits on 2 CPU replicas, kill it mid-epoch, resume, plot",
        description=(
            "The main job: simulate 2 CPU devices, select_strategy('auto') -> MirroredStrategy,\n"
            "distributed_fit a small CNN on the bundled UCI digits with checkpoints every epoch\n"
            "and every 5 steps, SIGKILL the training process mid-epoch, resume from the newest\n"
            "checkpoint, print the test accuracy and write RUN_DIR/curves.png."
        ),
        epilog="examples:\n  kerasdist demo\n  kerasdist demo --run-dir /tmp/demo --epochs 4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--run-dir", default="runs/demo", metavar="DIR",
                      help="where checkpoints, log.csv, curves.png and result.json go (default runs/demo)")
    demo.add_argument("--epochs", type=_at_least(1), default=6, metavar="N",
                      help="total epochs; the kill happens in the middle one (default 6)")
    demo.add_argument("--kill-at", default=None, help=argparse.SUPPRESS)
    demo.set_defaults(run=_demo)


def _at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _add_launch(commands) -> None:
    launch = commands.add_parser(
        "launch",
        help="run a command as a local TF_CONFIG cluster, restarting it on failure (--max-restarts)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="kerasdist launch -n N [--ps P] [--max-restarts R] [--min-workers M] [--warm-start] "
              "[--host HOST] [--timeout S] -- COMMAND ...",
        description=(
            "Start one process per task of a cluster on this machine, each with its own\n"
            "TF_CONFIG (and KERASDIST_TASK_TYPE, KERASDIST_TASK_INDEX, KERASDIST_RESTART).\n"
            "Output lines are prefixed with the task: [worker 0] ...\n"
            "If a process fails (non-zero exit, status 75 'preempted' included, or a signal),\n"
            "the whole group is stopped and restarted on fresh ports, up to --max-restarts\n"
            "times, so training resumes from its latest checkpoint; with --min-workers M < N\n"
            "a group still failing then goes on with one worker fewer (restarts again),\n"
            "down to M workers, from the newest checkpoint. With --ps P > 0 the\n"
            "cluster also has a 'chief' task: ParameterServerStrategy's coordinator.\n\n"
            "COMMAND: a first word ending in .py runs with this Python, one ending in .R\n"
            "with Rscript; anything else runs as given.\n\n"
            "Security: TensorFlow's gRPC servers have no authentication. TF_CONFIG names\n"
            "127.0.0.1 by default, but TensorFlow listens on its ports on every interface:\n"
            "never run this where an untrusted network can reach the ports (firewall them)."
        ),
        epilog=(
            "exit status: 0 when the run finished; the failing process's status (128+N if\n"
            "killed by signal N) when restarts ran out; 124 on --timeout, or when a task did\n"
            "not come up within --startup-timeout and restarts ran out; 130 when the launcher\n"
            "was interrupted (Ctrl-C, SIGTERM) and stopped the group; 2 on bad input.\n"
            "--max-restarts defaults to 0: without it a failure ends the run.\n\n"
            "example:\n  kerasdist launch -n 2 --max-restarts 3 -- train.py --epochs 5"
        ),
    )
    launch.add_argument("-n", "--num-workers", type=_at_least(1), required=True, metavar="N",
                        help="number of worker tasks (at least 1)")
    launch.add_argument("--ps", type=_at_least(0), default=0, metavar="P",
                        help="number of parameter-server tasks; P > 0 adds a chief (default 0)")
    launch.add_argument("--max-restarts", type=_at_least(0), default=0, metavar="R",
                        help="restarts of the whole group allowed after failures (default 0)")
    launch.add_argument("--min-workers", type=_at_least(1), default=None, metavar="M",
                        help="go on with fewer workers, down to M, when failures outlast the restarts "
                             "(default: N, never fewer)")
    launch.add_argument("--warm-start", action="store_true", default=None,
                        help="fork each Python task from a process that has already imported "
                             "TensorFlow: starts and restarts skip that import (KERASDIST_WARM_START "
                             "names a running server to use)")
    launch.add_argument("--host", default="127.0.0.1",
                        help="local address for TF_CONFIG and the ports (default 127.0.0.1)")
    launch.add_argument("--timeout", type=_positive_seconds, default=None, metavar="S",
                        help="wall-clock limit for the whole run, restarts included (seconds)")
    launch.add_argument("--startup-timeout", type=_positive_seconds, default=None, metavar="S",
                        help="fail, naming it, a worker or ps task whose server is not up after S s")
    launch.add_argument("--grace-period", type=_positive_seconds, default=10.0, metavar="S",
                        help="seconds between SIGTERM and SIGKILL when stopping (default 10)")
    launch.add_argument("launch_command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the program to run for every task, and its arguments")
    launch.set_defaults(run=_launch)


def _supervise(args: argparse.Namespace) -> int:
    import importlib.util

    command = list(args.supervise_command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ValueError("supervise: no command given: put it after --, e.g. "
                         "`kerasdist supervise --max-restarts 3 -- python train.py`.")
    # launch/supervisor.py by path: importing kerasdist.launch would import TensorFlow here, before
    # the exec, into a process about to be replaced
    spec = importlib.util.find_spec("kerasdist")
    if spec is None or spec.origin is None:
        raise RuntimeError("supervise: the kerasdist package is not installed for this Python.")
    path = os.path.join(os.path.dirname(spec.origin), "launch", "supervisor.py")
    module_spec = importlib.util.spec_from_file_location("_kerasdist_supervisor", path)
    supervisor = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
    sys.modules[module_spec.name] = supervisor  # type: ignore[union-attr]  # (its dataclass looks itself up)
    module_spec.loader.exec_module(supervisor)  # type: ignore[union-attr]
    settings = supervisor.Settings(args.max_restarts, args.form_timeout, args.restart_log)
    supervisor.exec_supervised(command, settings)  # never returns
    return 0


def _add_supervise(commands) -> None:
    supervise = commands.add_parser(
        "supervise",
        help="run a training task that restarts in place, warm, after a SIGKILL or a lost peer (76)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="kerasdist supervise [--max-restarts R] [--form-timeout S] [--restart-log FILE] -- COMMAND ...",
        description=(
            "Run one task of a multi-worker cluster (what a scheduler starts per task, e.g.\n"
            "srun) under a supervisor that imports TensorFlow once and forks the training\n"
            "process from itself. When that process is SIGKILLed (out of memory, `kill -9`) or\n"
            "exits 76 (it lost a peer), the supervisor forks a new one at once, in place:\n"
            "no interpreter start, no TensorFlow import, no new step; up to --max-restarts\n"
            "times. Signals are passed on to the training process; a signalled supervisor\n"
            "never restarts it (SIGTERM: it saves and exits 75). Otherwise the supervisor\n"
            "exits as the training process did. A restarted process that has not formed its\n"
            "cluster within --form-timeout seconds is killed and the supervisor exits 76.\n\n"
            "COMMAND: a Python interpreter and its options, then a script, -c or -m (a first\n"
            "word ending in .py runs with this Python). Anything else (Rscript train.R) runs\n"
            "as given, cold, without a supervisor."
        ),
        epilog=(
            "exit status: the training process's (128+N, or death by signal N, if killed by\n"
            "it); 75 when signalled with no training process running; 76 when a restarted one\n"
            "did not form its cluster in time; 2 on bad input.\n\n"
            "example:\n  srun kerasdist supervise --max-restarts 3 -- python train.py --epochs 5"
        ),
    )
    supervise.add_argument("--max-restarts", type=_at_least(0), default=3, metavar="R",
                           help="in-place restarts allowed (default 3)")
    supervise.add_argument("--form-timeout", type=_positive_seconds, default=60.0, metavar="S",
                           help="seconds a restarted process has to form its cluster (default 60)")
    supervise.add_argument("--restart-log", default=None, metavar="FILE",
                           help="append a line per in-place restart: TASK STATUS ($SLURM_PROCID or -)")
    supervise.add_argument("supervise_command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                           help="the training command and its arguments")
    supervise.set_defaults(run=_supervise)


def _add_info(commands) -> None:
    info = commands.add_parser(
        "info", help="show versions and the strategy chosen here, and why",
        description="Versions of kerasdist, TensorFlow, Keras, NumPy and Python, and the strategy\n"
                    "select_strategy(KIND) gives on this machine with the reason (TF_CONFIG, Slurm,\n"
                    "TPU, GPUs). Imports TensorFlow.",
        epilog="examples:\n  kerasdist info\n  kerasdist info --devices 2 --kind mirrored",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    info.add_argument("--kind", default="auto", help='strategy kind (default "auto")')
    info.add_argument("--devices", type=_at_least(0), default=0, metavar="N",
                      help="split the CPU into N logical devices first (simulate_devices)")
    info.set_defaults(run=_info)


def _checkpoints(args: argparse.Namespace) -> int:
    import json

    from kerasdist.checkpoint import checkpoint_table

    rows = checkpoint_table(args.checkpoint_dir)
    print(json.dumps(rows, indent=1) if args.json else format_checkpoint_table(rows, args.checkpoint_dir))
    return 0


def format_checkpoint_table(rows: list[dict], checkpoint_dir: str) -> str:
    """`checkpoint_table`'s rows as the text `kerasdist checkpoints` prints."""
    if not rows:
        return f"{checkpoint_dir}: no checkpoints"
    header = ("step", "epoch", "batch", "saved at (UTC)", "size", "state")
    lines = [header]
    for row in rows:
        state = "valid" if row["valid"] else f"damaged: {row['problem']}"
        if row["restart"]:
            state += " <- a restart resumes here"
        lines.append((
            _text(row["global_step"]), _text(row["epoch"]), _text(row["step_in_epoch"]),
            (row["saved_at"] or "-").replace("T", " ")[:19], _size(row["size"]), state,
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(line[:-1], widths, strict=True))
                     + "  " + line[-1] for line in lines)


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _size(size: int | None) -> str:
    if size is None:
        return "-"
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KB", "MB", "GB"):
        value /= 1024
        if value < 1024 or unit == "GB":
            break
    return f"{value:.1f} {unit}"


def _directory_command(commands, name: str, json_help: str, **texts: str) -> argparse.ArgumentParser:
    """A command that reads a checkpoint directory or URL (`checkpoints`, `goodput`), with --json."""
    command = commands.add_parser(name, formatter_class=argparse.RawDescriptionHelpFormatter, **texts)
    command.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR", help="directory or URL")
    command.add_argument("--json", action="store_true", help=json_help)
    return command


def _add_checkpoints(commands) -> None:
    checkpoints = _directory_command(
        commands, "checkpoints", "print the rows as JSON instead of a table",
        help="list the checkpoints of a directory or bucket, and which a restart uses",
        description="Every checkpoint in CHECKPOINT_DIR (a directory, or an s3://, gs:// or file://\n"
                    "URL), oldest first: its step, epoch and batch within the epoch, when it was\n"
                    "saved, its size, whether it is valid (files checked against their checksums)\n"
                    "or why not, and which one a restart would resume from. Object stores are\n"
                    "reached with the ecosystem's configuration (AWS_* variables, credentials files).",
        epilog="examples:\n  kerasdist checkpoints runs/demo/checkpoints\n"
               "  kerasdist checkpoints s3://bucket/run --json",
    )
    checkpoints.set_defaults(run=_checkpoints)


def _goodput(args: argparse.Namespace) -> int:
    import json

    from kerasdist.goodput import goodput, plot_goodput

    report = goodput(args.checkpoint_dir)
    print(json.dumps(report.as_dict(), indent=1) if args.json else report)
    if args.plot:
        plot_goodput(report, args.plot)
        if not args.json:
            print(f"timeline: {args.plot}")
    return 0


def _add_goodput(commands) -> None:
    command = _directory_command(
        commands, "goodput", "print the report as JSON",
        help="where a run's time went: training, start-up, restores, saves, redone work, downtime",
        description="Read the run log the chief writes beside the checkpoints (CHECKPOINT_DIR/runs/, a\n"
                    "directory or an s3://, gs:// or file:// URL) and split the wall time from the first\n"
                    "start of the run to its end into productive training, start-up, restore, checkpoint\n"
                    "blocking, redone work (steps trained again after a failure), evaluation, other and\n"
                    "downtime (no process running, e.g. a requeue waiting); goodput = productive / wall.\n"
                    "With failures and saves, also the checkpoint interval that loses least time\n"
                    "(Young/Daly: sqrt(2 x save cost x mean time between failures)).",
        epilog="examples:\n  kerasdist goodput runs/demo/checkpoints\n"
               "  kerasdist goodput s3://bucket/run --json --plot timeline.png",
    )
    command.add_argument("--plot", metavar="PNG", help="also draw the run's timeline, failures marked, into PNG")
    command.set_defaults(run=_goodput)


def version() -> str:
    """kerasdist's version, read from its about.py without importing the package (which imports
    TensorFlow); faster than the installed package's metadata, which means scanning site-packages."""
    import importlib.util
    import re
    from pathlib import Path

    spec = importlib.util.find_spec("kerasdist")
    about = Path(spec.origin).with_name("about.py") if spec and spec.origin else None
    found = re.search(r'^VERSION = "([^"]+)"', about.read_text(), re.M) if about and about.is_file() else None
    return found.group(1) if found else "unknown (kerasdist is not installed)"


class _VersionAction(argparse.Action):
    """--version, looked up only when asked: reading the package metadata takes longer than
    everything else --help does."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object):
        super().__init__(option_strings, dest, nargs=0, help="show kerasdist's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(f"kerasdist {version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kerasdist", description=DESCRIPTION, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_info(commands)
    _add_launch(commands)
    _add_supervise(commands)
    _add_checkpoints(commands)
    _add_goodput(commands)
    _add_demo(commands)
    _add_bench(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command != "supervise":  # (a supervised command gets the environment it was given)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        return int(args.run(args))
    except (ValueError, RuntimeError) as err:
        print(f"kerasdist: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
