"""Several estimates of a pool of candidates combined into one ranking by their ranks:
the zero-cost estimate (the proxies of ``autosearch.evaluation.proxies``), the ranker's
prior, the warm-up of controllers.

AZ-NAS (Lee & Ham, CVPR 2024) sums the logarithms of each estimate's rank over the pool,
``Σ_m log(rank_m / n)`` (rank n the best): a candidate ranks high only where every
estimate ranks it high, since one low rank costs more than several high ranks gain. The
mean of the ranks is the earlier ensemble (Abdelfattah et al. 2021).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from autosearch.errors import ConfigError, UnknownNameError

__all__ = ["AGGREGATIONS", "combined"]

AGGREGATIONS = ("log_rank", "mean_rank")


def combined(
    columns: Mapping[str, Sequence[float] | np.ndarray], how: str = "log_rank"
) -> np.ndarray:
    """One estimate a candidate from several proxies of a pool (``columns``: a name to
    one value a candidate, higher better; a value that is not finite ranks last): AZ-NAS's
    ``Σ_m log(rank_m / n)`` (``"log_rank"``: 0 for a candidate every proxy ranks first,
    far below 0 for one any proxy ranks low), or the mean of the ranks (``"mean_rank"``).
    Ties share their mean rank."""
    from scipy import stats  # seconds to import: only where a ranking is made

    if how not in AGGREGATIONS:
        raise UnknownNameError("aggregation", how, AGGREGATIONS)
    values = [np.asarray(v, dtype=float) for v in columns.values()]
    if not values:
        raise ConfigError("combined() needs at least one proxy's column of scores")
    n = len(values[0])
    if any(v.shape != (n,) for v in values):
        raise ConfigError(
            f"combined() needs one value a candidate in every column; got lengths "
            f"{ {k: len(v) for k, v in zip(columns, values, strict=True)} }"
        )
    if n == 0:
        return np.zeros(0)
    ranks = [stats.rankdata(np.where(np.isfinite(v), v, -np.inf)) for v in values]
    if how == "mean_rank":
        return np.mean(ranks, axis=0)
    return np.sum([np.log(r / n) for r in ranks], axis=0)
