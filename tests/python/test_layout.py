"""The core stays readable in two hops: no module over 600 lines, no function over 60 lines of
code (docstring, blank and comment lines aside). ARCHITECTURE.md names every module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "kerasdist"
MODULES = sorted(PACKAGE.rglob("*.py"))


def _code_lines(function: ast.FunctionDef | ast.AsyncFunctionDef, source: list[str]) -> int:
    body = function.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]
    numbers = {line for node in body for line in range(node.lineno, node.end_lineno + 1)}
    return sum(1 for n in numbers if source[n - 1].strip() and not source[n - 1].strip().startswith("#"))


def test_no_module_over_600_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in MODULES if (n := p.read_text().count("\n")) > 600}
    assert long == {}


def test_no_function_over_60_lines_of_code():
    long = {}
    for path in MODULES:
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (n := _code_lines(node, lines)) > 60:
                long[f"{path.relative_to(PACKAGE)}:{node.name}"] = n
    assert long == {}


def test_architecture_names_every_module():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    names = {p.stem if p.name != "__init__.py" else p.parent.name
             for p in MODULES if p.parent == PACKAGE or p.name == "__init__.py"}
    missing = sorted(name for name in names - {"__init__", "kerasdist", "__main__"} if f"`{name}" not in text)
    assert missing == []
