"""Checks of configuration values, one table per config: each field's test and what it
expects, so that a value from a user or a stored study (JSON: ``true`` is not ``1``,
``"3"`` is not ``3``) is refused in one line when the config is made."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from typing import Any

from autosearch.errors import require

__all__ = ["Check", "check_fields", "flag", "real", "whole"]

Check = tuple[str, Callable[[Any], bool], str]  # (field, test, what is expected)


def whole(least: int) -> Callable[[Any], bool]:
    """An integer ``>= least`` (not a bool, not a float)."""
    return lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= least


def real(low: float, high: float = math.inf, *, above: bool = False) -> Callable[[Any], bool]:
    """A finite number in ``[low, high)`` (``above``: ``(low, high)``); not a bool."""

    def ok(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            return False
        x = float(v)
        return (low < x if above else low <= x) and x < high

    return ok


def flag(v: Any) -> bool:
    """True or False (not 0 or 1)."""
    return isinstance(v, bool)


def check_fields(owner: str, config: object, checks: Iterable[Check]) -> None:
    """Refuse the first field of ``config`` that fails its check (ConfigError naming
    ``owner``, the field, the value and what is expected)."""
    for name, ok, expected in checks:
        value = getattr(config, name)
        require(ok(value), f"{owner} {name}", value, expected)
