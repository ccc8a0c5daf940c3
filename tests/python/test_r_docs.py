"""The R reference is generated from the Python docstrings (tools/r_docs.py, `make r-docs`): the
committed R files are what the tool writes, a docstring edit shows up in them, and every argument of
a generated wrapper is documented. No TensorFlow: the tool reads the sources."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("r_docs", ROOT / "tools" / "r_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _overrides() -> dict:
    return {k: v for k, v in json.loads((ROOT / "tools" / "r_docs.json").read_text()).items() if not k.startswith("_")}


def test_committed_r_files_are_what_the_tool_writes():
    tool = _tool()
    stale = [f for f, wrappers in _overrides().items() if tool.generate(f, wrappers) != (ROOT / f).read_text()]
    assert stale == [], f"{stale} differ from their Python docstrings: run `make r-docs`"
    assert tool.main(["--check"]) == 0


def test_a_docstring_edit_reaches_the_r_file(tmp_path):
    tool = _tool()
    source = (ROOT / "python/kerasdist/checkpoint/callback.py").read_text()
    edited = source.replace("keep: how many of the newest checkpoints to keep (>= 1).",
                            "keep: how many of the newest checkpoints to keep (>= 1, None for all).")
    assert edited != source
    module = tmp_path / "callback.py"
    module.write_text(edited)
    wrappers = _overrides()["R/checkpoint.R"]
    wrappers["checkpoint_callback"] = dict(wrappers["checkpoint_callback"], python=f"{module}:checkpoint_callback")
    generated = tool.generate("R/checkpoint.R", wrappers)
    assert generated != (ROOT / "R/checkpoint.R").read_text()
    assert "#' @param keep How many of the newest checkpoints to keep (>= 1, `NULL` for all)." in generated


def test_every_argument_of_a_generated_wrapper_is_documented():
    tool = _tool()
    sources = {r_file: (ROOT / r_file).read_text() for r_file in _overrides()}

    def params(function: str) -> set[str]:
        source = next(text for text in sources.values() if f"\n{function} <- function(" in text)
        at = source.index(f"\n{function} <- function(")
        return set(re.findall(r"^#' @param (\w+)", source[source.rindex(tool.MARKER, 0, at):at], re.M))

    for r_file, wrappers in _overrides().items():
        for function, spec in wrappers.items():
            inherited = params(spec["inherit"]) if "inherit" in spec else set()
            assert set(tool.r_formals(sources[r_file], function)) - params(function) - inherited == set(), function


def test_python_words_become_r_words():
    tool = _tool()
    assert tool.to_r("None: all; `None` or True, [0, 3) and 5%") == "`NULL`: all; `NULL` or `TRUE`, \\[0, 3) and 5\\%"
