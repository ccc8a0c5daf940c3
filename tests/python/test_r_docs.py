"""The R reference is generated from the Python docstrings (tools/r_docs.py, `make r-docs`): the
committed R files are what the tool writes, a docstring edit shows up in them, and every argument of
a generated wrapper is documented. No TensorFlow: the tool reads the sources."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

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


def test_a_docstring_edit_reaches_the_r_file(tmp_path, monkeypatch):
    """A checkpoint option's doc is written once, in CheckpointOptions: an edit there reaches every
    R wrapper that takes the option."""
    tool = _tool()
    source = (ROOT / "python/kerasdist/checkpoint/options.py").read_text()
    edited = source.replace("keep: how many of the newest checkpoints to keep (>= 1;",
                            "keep: how many of the newest checkpoints to keep (>= 1, None for all;")
    edited = edited.replace("keep_best: also keep the checkpoint with the best `monitor` value.",
                            "keep_best: also keep the best checkpoint by `monitor`.")
    assert edited != source
    module = tmp_path / "options.py"
    module.write_text(edited)
    classes = {**tool.class_index(), "CheckpointOptions": f"{module}:CheckpointOptions"}
    monkeypatch.setattr(tool, "class_index", lambda: classes)
    generated = tool.generate("R/checkpoint.R", _overrides()["R/checkpoint.R"])
    assert generated != (ROOT / "R/checkpoint.R").read_text()
    assert "#' @param keep How many of the newest checkpoints to keep (>= 1, `NULL` for all;" in generated
    fit = tool.generate("R/training-distributed.R", _overrides()["R/training-distributed.R"])
    assert "#' @param keep_best Also keep the best checkpoint by `monitor`." in fit


def test_every_argument_of_a_generated_wrapper_is_documented():
    tool = _tool()
    sources = {r_file: (ROOT / r_file).read_text() for r_file in _overrides()}

    def params(function: str) -> set[str]:
        source = next(text for text in sources.values() if f"\n{function} <- function(" in text)
        at = source.index(f"\n{function} <- function(")
        return set(re.findall(r"^#' @param (\w+|\.\.\.)", source[source.rindex(tool.MARKER, 0, at):at], re.M))

    for r_file, wrappers in _overrides().items():
        for function, spec in wrappers.items():
            inherited = params(spec["inherit"]) if "inherit" in spec else set()
            assert set(tool.r_formals(sources[r_file], function)) - params(function) - inherited == set(), function


def test_r_words_in_r_docs_json_are_rs_own_not_a_copy_of_the_docstring():
    """A parameter's text in tools/r_docs.json is R's own (R types, R values, R examples): one that
    mostly restates its Python docstring would drift from it, so it is generated instead (or says
    only the phrases R words differently, as a {python phrase: R words} map)."""
    import difflib

    tool = _tool()
    copies = []
    for wrappers in _overrides().values():
        for function, spec in wrappers.items():
            python = tool.python_arguments(spec["python"])
            for name, text in spec.get("params", {}).items():
                if isinstance(text, str) and name in python:
                    generated = tool.to_r(python[name][:1].upper() + python[name][1:])
                    ratio = difflib.SequenceMatcher(None, text, generated).ratio()
                    if ratio >= 0.75:
                        copies.append(f"{function}({name}): {ratio:.2f}")
    assert copies == [], "R texts that restate the Python docstring: drop them (or keep only R's words)"


def test_r_words_for_python_phrases_stop_the_tool_once_the_docstring_changes():
    tool = _tool()
    text = "the strategy; default the active one."
    assert tool.in_r_words(text, {"default the active one": "`NULL` for the active one"}) == \
        "The strategy; `NULL` for the active one."
    with pytest.raises(SystemExit, match="not in the Python text"):
        tool.in_r_words(text, {"default the current one": "`NULL`"})


def test_python_words_become_r_words():
    tool = _tool()
    assert tool.to_r("None: all; `None` or True, [0, 3) and 5%") == "`NULL`: all; `NULL` or `TRUE`, \\[0, 3) and 5\\%"
    assert tool.to_r("see `make_dataset`, `kerasdist.goodput()` and `Keras`") == \
        "see [make_dataset()], [goodput()] and `Keras`"  # a function R exports: a link to its page
    assert tool.to_r("`make_dataset`", links=False) == "`make_dataset`"


# R functions that forward the documented Python function of their name but keep hand-written
# roxygen, each with the reason: none. (R-only functions, which forward nothing of their name, such
# as install_kerasdist(), kerasdist_python() and the print methods, are hand-written: ARCHITECTURE.md.)
HAND_WRITTEN: dict[str, str] = {}


def test_every_r_wrapper_of_a_documented_python_function_is_generated():
    """An exported R function that forwards the Python function of its name gets its roxygen from
    that function's docstring (an entry in tools/r_docs.json), unless HAND_WRITTEN says why not:
    a new twin cannot slip in with docs copied by hand."""
    tool = _tool()
    generated = {function for wrappers in _overrides().values() for function in wrappers}
    documented = set()
    for path in (ROOT / "python" / "kerasdist").rglob("*.py"):
        module = str(path.relative_to(ROOT))
        documented |= {node.name for node in tool.module_tree(module).body
                       if isinstance(node, (tool.ast.FunctionDef, tool.ast.ClassDef)) and tool.ast.get_docstring(node)}
    hand = []
    for path in sorted((ROOT / "R").glob("*.R")):
        source = path.read_text()
        for match in re.finditer(r"^#' @export\n([\w.]+) <- function\(", source, re.M):
            name = match[1]
            body = source[match.end():source.find("\n}", match.end())]
            if name in documented and f"kerasdist_module()${name}" in body and name not in generated:
                hand.append(name)
    assert sorted(hand) == sorted(HAND_WRITTEN), "write their roxygen from the docstring: an entry in tools/r_docs.json"
