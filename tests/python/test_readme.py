"""The README's Python and R code blocks run as written (each in a fresh process and directory).

Every block runs; an HTML comment on the line before a block says what else it needs:

- `<!-- run with train.py: examples/launch_train.py -->`: that repository file is copied into the
  directory as train.py first (blocks that launch a training script);
- `<!-- saved as train.py, run by the command below -->`: the block is written to train.py and the
  README's next ```sh block is run instead (a script that is one process of a cluster);
- `<!-- not run: REASON -->`: the block is reported as skipped with that reason (a one-time
  installation that downloads TensorFlow into the user's home).
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
README = ROOT / "README.md"
BLOCK = re.compile(r"(?P<before>[^\n]*)\n```(?P<lang>python|r)\n(?P<code>.*?)\n```", re.S)
SH_BLOCK = re.compile(r"\n```sh\n(?P<code>.*?)\n```", re.S)
RUN_WITH = re.compile(r"<!-- run with (?P<name>[\w.]+): (?P<source>[\w./-]+) -->")
SAVED_AS = re.compile(r"<!-- saved as (?P<name>[\w.]+), run by the command below -->")
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>.+) -->")
MARKER = re.compile(r"<!--.*-->")


def readme_blocks() -> list:
    text = README.read_text()
    params = []
    for match in BLOCK.finditer(text):
        line = text[: match.start("code")].count("\n") + 1
        command = None
        if SAVED_AS.fullmatch(match["before"]):
            following = SH_BLOCK.search(text, match.end())
            assert following, f"README line {line}: no ```sh block after a block saved to be run by it"
            command = following["code"]
        params.append(pytest.param(match["lang"], match["code"], match["before"], command,
                                   id=f"{match['lang']}-line{line}"))
    return params


def test_every_block_runs_and_every_marker_is_understood():
    blocks = readme_blocks()
    assert len(blocks) >= 9  # none left out
    for param in blocks:
        before = param.values[2]
        if MARKER.fullmatch(before):
            assert RUN_WITH.fullmatch(before) or SAVED_AS.fullmatch(before) or NOT_RUN.fullmatch(before), \
                f"unknown marker {before!r}"
        if RUN_WITH.fullmatch(before):
            assert (ROOT / RUN_WITH.fullmatch(before)["source"]).is_file(), before


def shell_command(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    return [sys.executable, *words[1:]] if words[0] == "python" else words


@pytest.mark.parametrize("lang,code,before,command", readme_blocks())
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
        assert rscript, "Rscript is needed to run the README's R blocks"
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
