"""A space's gene domains as Optuna distributions: how a study writes an architecture
as an Optuna trial's params, and how Optuna samplers propose genes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from autosearch.architecture import Gene
from autosearch.space import Categorical, Domain, IntRange, SearchSpace

__all__ = ["distribution", "distributions", "suggest"]

_DISTRIBUTIONS: dict[type, Callable[[Any], BaseDistribution]] = {
    Categorical: lambda d: CategoricalDistribution(d.choices),
    IntRange: lambda d: IntDistribution(d.low, d.high, step=d.step),
}


def distribution(domain: Domain) -> BaseDistribution:
    """The Optuna distribution of one gene domain."""
    return _DISTRIBUTIONS[type(domain)](domain)


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Every gene of ``space`` as an Optuna distribution, in gene order."""
    return {gene: distribution(d) for gene, d in space.domains().items()}


def suggest(trial: optuna.Trial, gene: str, domain: Domain) -> Gene:
    """Ask an Optuna trial for one gene's value."""
    return _SUGGEST[type(domain)](trial, gene, domain)


_SUGGEST: dict[type, Callable[[optuna.Trial, str, Any], Gene]] = {
    Categorical: lambda t, g, d: cast(Gene, t.suggest_categorical(g, d.choices)),
    IntRange: lambda t, g, d: t.suggest_int(g, d.low, d.high, step=d.step),
}
