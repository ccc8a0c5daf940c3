"""Write the R wrappers' roxygen from the Python docstrings: `make r-docs` (then roxygen2 makes man/).

Each wrapper to generate is named in tools/r_docs.json, per R file: the Python function (or class)
it forwards to, as "python/kerasdist/<module>.py:<name>", and what R says differently (an R type
in a parameter, an R value returned, an R paragraph): `title`, `params`, `returns`, `details`,
`inherit`, `python_description` (false: the docstring's description holds only in Python, and
`details` replaces it). A parameter's text there is R's own words in full, null (documented by
`inherit`), or a map {Python phrase: R words} applied to the docstring's text. In the R file, the
generated lines follow a marker comment (`# r-docs: <python>`) down to the first hand-written tag
(`@section`, `@inheritSection`, `@family`, `@seealso`, `@examples`, `@examplesIf`, `@export`,
`@keywords`), which stay as they are: the title (the docstring's first paragraph), the description
(its other paragraphs before `Args:`), one `@param` per argument of the R function (Python's
`Args:` entry unless `params` gives the R text; none where `inherit` covers it: null there, or
the inherited function's Python text is the same) and `@returns`. Python's words become R's
(None, True, False; a function R exports, named in code, a link to its page), the text is escaped
for roxygen and wrapped.

    python tools/r_docs.py            # rewrite the R files
    python tools/r_docs.py --check    # exit 1, naming the files, if they differ from the output
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OVERRIDES = ROOT / "tools" / "r_docs.json"
MARKER = "# r-docs: "
HAND_TAGS = re.compile(r"^#' @(section|inheritSection|family|seealso|examples|examplesIf|export|keywords)\b")
SECTIONS = ("Args:", "Returns:", "Raises:", "Attributes:", "Example:", "Examples:")
WIDTH = 100


@functools.cache
def module_tree(path: str) -> ast.Module:
    """The parsed module at `path` (from the repository's root), read once per run."""
    return ast.parse((ROOT / path).read_text())


@functools.cache
def class_index() -> dict[str, str]:
    """Every top-level class of the package, by name, as its "path/to/module.py:name" spec: built
    once per run, for the records `@with_field_docs` names."""
    index: dict[str, str] = {}
    for path in sorted((ROOT / "python" / "kerasdist").rglob("*.py")):
        module = str(path.relative_to(ROOT))
        for node in module_tree(module).body:
            if isinstance(node, ast.ClassDef):
                index.setdefault(node.name, f"{module}:{node.name}")
    return index


def definition(spec: str) -> ast.FunctionDef | ast.ClassDef:
    """The function or class "path/to/module.py:name", read without importing."""
    path, name = spec.split(":")
    for node in module_tree(path).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
    raise SystemExit(f"r_docs: {name} not found in {path}")


def docstring(spec: str) -> str:
    """The docstring of "path/to/module.py:name" (a function or class), read without importing."""
    return ast.get_docstring(definition(spec)) or ""


def record_docs(spec: str) -> dict[str, str]:
    """A record's fields and their docs (its `Attributes:` or `Args:` section)."""
    parts = sections(docstring(spec))
    return arguments(parts.get("Attributes:") or parts.get("Args:", ""))


def field_docs_of_decorators(spec: str) -> dict[str, str]:
    """The fields `@with_field_docs(Record, leave_out=...)` adds to a function's docstring when it
    is imported."""
    found: dict[str, str] = {}
    for decorator in definition(spec).decorator_list:
        if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", "") == "with_field_docs":
            left_out = set().union(*(ast.literal_eval(k.value) for k in decorator.keywords if k.arg == "leave_out"))
            docs = record_docs(class_index()[decorator.args[0].id])
            found.update({name: text for name, text in docs.items() if name not in left_out})
    return found


def sections(doc: str) -> dict[str, str]:
    """The docstring split: "" (the text before the first section), "Args:", "Returns:", ..."""
    parts: dict[str, list[str]] = {"": []}
    current = ""
    for line in doc.splitlines():
        if line.strip() in SECTIONS and not line.startswith(" "):
            current = line.strip()
            parts[current] = []
        elif current and line.strip() and not line.startswith(" "):  # a paragraph after a section
            current = "after"
            parts.setdefault(current, []).append(line)
        else:
            parts[current].append(line)
    return {key: textwrap.dedent("\n".join(lines)).strip() for key, lines in parts.items()}


def arguments(args_text: str) -> dict[str, str]:
    """`name: text` entries of an Args: section, continuation lines joined."""
    found: dict[str, str] = {}
    name = None
    for line in args_text.splitlines():
        entry = re.match(r"^(\*{0,2}\w+)(?: \([^)]*\))?: (.*)$", line)
        if entry and not line.startswith(" "):
            name = entry[1]
            found[name] = entry[2]  # "**kwargs" too, so its text is not taken for the entry before
        elif name is not None:
            found[name] += " " + line.strip()
    return found


def to_r(text: str, links: bool = True) -> str:
    """Python's words as R says them, escaped for roxygen's markdown (brackets outside code are
    not links; % and @ are literal); a function R exports, named in code (`make_dataset`,
    `kerasdist.goodput()`), becomes a link to its R page unless `links` is False (a title)."""
    pieces = re.split(r"(`[^`]*`)", text)
    out = []
    for piece in pieces:
        code = piece.startswith("`")
        function = re.fullmatch(r"`(?:kerasdist\.)?(\w+)(?:\(\)|\(\.\.\.\))?`", piece) if code and links else None
        if function and function[1] in r_exports():
            out.append(f"[{function[1]}()]")
            continue
        piece = re.sub(r"\bNone\b", "NULL" if code else "`NULL`", piece)
        piece = re.sub(r"\bTrue\b", "TRUE" if code else "`TRUE`", piece)
        piece = re.sub(r"\bFalse\b", "FALSE" if code else "`FALSE`", piece)
        if not code:
            piece = piece.replace("[", "\\[").replace("]", "\\]")
        piece = piece.replace("%", "\\%").replace("@", "@@")
        out.append(piece)
    return "".join(out).replace("``NULL``", "`NULL`")


@functools.cache
def r_exports() -> frozenset[str]:
    """The functions the R package exports (its NAMESPACE)."""
    return frozenset(re.findall(r"^export\((\w+)\)$", (ROOT / "NAMESPACE").read_text(), re.M))


def in_r_words(python_text: str, words: dict[str, str]) -> str:
    """Python's text of a parameter with R words in place of some of its phrases (`words`: phrase
    -> R words, written as roxygen markdown); the rest goes through `to_r`. A phrase Python's text
    no longer holds stops the tool, naming it, so the R words cannot drift from the docstring."""
    missing = [phrase for phrase in words if phrase not in python_text]
    if missing:
        raise SystemExit(f"r_docs: {missing} not in the Python text {python_text!r}: update tools/r_docs.json")
    pattern = "|".join(map(re.escape, sorted(words, key=len, reverse=True)))
    text = "".join(words[piece] if piece in words else to_r(piece) for piece in re.split(f"({pattern})", python_text))
    return text[:1].upper() + text[1:]


def paragraphs(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # Python examples: R's are in the R file
    return [" ".join(line.strip() for line in block.splitlines()) for block in re.split(r"\n\s*\n", text.strip()) if
            block.strip()]


def wrap(text: str, first: str = "#' ", rest: str = "#' ") -> list[str]:
    glued = re.sub(r"`[^`]*`", lambda code: code[0].replace(" ", "\0"), text)  # code spans stay on one line
    lines = [line.replace("\0", " ") for line in textwrap.wrap(
        glued, WIDTH, initial_indent=first, subsequent_indent=rest, break_long_words=False, break_on_hyphens=False)]
    # a wrapped line must not start what markdown reads as a list, a quote or a heading
    return [lines[0]] + [re.sub(r"^(#'\s+)([-+*>#]\s|\d+[.)]\s|=+$)", r"\1\\\2", line) for line in lines[1:]]


def r_formals(r_source: str, function: str) -> list[str]:
    """The argument names of `function <- function(...)` in an R file."""
    start = re.search(rf"^{re.escape(function)} <- function\(", r_source, re.M)
    if start is None:
        raise SystemExit(f"r_docs: {function} <- function( not found")
    depth, i = 1, start.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(r_source[i], 0)
        i += 1
    text = r_source[start.end():i - 1]
    names, depth, current = [], 0, ""
    for char in text + ",":
        if char == "," and depth == 0:
            names.append(current.split("=")[0].strip())
            current = ""
            continue
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(char, 0)
        current += char
    return [name for name in names if name]


def inherited_texts(function: str) -> dict[str, str]:
    """What `@inheritParams function` documents: per parameter, its Python twin's docstring text
    (whether the R page words it in R or not)."""
    wrappers = {name: spec for r_file, specs in json.loads(OVERRIDES.read_text()).items()
                if not r_file.startswith("_") for name, spec in specs.items()}
    return python_arguments(wrappers[function]["python"])


def python_arguments(spec: str) -> dict[str, str]:
    """The docs of each argument of the Python function `spec`: its `Args:` and its records' fields."""
    return {**field_docs_of_decorators(spec), **arguments(sections(docstring(spec)).get("Args:", ""))}


def block(function: str, spec: dict[str, Any], formals: list[str]) -> list[str]:
    """The generated roxygen lines of one wrapper, its marker first."""
    parts = sections(docstring(spec["python"]))
    summary, *body = paragraphs(parts[""])  # the first paragraph is the title, unless `title` replaces it
    lines = [f"{MARKER}{spec['python']} (make r-docs)"]
    lines.append("#' " + to_r(spec.get("title", summary.rstrip(".")), links=False))
    if not spec.get("python_description", True):  # Python's text says what only holds in Python
        body = []
    for paragraph in [to_r(text) for text in body] + spec.get("details", []):
        lines += ["#'"] + wrap(paragraph)
    lines.append("#'")
    if "inherit" in spec:
        lines.append(f"#' @inheritParams {spec['inherit']}")
    python_args = python_arguments(spec["python"])
    inherited = inherited_texts(spec["inherit"]) if "inherit" in spec else {}
    for name in formals:
        overrides = spec.get("params", {})
        if (name in overrides and overrides[name] is None) or (
                name not in overrides and name in python_args and inherited.get(name) == python_args[name]):
            continue  # documented by `inherit`: null here, or the same Python words there
        text = overrides.get(name)
        if isinstance(text, dict):  # R words for some of Python's
            text = in_r_words(python_args[name], text)
        elif text is None and name in python_args:
            text = to_r(python_args[name][:1].upper() + python_args[name][1:])
        if text is not None:
            lines += wrap(text, f"#' @param {name} ", "#'   ")
    returns = spec.get("returns") or to_r(" ".join(parts.get("Returns:", "").split()))
    if returns:
        lines += wrap(returns, "#' @returns ", "#'   ")
    return lines


def generate(r_file: str, wrappers: dict[str, dict[str, Any]]) -> str:
    source = (ROOT / r_file).read_text()
    lines = source.splitlines()
    for function, spec in wrappers.items():
        formals = r_formals(source, function)
        at = lines.index(next(line for line in lines if line.startswith(f"{function} <- function(")))
        start = at
        while start > 0 and (lines[start - 1].startswith("#'") or lines[start - 1].startswith(MARKER)):
            start -= 1
        hand = next((i for i in range(start, at) if HAND_TAGS.match(lines[i])), at)
        lines[start:hand] = block(function, spec, formals)
        source = "\n".join(lines) + "\n"
    return source


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if an R file differs")
    args = parser.parse_args(argv)
    overrides = json.loads(OVERRIDES.read_text())
    differ = []
    for r_file, wrappers in overrides.items():
        if r_file.startswith("_"):
            continue
        new = generate(r_file, wrappers)
        if new != (ROOT / r_file).read_text():
            differ.append(r_file)
            if not args.check:
                (ROOT / r_file).write_text(new)
    if args.check and differ:
        print(f"r_docs: {', '.join(differ)} differ from their Python docstrings: run `make r-docs`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
