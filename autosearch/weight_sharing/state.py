"""What a study stores of its trained supernet, typed and checked on read.

Written once the supernet's job is done, as a study system attribute (and as the
result of the job's claim): ``{"status": "complete", "fingerprint", "weights" (an
artifact id), "digest" (a content hash of the weights), "round", "epochs", "seconds",
"history", ...}``. A stored state is data: any field that is not what it should be is
refused in one line, never a traceback later.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autosearch.storage._paths import plain_name

__all__ = ["SupernetState"]

_EPOCH_FIELDS = ("epoch", "train_loss", "val_accuracy", "val_loss", "seconds")


@dataclass(frozen=True, kw_only=True)
class SupernetState:
    """A trained (or imported) supernet of a study.

    Attributes:
        fingerprint: What the weights are for (autosearch.weight_sharing.supernet.fingerprint).
        weights: The artifact id of the weights.
        digest: A content hash of the weights ("" in studies stored before digests).
        round: How many times the weights were lost and the supernet trained again.
        imported_from: The weights file it was imported from (None: trained).
    """

    fingerprint: str
    weights: str
    digest: str = ""
    round: int = 0
    epochs: int = 0
    seconds: float = 0.0
    wall_seconds: float = 0.0
    precision: str = "fp32"
    world_size: int = 1
    history: tuple[Mapping[str, float], ...] = ()
    imported_from: str | None = None

    def to_json(self) -> dict[str, Any]:
        stored = {"status": "complete", **dataclasses.asdict(self)}
        stored["history"] = [dict(e) for e in self.history]
        if self.imported_from is None:
            del stored["imported_from"]
        return stored

    @classmethod
    def read(cls, stored: Any) -> SupernetState:
        """Parse a stored state.

        Raises:
            ValueError: saying which field holds what instead of what it should.
        """
        if not isinstance(stored, Mapping) or stored.get("status") != "complete":
            raise ValueError(f"not the state of a trained supernet: {_short(stored)}")
        fields: dict[str, Any] = {}
        for name, parse in _PARSERS.items():
            if name in stored:
                try:
                    fields[name] = parse(stored[name])
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"its {name} is {_short(stored[name])} ({exc})") from None
        for required in ("fingerprint", "weights"):
            if required not in fields:
                raise ValueError(f"it names no {required}")
        return cls(**fields)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _name(value: Any) -> str:
    if not plain_name(value) or not str(value).isprintable():
        raise ValueError("expected a short plain name")
    return str(value)


def _digest(value: Any) -> str:
    return "" if value == "" else _name(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise ValueError("expected a whole number >= 0")
    return value


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError("expected a number of seconds")
    return float(value) if math.isfinite(value) else math.inf


def _history(value: Any) -> tuple[Mapping[str, float], ...]:
    if not isinstance(value, list):
        raise ValueError("expected a list of epochs")
    epochs = []
    for entry in value:
        if not isinstance(entry, Mapping) or set(_EPOCH_FIELDS) - set(entry):
            raise ValueError(f"an epoch holds {_short(entry)}, not {', '.join(_EPOCH_FIELDS)}")
        numbers = {k: entry[k] for k in _EPOCH_FIELDS}
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in numbers.values()):
            raise ValueError(f"an epoch holds {_short(entry)}, not numbers")
        epochs.append({k: (int(v) if k == "epoch" else float(v)) for k, v in numbers.items()})
    return tuple(epochs)


def _path(value: Any) -> str:
    if not isinstance(value, str) or not value or "\x00" in value:
        raise ValueError("expected a path")
    return value


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "fingerprint": _name,
    "weights": _name,
    "digest": _digest,
    "round": _count,
    "epochs": _count,
    "seconds": _seconds,
    "wall_seconds": _seconds,
    "precision": _name,
    "world_size": _count,
    "history": _history,
    "imported_from": _path,
}
