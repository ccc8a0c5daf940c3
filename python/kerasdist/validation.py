"""Argument checks, one style for every public function.

Each check returns the value in its plain Python form or raises ValueError with one message shape:
"<argument> must be <what was expected>, got <what was given>." Counts must be Python or NumPy
integers: floats are refused even when whole (R's wrappers convert their doubles with
`as_py_int()` at the boundary, so Python need not guess), and so are bools and strings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

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


def choice(name: str, value: Any, options: Sequence[str]) -> str:
    """`value` if it is one of the strings `options`."""
    if not isinstance(value, str) or value not in options:
        quoted = [repr(option) for option in options]
        listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        raise ValueError(f"{name} must be {listed}, got {value!r}.")
    return value
