"""The Python and R code blocks of README.md and of every guide page in docs/ run as written
(each in a fresh process and directory), and the pages' relative links resolve.

Every block runs; an HTML comment on the line before a block says what else it needs:

- `<!-- run with train.py: examples/launch_train.py -->`: that repository file is copied into the
  directory as train.py first (blocks that launch a training script);
- `<!-- saved as train.py, run by the command below -->`: the block is written to train.py and the
  page's next ```sh block is run instead (a script that is one process of a cluster);
- `<!-- not run: REASON -->`: the block is reported as skipped with that reason (a one-time
  installation that downloads TensorFlow into the user's home).

Test ids name the page and the line the block's code starts on: `docs/checkpoints.md-python-line40`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?P<before>[^\n]*)\n```(?P<lang>python|r)\n(?P<code>.*?)\n```", re.S)
FENCE = re.compile(r"^```(python|r)$", re.M)
SH_BLOCK = re.compile(r"\n```sh\n(?P<code>.*?)\n```", re.S)
RUN_WITH = re.compile(r"<!-- run with (?P<name>[\w.]+): (?P<source>[\w./-]+) -->")
SAVED_AS = re.compile(r"<!-- saved as (?P<name>[\w.]+), run by the command below -->")
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>.+) -->")
MARKER = re.compile(r"<!--.*-->")
# [text](target) and ![alt](target), outside code; targets with a scheme (https:, mailto:) are not ours
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
HEADING = re.compile(r"^#{1,6} (?P<title>.+?)\s*$", re.M)


def page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def page_blocks(page: Path) -> list:
    text = page.read_text()
    params = []
    for match in BLOCK.finditer(text):
        line = text[: match.start("code")].count("\n") + 1
        command = None
        if SAVED_AS.fullmatch(match["before"]):
            following = SH_BLOCK.search(text, match.end())
            assert following, f"{page_name(page)} line {line}: no ```sh block after a block saved to be run by it"
            command = following["code"]
        params.append(pytest.param(match["lang"], match["code"], match["before"], command,
                                   id=f"{page_name(page)}-{match['lang']}-line{line}"))
    return params


def all_blocks() -> list:
    return [param for page in PAGES for param in page_blocks(page)]


def test_every_block_runs_and_every_marker_is_understood():
    for page in PAGES:  # no ```python or ```r block left out by the pattern above
        assert len(page_blocks(page)) == len(FENCE.findall(page.read_text())), page_name(page)
    blocks = all_blocks()
    assert len(blocks) >= 24  # README.md and docs/*.md together; none left out
    for param in blocks:
        before = param.values[2]
        if MARKER.fullmatch(before):
            assert RUN_WITH.fullmatch(before) or SAVED_AS.fullmatch(before) or NOT_RUN.fullmatch(before), \
                f"unknown marker {before!r} ({param.id})"
        if RUN_WITH.fullmatch(before):
            assert (ROOT / RUN_WITH.fullmatch(before)["source"]).is_file(), before


def anchors(page: Path) -> set[str]:
    """The heading ids that both GitHub and mkdocs give `page` (links must work on both)."""
    found = set()
    for title in HEADING.findall(CODE.sub("", page.read_text())):
        words = re.sub(r"[^\w\s-]", "", title.replace("`", "")).strip().lower()
        github, mkdocs = words.replace(" ", "-"), re.sub(r"[-\s]+", "-", words)
        if github == mkdocs:
            found.add(github)
    return found


@pytest.mark.parametrize("page", PAGES, ids=page_name)
def test_relative_links_resolve(page):
    broken = []
    for match in LINK.finditer(CODE.sub("", page.read_text())):
        target = match["target"]
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that id")
    assert broken == [], f"{page_name(page)}: {broken}"


def shell_command(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    return [sys.executable, *words[1:]] if words[0] == "python" else words


@pytest.mark.parametrize("lang,code,before,command", all_blocks())
def test_readme_block_runs(lang, code, before, command, tmp_path):
    if not_run := NOT_RUN.fullmatch(before):
        pytest.skip(not_run["reason"])
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "KERASDIST_PYTHON": sys.executable}
    if run_with := RUN_WITH.fullmatch(before):
        shutil.copy(ROOT / run_with["source"], tmp_path / run_with["name"])
    if saved_as := SAVED_AS.fullmatch(before):
        (tmp_path / saved_as["name"]).write_text(code + "\n")
        lines = [line for line in command.splitlines() if line.strip()]
        assert len(lines) == 1, f"one command expected after the block, got:\n{command}"
        argv = shell_command(lines[0])
    elif lang == "python":
        argv = [sys.executable, "-c", code]
    else:
        rscript = shutil.which("Rscript")
        assert rscript, "Rscript is needed to run the pages' R blocks"
        argv = [rscript, "-e", code]
    result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (
        f"{lang} block failed:\n{code}\n--- stdout ---\n{result.stdout[-3000:]}\n"
        f"--- stderr ---\n{result.stderr[-3000:]}")
    if run_with:  # examples/launch_train.*: every worker says it trained
        trained = re.findall(r"^\[(worker \d)\] trained 5 epochs on 2 replicas", result.stdout, re.M)
        assert sorted(trained) == ["worker 0", "worker 1"], result.stdout[-3000:]
    if saved_as:  # the parameter-server script: the chief trained every epoch
        assert re.search(r"^\[chief 0\] Epoch 5/5$", result.stdout, re.M), result.stdout[-3000:]
