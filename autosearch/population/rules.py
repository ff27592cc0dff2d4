"""Population-based training's settings and its explore step (Jaderberg et al. 2017, the
rules of Ray Tune's ``PopulationBasedTraining``).

A population trains together; every ``interval`` epochs the members in the bottom
``quantile`` copy the weights and whole training state of a member in the top quantile
(exploit), then change the copied settings (explore): each setting is drawn anew from
its range with probability ``resample``, else multiplied by one of ``factors`` (a
choice among categories moves to a neighbour), and always kept inside its range.

What may change while a run trains is what the trainer can take mid-run without
restarting: the learning rate's peak (the schedule keeps its course), weight decay and
label smoothing (:data:`autosearch.training.train.ADAPTIVE`). The population itself
(members, rounds, lineage, several workers) is :mod:`autosearch.population.run`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from autosearch.errors import ConfigError
from autosearch.training.train import ADAPTIVE, TrainConfig

__all__ = ["PopulationBasedTraining", "draw", "explore", "perturb"]

Settings = dict[str, Any]


def _default_mutations() -> dict[str, BaseDistribution]:
    return {"lr": FloatDistribution(0.005, 0.5, log=True)}


@dataclass(frozen=True, kw_only=True)
class PopulationBasedTraining:
    """A population trained together, its settings adapted as it trains.

    Attributes:
        size: Members of the population (each a full training run).
        interval: Epochs between two exploit / explore rounds.
        quantile: Share of the members, ranked by validation accuracy, that copy (the
            bottom) and are copied (the top); at most 0.5.
        resample: Probability that an explored setting is drawn anew from its range
            instead of perturbed.
        mutations: The settings that adapt, each with its range as an Optuna
            distribution: ``lr``, ``weight_decay``, ``label_smoothing``. Members start
            from draws of these ranges (the rest of the training settings are shared).
        factors: What a perturbation multiplies a setting by (Ray Tune's 0.8 and 1.2).
        seed: The initial draws and every round's choices (with the same scores, a
            resumed population makes the same decisions).
        burn_in: Epochs before the first round (Ray Tune's ``burn_in_period``): early
            accuracy is noisy, and favours settings that start fast over those that end
            best (a high learning rate under a cosine schedule).
        precise_bn: Training images over which a member's batch-norm statistics are
            recomputed before it is ranked (:func:`autosearch.training.precise_bn.
            precise_bn`); its checkpoint keeps them as trained. Running statistics trail
            weights that move fast, and rank a member with a high learning rate far below
            its worth (Ray Tune's PBT ranks as trained). 0: rank as trained.
    """

    size: int = 8
    interval: int = 2
    quantile: float = 0.25
    resample: float = 0.25
    mutations: Mapping[str, BaseDistribution] = field(default_factory=_default_mutations)
    factors: tuple[float, float] = (0.8, 1.2)
    seed: int = 0
    burn_in: int = 0
    precise_bn: int = 1024

    def __post_init__(self) -> None:
        if not isinstance(self.mutations, Mapping):
            raise ConfigError(
                f"PopulationBasedTraining mutations={self.mutations!r}: expected a mapping of "
                "settings to Optuna distributions, e.g. {'lr': FloatDistribution(0.01, 0.5, "
                "log=True)}"
            )
        if not isinstance(self.factors, tuple | list):
            raise ConfigError(
                f"PopulationBasedTraining factors={self.factors!r}: expected two numbers > 0, "
                "e.g. (0.8, 1.2)"
            )
        object.__setattr__(self, "mutations", dict(self.mutations))
        object.__setattr__(self, "factors", tuple(self.factors))
        problems = []
        if not (isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0):
            problems.append(f"seed={self.seed!r}: expected a whole number >= 0")
        if not (isinstance(self.size, int) and self.size >= 2):
            problems.append(f"size={self.size!r}: a population needs 2 or more members")
        if not (isinstance(self.interval, int) and self.interval >= 1):
            problems.append(f"interval={self.interval!r}: expected a number of epochs >= 1")
        if not (isinstance(self.quantile, int | float) and 0 < self.quantile <= 0.5):
            problems.append(f"quantile={self.quantile!r}: expected a share in (0, 0.5]")
        if not (isinstance(self.resample, int | float) and 0 <= self.resample <= 1):
            problems.append(f"resample={self.resample!r}: expected a probability in [0, 1]")
        if len(self.factors) != 2 or not all(
            isinstance(f, int | float) and math.isfinite(f) and f > 0 for f in self.factors
        ):
            problems.append(f"factors={self.factors!r}: expected two numbers > 0, e.g. (0.8, 1.2)")
        if not (isinstance(self.burn_in, int) and self.burn_in >= 0):
            problems.append(f"burn_in={self.burn_in!r}: expected a number of epochs >= 0")
        if not (
            isinstance(self.precise_bn, int)
            and not isinstance(self.precise_bn, bool)
            and self.precise_bn >= 0
        ):
            problems.append(
                f"precise_bn={self.precise_bn!r}: expected a number of training images >= 0 "
                "(0 ranks members by their running statistics as trained)"
            )
        if not self.mutations:
            problems.append("mutations={}: name at least one setting that adapts, e.g. lr")
        for name, distribution in self.mutations.items():
            if name not in ADAPTIVE:
                problems.append(
                    f"mutations[{name!r}]: only {', '.join(ADAPTIVE)} can change while a "
                    "member trains"
                )
            elif not isinstance(
                distribution, FloatDistribution | IntDistribution | CategoricalDistribution
            ):
                problems.append(
                    f"mutations[{name!r}]={distribution!r}: expected an Optuna "
                    "FloatDistribution, IntDistribution or CategoricalDistribution"
                )
            elif not isinstance(distribution, CategoricalDistribution) and not all(
                math.isfinite(float(bound)) for bound in (distribution.low, distribution.high)
            ):
                problems.append(
                    f"mutations[{name!r}]={distribution!r}: its bounds must be finite numbers"
                )
        if problems:
            raise ConfigError("PopulationBasedTraining " + "; ".join(problems))

    @classmethod
    def of_learning_rate(
        cls, size: int, interval: int, lr: float, *, seed: int
    ) -> PopulationBasedTraining:
        """The command line's population: the learning rate adapts within 1/10 to 10
        times ``lr`` (a recipe's), log-uniformly."""
        return cls(
            size=size,
            interval=interval,
            mutations={"lr": FloatDistribution(lr / 10, lr * 10, log=True)},
            seed=seed,
        )

    def initial(self, member: int) -> Settings:
        """Member ``member``'s first settings: a draw of each range."""
        rng = np.random.default_rng([self.seed, 0, member])
        return {name: draw(d, rng) for name, d in self.mutations.items()}

    def rounds(self, epochs: int) -> list[int]:
        """The epochs after which a round exploits and explores, in a run of ``epochs``."""
        first = max(self.burn_in, 1)
        return [b for b in range(self.interval, epochs, self.interval) if b >= first]

    def check(self, config: TrainConfig) -> None:
        """Refuse a base training configuration every member's settings must fit, or
        one too short for any round (the members would never exploit one another)."""
        if not self.rounds(config.epochs):
            raise ConfigError(
                f"PopulationBasedTraining interval={self.interval}, burn_in={self.burn_in} "
                f"with epochs={config.epochs}: no round before the last epoch, so the members "
                "would never exploit one another; train more epochs or lower interval or burn_in"
            )
        for member in range(self.size):
            try:
                dataclasses.replace(config, **self.initial(member))
            except ConfigError as exc:
                raise ConfigError(f"PopulationBasedTraining mutations: {exc}") from None

    def definition(self) -> dict[str, Any]:
        """A JSON form, to tell one population from another."""
        return {
            "size": self.size,
            "interval": self.interval,
            "quantile": self.quantile,
            "resample": self.resample,
            "factors": list(self.factors),
            "seed": self.seed,
            "burn_in": self.burn_in,
            "mutations": {k: repr(v) for k, v in sorted(self.mutations.items())},
            # absent when 0: a population recorded before the option goes on with 0
            **({"precise_bn": self.precise_bn} if self.precise_bn else {}),
        }


def draw(distribution: BaseDistribution, rng: np.random.Generator) -> Any:
    """A value of ``distribution``'s range (log-uniform where it says ``log``)."""
    if isinstance(distribution, CategoricalDistribution):
        return distribution.choices[int(rng.integers(len(distribution.choices)))]
    low, high = distribution.low, distribution.high  # type: ignore[attr-defined]
    log = distribution.log  # type: ignore[attr-defined]
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if log else rng.uniform(low, high)
    return _inside(distribution, value)


def perturb(distribution: BaseDistribution, value: Any, factor: float) -> Any:
    """``value`` multiplied by ``factor``, kept inside the range (a category moves to the
    neighbour on the factor's side)."""
    if isinstance(distribution, CategoricalDistribution):
        choices = list(distribution.choices)
        index = choices.index(value) + (1 if factor > 1 else -1)
        return choices[min(max(index, 0), len(choices) - 1)]
    return _inside(distribution, value * factor)


def explore(
    settings: Mapping[str, Any], config: PopulationBasedTraining, rng: np.random.Generator
) -> Settings:
    """Copied ``settings`` changed by the explore rule, each inside its range."""
    changed = dict(settings)
    for name, distribution in config.mutations.items():
        if rng.random() < config.resample:
            changed[name] = draw(distribution, rng)
        else:
            factor = config.factors[int(rng.integers(2))]
            changed[name] = perturb(distribution, settings[name], factor)
    return changed


def _inside(distribution: BaseDistribution, value: float) -> Any:
    if isinstance(distribution, IntDistribution):
        step = distribution.step
        low, high = distribution.low, distribution.high
        snapped = low + round((value - low) / step) * step
        return int(min(max(snapped, low), high - (high - low) % step))
    assert isinstance(distribution, FloatDistribution)
    bottom, top = float(distribution.low), float(distribution.high)
    if distribution.step is not None:
        value = bottom + round((value - bottom) / distribution.step) * distribution.step
    return float(min(max(value, bottom), top))
