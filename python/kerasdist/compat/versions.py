"""The version gates every workaround in compat uses: a (major, minor) range, low included, high
excluded, of the upstream releases the workaround was checked on."""

from __future__ import annotations

VersionRange = tuple[tuple[int, int], tuple[int, int]]


def version_within(version: str, bounds: VersionRange) -> bool:
    """Whether `version`'s (major, minor) lies in [low, high) of `bounds`."""
    major_minor = tuple(int(part) for part in version.split(".")[:2])
    low, high = bounds
    return low <= major_minor < high
