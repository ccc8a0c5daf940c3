"""The command a launch runs once per task: `x.py` runs with this Python, `x.R` with Rscript,
anything else as given; checked to exist before anything starts."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path


def resolve_command(
    command: str | Sequence[str], cwd: str | os.PathLike[str] | None = None
) -> list[str]:
    """The argv to run for `command`: `x.py` -> this Python, `x.R` -> Rscript; checked to exist.

    Raises:
        ValueError: naming `command`: empty, or the program or script is not found.
    """
    words = _words(command)
    base = Path(cwd) if cwd is not None else Path.cwd()
    first, rest = words[0], words[1:]
    if first.endswith(".py"):
        _require_script(first, base)
        return [python_executable(), first, *rest]
    if first.endswith(".R"):
        _require_script(first, base)
        return [_require_program("Rscript", base), first, *rest]
    program = _require_program(first, base)
    if rest and not rest[0].startswith("-") and rest[0].endswith((".py", ".R")):
        _require_script(rest[0], base)  # `python train.py`: a missing script fails here, not later
    return [program, *rest]


def _words(command: str | Sequence[str]) -> list[str]:
    if isinstance(command, str):
        words = shlex.split(command)
    elif isinstance(command, Sequence):
        words = [str(word) for word in command]
    else:
        raise ValueError(
            f"command must be a list of strings (or one string), got {type(command).__name__}."
        )
    if not words or not words[0].strip():
        raise ValueError(
            "command is empty: give the program to run and its arguments, e.g. ['train.py'] "
            "or ['python', 'train.py', '--epochs', '3']."
        )
    return words


def _require_script(script: str, base: Path) -> None:
    path = Path(script) if Path(script).is_absolute() else base / script
    if not path.is_file():
        raise ValueError(f"command: the script {script!r} does not exist (looked at {path}).")


def _require_program(program: str, base: Path) -> str:
    if os.sep in program:
        path = Path(program) if Path(program).is_absolute() else base / program
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ValueError(f"command: {program!r} is not an executable file.")
        return program
    found = shutil.which(program)
    if found is None:
        raise ValueError(f"command: {program!r} was not found on PATH.")
    return found


def python_executable() -> str:
    """This interpreter; under reticulate, sys.executable may name R, so fall back to the env's."""
    if Path(sys.executable).name.startswith("python"):
        return sys.executable
    for name in ("python3", "python"):
        candidate = Path(sys.prefix) / "bin" / name
        if candidate.exists():
            return str(candidate)
    return sys.executable
