"""Objectives, the scalar reward, and Pareto fronts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from autosearch.errors import UnknownNameError
from autosearch.pareto import Direction, pareto_mask

__all__ = [
    "Objective",
    "check_reward",
    "objective",
    "objective_names",
    "pareto_mask",
    "reward",
    "reward_names",
]


@dataclass(frozen=True, kw_only=True)
class Objective:
    name: str
    direction: Direction
    description: str


_OBJECTIVES = {
    o.name: o
    for o in (
        Objective(
            name="accuracy",
            direction="maximize",
            description="validation top-1 accuracy (fraction)",
        ),
        Objective(
            name="flops",
            direction="minimize",
            description="FLOPs per image = 2 x MACs of conv/linear layers",
        ),
        Objective(
            name="macs",
            direction="minimize",
            description="multiply-accumulates per image of conv/linear layers",
        ),
        Objective(name="params", direction="minimize", description="number of parameters"),
        Objective(
            name="train_seconds",
            direction="minimize",
            description="training time in seconds (measured, or from a benchmark table)",
        ),
    )
}


def objective(name: str) -> Objective:
    try:
        return _OBJECTIVES[name]
    except KeyError:
        raise UnknownNameError("objective", name, _OBJECTIVES) from None


def objective_names() -> list[str]:
    return sorted(_OBJECTIVES)


# Rewards map a trial's metrics to the scalar that single-objective controllers maximise.
_REWARDS: dict[str, Callable[[Mapping[str, float]], float]] = {
    "accuracy": lambda metrics: float(metrics["accuracy"]),
}


def reward(name: str, metrics: Mapping[str, float]) -> float:
    """The scalar reward ``name`` of a trial's metrics (higher is better)."""
    try:
        fn = _REWARDS[name]
    except KeyError:
        raise UnknownNameError("reward", name, _REWARDS) from None
    return fn(metrics)


def reward_names() -> list[str]:
    return sorted(_REWARDS)


def check_reward(name: str) -> None:
    """Raise UnknownNameError (with suggestions) unless ``name`` is a known reward."""
    if name not in _REWARDS:
        raise UnknownNameError("reward", name, _REWARDS)
