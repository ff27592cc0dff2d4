"""The objectives a study optimizes (each a metric and its direction) and the scalar
reward of a point: accuracy per cost, in the forms the field uses (MnasNet's soft and
hard constraints, plain accuracy)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from autosearch.errors import ConfigError, UnknownNameError
from autosearch.scoring.metrics import METRICS, objective_names
from autosearch.scoring.pareto import Direction

__all__ = [
    "COST_METRICS",
    "Objective",
    "Reward",
    "check_reward",
    "objective",
    "parse_reward",
    "resolve_reward",
    "reward",
    "reward_names",
]


@dataclass(frozen=True, kw_only=True)
class Objective:
    name: str
    direction: Direction
    description: str


def objective(name: str) -> Objective:
    """An objective a study may optimise (its direction and meaning come from the metric
    vocabulary, autosearch.scoring.metrics)."""
    found = METRICS.get(name)
    if found is None or not found.objective or found.direction is None:
        raise UnknownNameError("objective", name, objective_names())
    return Objective(name=name, direction=found.direction, description=found.description)


# Rewards ------------------------------------------------------------------------------
# A reward maps a candidate's metrics to the scalar single-objective controllers maximise.
#
# Why the default is MnasNet's soft constraint and not accuracy per FLOP: the plain ratio
# accuracy / GFLOPs grows without bound as a network shrinks, so a 1-FLOP network that
# guesses (10 % on ten classes) beats every useful one; the search collapses to the
# smallest, useless networks. ``accuracy × (cost / target) ** w`` with a small negative
# ``w`` (MnasNet: -0.07) trades accuracy against cost smoothly around a target cost:
# halving the cost is worth about 5 % of relative accuracy, never more.

COST_METRICS = ("flops", "macs", "sparse_macs", "params", "bops", "bytes", "latency")
MNAS_WEIGHT = -0.07


@dataclass(frozen=True, kw_only=True)
class Reward:
    """A parsed reward: ``kind`` with, for cost-aware kinds, a cost ``metric`` and its
    ``target``. Written as a string: ``"accuracy"``, ``"accuracy-per-gflop"``,
    ``"mnas@flops=5e6"`` (optionally ``,w=-0.07``) or ``"hard@macs=2e6"``."""

    kind: str
    metric: str = "flops"
    target: float | None = None
    weight: float = MNAS_WEIGHT

    def __str__(self) -> str:
        if self.kind in ("accuracy", "accuracy-per-gflop"):
            return self.kind
        if self.target is None:  # not resolved yet
            return f"{self.kind}@{self.metric}"
        text = f"{self.kind}@{self.metric}={self.target:.6g}"
        return text + (f",w={self.weight:g}" if self.kind == "mnas" else "")

    def __call__(self, metrics: Mapping[str, float]) -> float:
        return _REWARDS[self.kind](self, metrics)


def _mnas(r: Reward, m: Mapping[str, float]) -> float:
    cost = max(float(m[r.metric]), 1e-12)
    return float(m["accuracy"]) * (cost / float(r.target or 1.0)) ** r.weight


def _hard(r: Reward, m: Mapping[str, float]) -> float:
    return float(m["accuracy"]) if float(m[r.metric]) <= float(r.target or 0.0) else 0.0


_REWARDS: dict[str, Callable[[Reward, Mapping[str, float]], float]] = {
    "accuracy": lambda r, m: float(m["accuracy"]),
    "accuracy-per-gflop": lambda r, m: float(m["accuracy"]) / max(float(m["flops"]) / 1e9, 1e-12),
    "mnas": _mnas,
    "hard": _hard,
}


def parse_reward(text: str | Reward) -> Reward:
    """Parse a reward string (see :class:`Reward`); a missing target stays None, for
    :func:`resolve_reward` to fill in."""
    if isinstance(text, Reward):
        return text
    kind, _, args = str(text).strip().partition("@")
    if kind not in _REWARDS:
        raise UnknownNameError("reward", kind, _REWARDS)
    options: dict[str, str] = {}
    for part in filter(None, args.split(",")):
        key, eq, value = part.partition("=")
        if not eq and key.strip() not in COST_METRICS:
            raise ConfigError(
                f"reward {text!r}: expected METRIC=TARGET after '@' (e.g. mnas@flops=5e6,w=-0.07)"
            )
        options[key.strip()] = value.strip()
    weight = options.pop("w", None)
    metric = next(iter(options), "flops")
    if len(options) > 1 or (options and metric not in COST_METRICS):
        raise ConfigError(
            f"reward {text!r}: give one cost target among {', '.join(COST_METRICS)}, "
            "e.g. mnas@flops=5e6"
        )
    if kind in ("accuracy", "accuracy-per-gflop") and (options or weight):
        raise ConfigError(f"reward {kind!r} takes no options, got {text!r}")
    try:
        target = float(options[metric]) if options.get(metric) else None
        w = float(weight) if weight is not None else MNAS_WEIGHT
    except ValueError:
        raise ConfigError(f"reward {text!r}: target and w must be numbers") from None
    if target is not None and not target > 0:
        raise ConfigError(f"reward {text!r}: the target must be positive")
    return Reward(kind=kind, metric=metric, target=target, weight=w)


def resolve_reward(text: str | Reward, default_target: Callable[[str], float | None]) -> Reward:
    """Parse ``text`` and fill a missing target with ``default_target(metric)``."""
    parsed = parse_reward(text)
    if parsed.kind in ("mnas", "hard") and parsed.target is None:
        target = default_target(parsed.metric)
        if target is None:
            raise ConfigError(
                f"reward {str(text)!r} needs a target for {parsed.metric}, e.g. "
                f"{parsed.kind}@{parsed.metric}=...; none can be derived from the space"
            )
        parsed = dataclasses.replace(parsed, target=float(target))
    return parsed


def reward(name: str | Reward, metrics: Mapping[str, float]) -> float:
    """The scalar reward ``name`` of a candidate's metrics (higher is better)."""
    parsed = parse_reward(name)
    if parsed.kind in ("mnas", "hard") and parsed.target is None:
        raise ConfigError(f"reward {str(name)!r} has no target; use resolve_reward")
    return parsed(metrics)


def reward_names() -> list[str]:
    return sorted(_REWARDS)


def check_reward(name: str) -> None:
    """Raise (UnknownNameError with suggestions) unless ``name`` parses as a reward."""
    parse_reward(name)
