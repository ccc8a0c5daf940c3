"""The README's Python and R code blocks run as written (each in a fresh process and directory).

A block preceded by `<!-- not run: REASON -->` is left out; it must say why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"(?P<before>[^\n]*)\n```(?P<lang>python|r)\n(?P<code>.*?)\n```", re.S)


NOT_RUN = re.compile(r"<!-- not run: (?P<reason>\S.*) -->")


def readme_blocks(runnable: bool) -> list:
    text = README.read_text()
    params = []
    for match in BLOCK.finditer(text):
        if bool(NOT_RUN.fullmatch(match["before"])) == runnable:
            continue
        line = text[: match.start("code")].count("\n") + 1
        params.append(pytest.param(match["lang"], match["code"], match["before"], id=f"{match['lang']}-line{line}"))
    return params


def test_blocks_left_out_say_why_and_are_few():
    left_out = readme_blocks(runnable=False)
    assert len(left_out) <= 3, "most README examples must run as written"
    for param in left_out:
        assert NOT_RUN.fullmatch(param.values[2])["reason"]


@pytest.mark.parametrize("lang,code,before", readme_blocks(runnable=True))
def test_readme_block_runs(lang, code, before, tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "KERASDIST_PYTHON": sys.executable}
    if lang == "python":
        command = [sys.executable, "-c", code]
    else:
        rscript = shutil.which("Rscript")
        assert rscript, "Rscript is needed to run the README's R blocks"
        command = [rscript, "-e", code]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{lang} block failed:\n{code}\n--- stderr ---\n{result.stderr[-3000:]}"
