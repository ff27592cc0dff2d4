"""One trial, start to end: build → train → measure → evaluate."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from autosearch.architecture import Architecture
from autosearch.cost import measure
from autosearch.data import Dataset
from autosearch.space import SearchSpace
from autosearch.train import EpochResult, TrainConfig, evaluate, train

__all__ = ["TrialResult", "run_trial"]


@dataclass(frozen=True, kw_only=True, eq=False)
class TrialResult:
    """A trained candidate and what was measured of it.

    ``metrics`` holds ``accuracy`` (validation, the search signal), ``test_accuracy``
    (held out, for reports only), ``flops``, ``macs``, ``params``, ``train_seconds`` and
    ``world_size`` (DDP processes that trained it).
    """

    model: nn.Module | None
    metrics: dict[str, float]
    history: tuple[EpochResult, ...]
    precision: str = "fp32"


def run_trial(
    space: SearchSpace,
    arch: Architecture,
    data: Dataset,
    config: TrainConfig,
    *,
    seed: int,
    on_epoch: Callable[[EpochResult], None] | None = None,
    checkpoint: str | Path | None = None,
) -> TrialResult:
    """Check ``arch``'s budget, build it, train it on ``data`` (with the hyperparameters
    it carries, if its space searches them) and measure it. Deterministic for a seed
    on CPU.

    The global torch RNG (weight initialisation) is seeded inside a fork, so a trial
    neither depends on nor disturbs the caller's random state.
    """
    space.check_budget(arch)  # before any training; over budget ends the trial here
    config = dataclasses.replace(config, **space.train_overrides(arch))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = space.build(arch, input_shape=data.input_shape, num_classes=data.num_classes)
        cost = measure(model, data.input_shape)
        result = train(model, data, config, seed=seed, on_epoch=on_epoch, checkpoint=checkpoint)
    test_accuracy, _ = evaluate(model, data.test, data)
    metrics = {
        "accuracy": result.val_accuracy,
        "test_accuracy": test_accuracy,
        "flops": float(cost.flops),
        "macs": float(cost.macs),
        "params": float(cost.params),
        "train_seconds": result.seconds,
        "world_size": float(result.world_size),
    }
    return TrialResult(
        model=model, metrics=metrics, history=result.history, precision=result.precision
    )
