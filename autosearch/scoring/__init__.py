"""Scoring: what a candidate costs and how good it is.

- ``reward``: the objectives a study optimizes, the scalar reward of a point;
- ``metrics``: the metric vocabulary (names, units, directions, bounds);
- ``cost``: FLOPs, MACs, parameters, bytes, latency timed;
- ``latency``: latency predicted from a lookup table of measured layers;
- ``pareto``: non-dominated sorting and the hypervolume of a front.
"""

from __future__ import annotations

from autosearch.scoring.metrics import objective_names
from autosearch.scoring.pareto import pareto_mask
from autosearch.scoring.reward import (
    COST_METRICS,
    Objective,
    Reward,
    check_reward,
    objective,
    parse_reward,
    resolve_reward,
    reward,
    reward_names,
)

__all__ = [
    "COST_METRICS",
    "Objective",
    "Reward",
    "check_reward",
    "objective",
    "objective_names",
    "pareto_mask",
    "parse_reward",
    "resolve_reward",
    "reward",
    "reward_names",
]
