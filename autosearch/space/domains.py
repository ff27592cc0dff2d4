"""The values a gene may take (:class:`Categorical`, :class:`IntRange`): each draws,
encodes and describes its own values; and the sizes any space accepts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autosearch.architecture import Gene
from autosearch.errors import ConfigError

__all__ = ["SIZE_LIMITS", "Categorical", "Domain", "IntRange", "check_sizes"]

# The largest size of each kind a space accepts. A stored study is data: one holding
# widths=[10**9] or max_stages=10**6 is refused in one line when it is read, not in an
# allocation when a worker builds the network. Far above any network trained today.
SIZE_LIMITS = {"channels": 8192, "blocks": 1024, "stages": 32, "stride": 8, "kernel": 31}


def check_sizes(owner: str, kind: str, **sizes: Any) -> None:
    """Refuse any of ``sizes`` (a number, or a sequence of them) that is not a whole
    number from 1 to ``SIZE_LIMITS[kind]``, naming ``owner``'s field."""
    limit = SIZE_LIMITS[kind]
    for name, given in sizes.items():
        values = given if isinstance(given, tuple | list) else (given,)
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                raise ConfigError(
                    f"{owner} {name}: {value!r} is not a number of {kind} from 1 to {limit}"
                )


@dataclass(frozen=True)
class Categorical:
    """A gene whose value is one of ``choices`` (ints, floats, strings or bools)."""

    choices: tuple[Gene, ...]
    default: Gene | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "choices", tuple(self.choices))
        if not self.choices:
            raise ConfigError("a Categorical domain needs at least one choice")
        if self.default is None:
            object.__setattr__(self, "default", self.choices[0])
        elif self.default not in self.choices:
            raise ConfigError(f"default {self.default!r} is not one of {self.choices}")

    def values(self) -> tuple[Gene, ...]:
        return self.choices

    def contains(self, value: Gene) -> bool:
        # bool is an int in Python: keep True from matching a choice of 1.
        return any(type(value) is type(c) and value == c for c in self.choices)

    def sample(self, rng: np.random.Generator) -> Gene:
        return self.choices[int(rng.integers(len(self.choices)))]

    def encode(self, value: Gene) -> float:
        """Position of ``value`` among the choices, scaled to [0, 1]."""
        index = self.choices.index(value)
        return index / max(len(self.choices) - 1, 1)

    def describe(self) -> str:
        return "{" + ", ".join(map(str, self.choices)) + "}"


@dataclass(frozen=True)
class IntRange:
    """An integer gene in ``[low, high]`` (both included) on a grid of ``step``."""

    low: int
    high: int
    step: int = 1
    default: int | None = None

    def __post_init__(self) -> None:
        if self.high < self.low or self.step < 1 or (self.high - self.low) % self.step:
            raise ConfigError(
                f"IntRange({self.low}, {self.high}, step={self.step}) is empty or off-grid"
            )
        if self.default is None:
            object.__setattr__(self, "default", self.low)
        elif not self.contains(self.default):
            raise ConfigError(f"default {self.default!r} is not in {self.describe()}")

    def values(self) -> tuple[int, ...]:
        return tuple(range(self.low, self.high + 1, self.step))

    def contains(self, value: Gene) -> bool:
        return (
            type(value) is int
            and self.low <= value <= self.high
            and (value - self.low) % self.step == 0
        )

    def sample(self, rng: np.random.Generator) -> int:
        return self.low + self.step * int(rng.integers((self.high - self.low) // self.step + 1))

    def encode(self, value: Gene) -> float:
        return (int(value) - self.low) / max(self.high - self.low, 1)

    def describe(self) -> str:
        step = f" step {self.step}" if self.step != 1 else ""
        return f"[{self.low}..{self.high}{step}]"


Domain = Categorical | IntRange
