"""The Python and R code blocks of README.md and of every guide page in docs/ run as written, the
way a reader runs them: every Python block of a page in order, in one Python process and one
working directory (a namespace shared from block to block, as in one session), and every R block
of a page the same way in one Rscript; and the pages' relative links resolve. So two blocks of a
page that would clash (one `checkpoint_dir` for two different models) fail here: blocks that
cannot share a directory name distinct ones.

Every block runs; an HTML comment on the line before a block says what else it needs:

- `<!-- run with train.py: examples/launch_train.py -->`: that repository file is copied into the
  directory as train.py first (blocks that launch a training script);
- `<!-- saved as train.py, run by the command below -->`: the block is written to train.py and the
  page's next ```sh block is run instead (a script that is one process of a cluster);
- `<!-- not run: REASON -->`: the block is reported as skipped with that reason (a one-time
  installation that downloads TensorFlow into the user's home).

Test ids name the page and the language: `docs/checkpoints.md-python`; a failure names the block
by the line its code starts on (`=== block line 40 ===` in the output).
"""

from __future__ import annotations

import json
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
FENCED = re.compile(r"```.*?```", re.S)  # a heading's own `code` is part of its title
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
    for title in HEADING.findall(FENCED.sub("", page.read_text())):
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
    """A page's command line as this interpreter runs it: `python` is it, and `kerasdist` (the
    command the package installs) its `-m kerasdist_cli`, which the installed script runs."""
    words = shlex.split(line, comments=True)
    if words[0] == "kerasdist":
        return [sys.executable, "-m", "kerasdist_cli", *words[1:]]
    return [sys.executable, *words[1:]] if words[0] == "python" else words


def page_languages() -> list:
    """(page, language) for every page with a block in that language."""
    return [pytest.param(page, lang, id=f"{page_name(page)}-{lang}")
            for page in PAGES for lang in ("python", "r")
            if any(param.values[0] == lang for param in page_blocks(page))]


# One process runs a page's blocks of one language in order: a block saved as a script is written
# and its command run (its output passed on); any other block runs in the process itself.
PYTHON_DRIVER = """\
import json, subprocess, sys
namespace = {"__name__": "__main__"}
for step in json.load(open(sys.argv[1])):
    print(f"\\n=== block line {step['line']} ===", flush=True)
    if step["argv"]:
        with open(step["name"], "w") as script:
            script.write(step["code"] + "\\n")
        status = subprocess.run(step["argv"]).returncode
        if status:
            sys.exit(f"the command after the block of line {step['line']} exited {status}")
    else:
        exec(compile(step["code"], f"block line {step['line']}", "exec"), namespace)
    sys.stdout.flush()
"""
R_DRIVER = """\
for (step in jsonlite::fromJSON(commandArgs(TRUE)[1], simplifyVector = FALSE)) {
  cat(sprintf("\\n=== block line %d ===\\n", step$line))
  if (length(step$argv)) stop("a block saved as a script is not supported for R pages")
  source(exprs = parse(text = step$code, keep.source = FALSE), local = globalenv(), print.eval = TRUE)
}
"""


def _steps(page: Path, lang: str, work: Path) -> tuple[list[dict], list[str], list[int], list[int]]:
    """The blocks to run (the files they need copied into `work`), the reasons of those not run,
    and the lines of the blocks whose launched runs are checked."""
    steps, skipped, launched, saved = [], [], [], []
    for param in page_blocks(page):
        block_lang, code, before, command = param.values
        if block_lang != lang:
            continue
        line = int(param.id.rsplit("line", 1)[1])
        if not_run := NOT_RUN.fullmatch(before):
            skipped.append(f"line {line}: {not_run['reason']}")
            continue
        step = {"line": line, "code": code, "argv": [], "name": ""}
        if run_with := RUN_WITH.fullmatch(before):
            shutil.copy(ROOT / run_with["source"], work / run_with["name"])
            launched.append(line)
        if saved_as := SAVED_AS.fullmatch(before):
            lines = [text for text in command.splitlines() if text.strip()]
            assert len(lines) == 1, f"one command expected after the block, got:\n{command}"
            step.update(argv=shell_command(lines[0]), name=saved_as["name"])
            saved.append(line)
        steps.append(step)
    return steps, skipped, launched, saved


def _outputs(stdout: str) -> dict[int, str]:
    """Each block's part of the page's output, by the line its code starts on."""
    parts = re.split(r"^=== block line (\d+) ===$", stdout, flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


@pytest.mark.parametrize("page,lang", page_languages())
def test_page_blocks_run_in_order_in_one_directory(page, lang, tmp_path):
    work = tmp_path / "page"
    work.mkdir()
    steps, skipped, launched, saved = _steps(page, lang, work)
    if not steps:
        pytest.skip("; ".join(skipped))
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "KERASDIST_PYTHON": sys.executable}
    if lang == "python":
        (tmp_path / "driver.py").write_text(PYTHON_DRIVER)
        argv = [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "steps.json")]
    else:
        rscript = shutil.which("Rscript")
        assert rscript, "Rscript is needed to run the pages' R blocks"
        (tmp_path / "driver.R").write_text(R_DRIVER)
        argv = [rscript, str(tmp_path / "driver.R"), str(tmp_path / "steps.json")]
    result = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=300 * len(steps))
    assert result.returncode == 0, (
        f"{page_name(page)}: {lang} blocks failed (the last '=== block line N ===' is the one):\n"
        f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-4000:]}")
    outputs = _outputs(result.stdout)
    assert sorted(outputs) == sorted(step["line"] for step in steps), result.stdout[-3000:]
    for line in launched:  # examples/launch_train.*: every worker says it trained
        trained = re.findall(r"^\[(worker \d)\] trained 5 epochs on 2 replicas", outputs[line], re.M)
        assert sorted(trained) == ["worker 0", "worker 1"], outputs[line][-3000:]
    for line in saved:  # the parameter-server script: the chief trained every epoch
        assert re.search(r"^\[chief 0\] Epoch 5/5$", outputs[line], re.M), outputs[line][-3000:]
