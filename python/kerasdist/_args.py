"""Argument checks shared by modules whose messages agree."""

from __future__ import annotations

from typing import Any


def whole_number(name: str, value: Any, minimum: int) -> int:
    """`value` as an int >= minimum; whole doubles (what R passes) are accepted."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return value
