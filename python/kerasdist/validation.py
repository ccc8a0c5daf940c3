"""Argument checks, one style for every public function.

Each check returns the value in its plain Python form or raises ValueError with one message shape:
"<argument> must be <what was expected>, got <what was given>." Counts must be Python or NumPy
integers: floats are refused even when whole (R's wrappers convert their doubles with
`as_py()` at the boundary, so Python need not guess), and so are bools and strings.
"""

from __future__ import annotations

import inspect
import math
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields, replace
from typing import Any, TypeVar

import numpy as np


def _expected(minimum: int | None, hint: str | None, none: bool = False) -> str:
    text = "an integer" if minimum is None else f"an integer >= {minimum}"
    if none:
        text += " or None"
    return text + (f" ({hint})" if hint else "")


def _is_integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def integer(name: str, value: Any, minimum: int | None = None, *, hint: str | None = None) -> int:
    """`value` as an int (>= minimum when given); a Python or NumPy integer, never a bool or float."""
    if not _is_integer(value) or (minimum is not None and value < minimum):
        raise ValueError(f"{name} must be {_expected(minimum, hint)}, got {value!r}.")
    return int(value)


def optional_integer(name: str, value: Any, minimum: int | None = None, *, hint: str | None = None) -> int | None:
    """None, or `value` as `integer` checks it (the message says None was allowed too)."""
    if value is None:
        return None
    if not _is_integer(value) or (minimum is not None and value < minimum):
        raise ValueError(f"{name} must be {_expected(minimum, hint, none=True)}, got {value!r}.")
    return int(value)


def optional_seconds(name: str, value: Any) -> float | None:
    """None, or `value` as a positive, finite number of seconds."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be None or a positive number of seconds, got {value!r}.")
    return float(value)


def seconds_or_auto(name: str, value: Any) -> float | str | None:
    """None, "auto", or `value` as a positive, finite number of seconds."""
    if isinstance(value, str) and value == "auto":
        return value
    try:
        return optional_seconds(name, value)
    except ValueError:
        raise ValueError(f"{name} must be a positive number of seconds, \"auto\" or None, got {value!r}.") from None


def fraction(name: str, value: Any) -> float:
    """`value` as a float strictly between 0 and 1 (a share of the data, e.g. validation_split)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or not 0 < value < 1:
        raise ValueError(f"{name} must be a fraction in (0, 1), got {value!r}.")
    return float(value)


def boolean(name: str, value: Any) -> bool:
    """`value` if it is True or False (no 0/1, no strings)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}.")
    return value


def optional_boolean(name: str, value: Any) -> bool | None:
    """`value` if it is True, False or None (None: decided elsewhere, e.g. by the environment)."""
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{name} must be True, False or None, got {value!r}.")
    return value


def choice(name: str, value: Any, options: Sequence[str]) -> str:
    """`value` if it is one of the strings `options`."""
    if not isinstance(value, str) or value not in options:
        quoted = [repr(option) for option in options]
        listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        raise ValueError(f"{name} must be {listed}, got {value!r}.")
    return value


def verbosity(name: str, value: Any) -> int:
    """Keras's `verbose`: 0 (silent), 1 (progress bar) or 2 (a line per epoch); "auto" is 1;
    False and True are 0 and 1, as Keras takes them."""
    if isinstance(value, str) and value == "auto":
        return 1
    if isinstance(value, bool):
        return int(value)
    if not _is_integer(value) or value not in (0, 1, 2):
        raise ValueError(f'{name} must be 0, 1, 2 or "auto", got {value!r}.')
    return int(value)


# Option records: typed, frozen dataclasses whose `__post_init__` checks each field with the
# functions above (data.DatasetOptions, training.speed.TrainingSettings,
# checkpoint.options.CheckpointOptions). A public function that takes the fields flat writes each
# one out in its signature with the record's default (`keep: int = CheckpointOptions.keep`: one
# definition, and help(), IDEs and type checkers see it), builds the record from its arguments
# (`record_from`) and lists the fields' docs through `with_field_docs`; one that takes a dict of
# them (`dataset_args=`) goes through `record_of`.

Record = TypeVar("Record")
Callable_ = TypeVar("Callable_", bound=Callable[..., Any])


def unknown_fields(record: type[Any], names: Iterable[str]) -> list[str]:
    """The `names` that are not fields of the dataclass `record`, sorted."""
    return sorted(set(names) - {field.name for field in fields(record)})


def record_of(record: type[Record], values: Any, name: str) -> Record:
    """`values`, a dict of option names given as the argument `name` (e.g. `dataset_args`), as
    the typed `record`: an unknown key is refused naming it; the record checks the values."""
    if not isinstance(values, Mapping):
        raise ValueError(f"{name} must be a dict of {record.__name__} fields, got {type(values).__name__}.")
    unknown = unknown_fields(record, values)
    if unknown:
        known = ", ".join(field.name for field in fields(record))
        raise ValueError(
            f"{name} has {'a key' if len(unknown) == 1 else 'keys'} that {record.__name__} does not "
            f"take: {', '.join(map(repr, unknown))} (it takes {known})."
        )
    return record(**values)


def record_from(record: type[Record], arguments: Mapping[str, Any], start: Record | None = None) -> Record:
    """The `record` of a function's `arguments` (its `locals()`): each field the function takes,
    by name (the others at their defaults), checked when made. With `start` (a record the caller
    gave too), a field left at its default keeps `start`'s value."""
    given = {field.name: arguments[field.name] for field in fields(record)  # type: ignore[arg-type]
             if field.name in arguments}
    if start is None:
        return record(**given)
    if not isinstance(start, record):
        raise ValueError(f"options must be a {record.__name__}, got {type(start).__name__}.")
    changed = {name: value for name, value in given.items() if not _is_default(record, name, value)}
    return replace(start, **changed)  # type: ignore[type-var]


def _is_default(record: type[Any], name: str, value: Any) -> bool:
    default = getattr(record, name)
    return value is default or (type(value) is type(default) and value == default)


def field_docs(record: type[Any]) -> dict[str, str]:
    """The `Args:` entries of a record's docstring, by field name (each entry's lines as written,
    the first one starting with the name)."""
    docs: dict[str, str] = {}
    lines = inspect.cleandoc(record.__doc__ or "").splitlines()
    start = lines.index("Args:") + 1 if "Args:" in lines else len(lines)
    for line in lines[start:]:
        if line and not line.startswith(" "):
            break
        entry = re.match(r" {4}(\w+): ", line)
        if entry:
            docs[entry.group(1)] = line[4:]
        elif docs and line.strip():
            docs[list(docs)[-1]] += "\n" + line[4:]
    return docs


def with_field_docs(record: type[Any], *, leave_out: Sequence[str] = ()) -> Callable[[Callable_], Callable_]:
    """Decorator: the function's `Args:` section gets the record's entries (but `leave_out`) at
    its end, so each field is documented once, in the record, and `help()` still lists them all.
    The docstring must name the record (a sentence saying where the fields are documented, for
    readers of the source and of the static reference). Only the docstring: the function writes
    each field out in its own signature (tests/python/test_signatures.py checks it does)."""

    def decorate(function: Callable_) -> Callable_:
        if function.__doc__ is None:  # python -OO
            return function
        lines = inspect.cleandoc(function.__doc__).splitlines()
        if "Args:" not in lines or f"`{record.__name__}`" not in function.__doc__:
            raise AssertionError(f"{function.__name__}'s docstring needs Args: and to name {record.__name__}")
        end = lines.index("Args:") + 1
        while end < len(lines) and (lines[end].startswith(" ") or not lines[end]):
            end += 1
        while not lines[end - 1]:  # back over the blank lines that end the section
            end -= 1
        entries = [textwrap.indent(text, "    ") for name, text in field_docs(record).items() if name not in leave_out]
        function.__doc__ = "\n".join([*lines[:end], *entries, *lines[end:]])
        return function

    return decorate
