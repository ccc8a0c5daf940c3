"""The records open with their figures of record: bench/README.md's table holds the newest recorded
result of each figure it names (bench/results/*.json where a run left them, else the committed
bench/results/summary.md), and RELIABILITY.md's table holds the figures its sections record."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\|(.+)\|\s*$", re.M)


def _first_table(text: str, heading: str) -> list[list[str]]:
    section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in match.group(1).split("|")] for match in ROW.finditer(section)]
    return rows[2:]  # no header, no rule


def _recorded_medians() -> dict[str, float]:
    """'benchmark: figure' -> median, from each benchmark's newest results."""
    results = ROOT / "bench" / "results"
    medians = {}
    for line in (results / "summary.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 7 and re.fullmatch(r"[\d.]+", cells[2]):
            medians[f"{cells[0]}: {cells[1]}"] = float(cells[2])
    for path in results.glob("*.json"):  # a local `make bench` run: newer than the committed summary
        if path.name.startswith("summary"):
            continue
        result = json.loads(path.read_text())
        for figure in result.get("figures", []):
            medians[f"{result.get('benchmark', path.stem)}: {figure['name']}"] = float(figure["median"])
    return medians


def test_the_bench_record_opens_with_the_newest_recorded_figures():
    text = (ROOT / "bench" / "README.md").read_text()
    assert re.search(r"^## (.+)$", text, re.M).group(1) == "Figures of record"  # the first section
    rows = _first_table(text, "## Figures of record")
    assert len(rows) >= 10
    medians = _recorded_medians()
    checked = 0
    for row in rows:
        figure, target, median, verdict, date, commit, key = row
        if not key:
            continue
        key = key.strip("`")
        assert key in medians, f"{key}: no such figure in bench/results"
        shown = re.search(r"[\d.]+", median).group(0)
        decimals = len(shown.split(".")[1]) if "." in shown else 0
        assert shown == f"{medians[key]:.{decimals}f}", f"{key}: the table says {shown}, the results {medians[key]}"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d( \d\d:\d\d)?", date) and commit, row
        checked += 1
    assert checked >= 5


def _anchor(title: str) -> str:
    return re.sub(r"[^\w\s-]", "", title.replace("`", "")).strip().lower().replace(" ", "-")


def test_the_reliability_record_opens_with_the_figures_its_sections_record():
    text = (ROOT / "RELIABILITY.md").read_text()
    first_section = re.search(r"^## (.+)$", text, re.M).group(1)
    assert first_section == "Figures of record"
    assert "\n## Known limits\n" in text
    sections = {}
    for match in re.finditer(r"^(#{2,4}) (.+)$", text, re.M):
        body = text[match.end():]
        end = re.search(rf"^#{{2,{len(match.group(1))}}} ", body, re.M)
        sections[_anchor(match.group(2))] = body[: end.start() if end else len(body)]
    rows = _first_table(text, "## Figures of record")
    assert len(rows) >= 6
    for what, figure, date, machine, commit, link in rows:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", date) and machine and commit, what
        anchor = re.search(r"\(#([\w-]+)\)", link).group(1)
        assert anchor in sections, f"{what}: no section #{anchor}"
        bold = re.search(r"\*\*(.+?)\*\*", figure).group(1)
        assert "**" + bold in sections[anchor], f"{what}: {bold} is not what #{anchor} records"


def test_the_records_links_within_a_page_name_its_headings():
    for record in (ROOT / "RELIABILITY.md", ROOT / "bench" / "README.md"):
        text = record.read_text()
        headings = {_anchor(title) for title in re.findall(r"^#{1,6} (.+?)\s*$", text, re.M)}
        missing = sorted(set(re.findall(r"\]\(#([\w-]+)\)", text)) - headings)
        assert missing == [], f"{record.name}: {missing}"
