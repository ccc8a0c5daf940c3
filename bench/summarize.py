"""Turn every bench/results/*.json into bench/results/summary.md and bench/results/summary.png.

Each results file is what bench/_common.py's write_result writes: {"benchmark", "device",
"figures": [{"name", "median", "min", "max", "runs", "target", "met", "what", ...}], ...details}.
summary.md has the date, the device(s), one table row per figure (median, spread over the runs,
target, met: yes / NO / info) and, for a file with a "reports" list ({"model", "text"}, the
strategy advisor's output), each text verbatim. summary.png draws each figure's median with its
min-max spread, a mark at its target, coloured by met / not met / informational. The table is
printed to stdout too. Files are taken in the order they were written (the order of the run);
with --since (a Unix time, bench/run.sh passes its start), older files are marked stale.

    .venv/bin/python bench/summarize.py [--results bench/results] [--since UNIX_TIME]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
COLOURS = {True: "#2e7d32", False: "#c62828", None: "#9e9e9e"}
TARGET_COLOUR = "#1565c0"


def load(results: Path) -> tuple[list[tuple[Path, dict]], list[str]]:
    """The results files in the order they were written, and the problems met reading them."""
    loaded, problems = [], []
    paths = [p for p in results.glob("*.json") if not p.name.startswith("summary")]
    for path in sorted(paths, key=lambda p: (p.stat().st_mtime, p.name)):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            problems.append(f"{path.name}: unreadable ({err})")
            continue
        if not isinstance(result, dict):
            problems.append(f"{path.name}: not a JSON object")
            continue
        loaded.append((path, result))
    return loaded, problems


def number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 0.01 else f"{value:.3f}"


def met_word(met: bool | None) -> str:
    return "info" if met is None else ("yes" if met else "NO")


def cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def rows_of(loaded: list[tuple[Path, dict]], since: float | None) -> list[dict]:
    rows = []
    for path, result in loaded:
        benchmark = str(result.get("benchmark", path.stem))
        if since is not None and path.stat().st_mtime < since:
            benchmark += " (stale)"
        for fig in result.get("figures") or []:
            runs = fig.get("runs") or []
            rows.append({"benchmark": benchmark, "name": fig.get("name", "?"),
                         "median": fig.get("median"), "min": fig.get("min"), "max": fig.get("max"),
                         "n": len(runs), "target": fig.get("target"), "met": fig.get("met"),
                         "what": fig.get("what", "")})
    return rows


def table(rows: list[dict]) -> list[str]:
    lines = ["| benchmark | figure | median | spread (min-max, n runs) | target | met | what |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        spread = f"{number(r['min'])}-{number(r['max'])}, {r['n']} run{'s' if r['n'] != 1 else ''}"
        lines.append(f"| {cell(r['benchmark'])} | {cell(r['name'])} | {number(r['median'])} | {spread} "
                     f"| {cell(r['target'] or '-')} | {met_word(r['met'])} | {cell(r['what'])} |")
    return lines


def markdown(loaded, rows, problems, since: float | None) -> str:
    devices = sorted({str(res["device"]) for _, res in loaded if res.get("device")})
    out = ["# Benchmark results", "",
           f"Written {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by `bench/summarize.py`.", "",
           f"Device{'s' if len(devices) > 1 else ''}: {'; '.join(devices) or 'none'}.", ""]
    counts = {word: sum(met_word(r["met"]) == word for r in rows) for word in ("yes", "NO", "info")}
    out += [f"{len(rows)} figures: {counts['yes']} targets met, {counts['NO']} not met, "
            f"{counts['info']} informational. Each is a ratio measured side by side in one run "
            "(variants interleaved); median and min-max over the repetitions.", ""]
    out.append("Results files (in the order written):")
    out.append("")
    for path, result in loaded:
        mtime = path.stat().st_mtime
        stale = " **stale: written before this run**" if since is not None and mtime < since else ""
        nfig = len(result.get("figures") or [])
        what = f"{nfig} figure{'s' if nfig != 1 else ''}" if nfig else "no figures"
        out.append(f"- `{path.name}`: {time.strftime('%Y-%m-%d %H:%M', time.localtime(mtime))}, "
                   f"{what}{stale}")
    for problem in problems:
        out.append(f"- {problem}")
    out += ["", *table(rows), "", "![figures](summary.png)", ""]
    reports = [(res.get("benchmark", path.stem), rep) for path, res in loaded
               for rep in res.get("reports") or []]
    if reports:
        out += ["## Strategy advisor", ""]
        for benchmark, rep in reports:
            out += [f"### {rep.get('model', '?')} ({benchmark})", "", "```text",
                    str(rep.get("text", "")).rstrip("\n"), "```", ""]
    return "\n".join(out)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * max(len(rows), 1)))
    if not rows:
        ax.text(0.5, 0.5, "no figures", ha="center", va="center")
        ax.set_axis_off()
    ys = list(range(len(rows)))[::-1]
    for y, r in zip(ys, rows, strict=True):
        med = r["median"]
        if med is None:
            continue
        lo, hi = r["min"] if r["min"] is not None else med, r["max"] if r["max"] is not None else med
        ax.barh(y, med, color=COLOURS[r["met"]], height=0.6,
                xerr=[[med - lo], [hi - med]], capsize=3, error_kw={"elinewidth": 1})
        if r["target"]:
            try:
                bound = float(str(r["target"]).split()[-1])
            except ValueError:
                continue
            ax.plot([bound], [y], marker="|", markersize=20, markeredgewidth=3, color=TARGET_COLOUR)
    if rows:
        ax.set_yticks(ys, [f"{r['benchmark']}: {r['name']}" for r in rows], fontsize=8)
        ax.axvline(1.0, color="black", linewidth=0.6, linestyle=":")
        ax.set_xlabel("ratio: median, bar from min to max over the runs")
        ax.legend(handles=[Patch(color=COLOURS[True], label="target met"),
                           Patch(color=COLOURS[False], label="target not met"),
                           Patch(color=COLOURS[None], label="informational"),
                           Line2D([], [], color=TARGET_COLOUR, marker="|", linestyle="none",
                                  markersize=10, markeredgewidth=2, label="target")],
                  fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=4, frameon=False)
    ax.set_title("kerasdist benchmarks", fontsize=10, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--since", type=float, help="Unix time the run started: older files are marked stale")
    args = parser.parse_args()
    loaded, problems = load(args.results)
    rows = rows_of(loaded, args.since)
    (args.results / "summary.md").write_text(markdown(loaded, rows, problems, args.since))
    plot(rows, args.results / "summary.png")
    print("\n".join(table(rows)))
    for problem in problems:
        print(f"summarize: {problem}", file=sys.stderr)
    print(f"\nwrote {args.results / 'summary.md'} and {args.results / 'summary.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
