"""One error family for everything a user can get wrong.

Every message says what was given, what was expected, and how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "AutosearchError",
    "BudgetError",
    "ConfigError",
    "DataError",
    "ExportError",
    "InvalidArchitectureError",
    "MissingGeneError",
    "PlatformError",
    "SpaceExhausted",
    "StorageError",
    "StudyError",
    "StudyFileError",
    "TrialFailed",
    "UnknownNameError",
    "require",
    "suggest",
]


class AutosearchError(Exception):
    """Base class of every error autosearch raises on purpose."""


class UnknownNameError(AutosearchError, KeyError):
    """A name (space, controller, dataset, objective...) that is not registered."""

    def __init__(self, kind: str, name: str, known: Iterable[str]) -> None:
        known = sorted(known)
        self.kind, self.name, self.known = kind, name, known
        close = suggest(name, known)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        super().__init__(
            f"unknown {kind} {name!r}.{hint} Known {kind}s: {', '.join(known) or '(none)'}."
        )

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0])


class ConfigError(AutosearchError, ValueError):
    """A setting that cannot be used (a number out of range, an unknown option): the
    message names the setting, the value given, what is allowed, and how to fix it."""


class InvalidArchitectureError(AutosearchError, ValueError):
    """An architecture that its space cannot build (wrong gene, value, or JSON)."""


class MissingGeneError(InvalidArchitectureError, KeyError):
    """A gene an architecture does not have (a KeyError, so Mapping lookups work)."""

    def __str__(self) -> str:
        return str(self.args[0])


class BudgetError(InvalidArchitectureError):
    """An architecture over the space's FLOPs or parameter budget."""


class StorageError(AutosearchError):
    """A storage URL that cannot be used, or a study that is not in it."""


class StudyError(AutosearchError):
    """A study used in a way its stored definition does not allow."""


class SpaceExhausted(StudyError):
    """Every architecture of the space (within its budget) has been proposed: the search
    is complete. A study ends on it, with this message; nothing else ends a search."""


class StudyFileError(AutosearchError):
    """A study file that cannot be run (missing, broken, or defining no study)."""


class DataError(AutosearchError):
    """A dataset that cannot be loaded or split."""


class ExportError(AutosearchError):
    """A record that cannot be exported (no weights, unknown trial...)."""


class PlatformError(AutosearchError):
    """The platform failed, not the candidate: storage, artifact or checkpoint I/O (a
    read-only or full disk, an unreachable database). The message names the path; the
    trial stays resumable and the worker stops."""


class TrialFailed(AutosearchError):
    """Raised inside a trial to end it as failed with a reason (NaN loss, ...)."""


def require(ok: bool, setting: str, value: object, expected: str) -> None:
    """Raise ConfigError ``"SETTING=VALUE: expected EXPECTED"`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{setting}={value!r} cannot be used: expected {expected}")


def suggest(name: str, known: Iterable[str], *, n: int = 3) -> list[str]:
    """Return up to ``n`` known names close to ``name`` (case-insensitive)."""
    known = list(known)
    lowered = {k.lower(): k for k in known}
    hits = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    return [lowered[h] for h in hits]
