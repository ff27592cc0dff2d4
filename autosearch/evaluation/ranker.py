"""A ranker that learns where it matters: cheap estimates of every candidate (a
supernet's score, zero-cost proxies, FLOPs, the architecture's encoding) combined by a
model fitted on the few candidates trained for real, which also says where its ranking
of the top is least sure, so that the next training goes there.

The model is scikit-learn's gradient boosting, bagged: ``members`` models, each fitted
on a bootstrap resample of the trained candidates with a seed of its own. Their mean is
the estimate, their spread the uncertainty. Before anything is trained the estimate is
the estimates given combined as the zero-cost estimate combines its proxies (AZ-NAS's
sum of log ranks, :func:`autosearch.scoring.ranks.combined`). What the ranker learned is
its training rows: refitting from them (stored with the study) gives the same model,
bit for bit, on any machine with the same scikit-learn, so a resumed study or a second
worker continues exactly, and nothing is unpickled from a storage.
"""

from __future__ import annotations

import math
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import numpy as np

from autosearch.errors import ConfigError

__all__ = ["Ranker", "RankerConfig"]


MAX_MEMBERS, MAX_TREES, MAX_DEPTH = 64, 5_000, 16


@dataclass(frozen=True, kw_only=True)
class RankerConfig:
    """``members`` bagged gradient-boosting models of ``trees`` trees of ``depth``;
    ``top``: the share of the ranked candidates among which the next to train are
    chosen (by the members' disagreement)."""

    members: int = 8
    trees: int = 100
    depth: int = 2
    learning_rate: float = 0.1
    top: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        # Bounded above too: a confirmation refits the ranker after every trained
        # candidate, and a million trees a member would run for hours, silently.
        for name, least, most in (
            ("members", 1, MAX_MEMBERS),
            ("trees", 1, MAX_TREES),
            ("depth", 1, MAX_DEPTH),
            ("seed", 0, 2**32 - 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
                raise ConfigError(
                    f"RankerConfig {name}={value!r}: expected an integer from {least} to {most}"
                )
        for name, low, high in (("learning_rate", 0.0, 1.0), ("top", 0.0, 1.0)):
            value = getattr(self, name)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and low < value <= high):
                raise ConfigError(
                    f"RankerConfig {name}={value!r}: expected a number in ({low:g}, {high:g}]"
                )


@dataclass
class Ranker:
    """Fitted on (features, trained accuracy) rows; predicts for any features. The
    first ``estimates`` columns of a row are estimates (higher is better: a supernet's
    score, proxies), the rest describe the architecture (its encoding); the prior
    ranks by the estimates only (all columns when None)."""

    config: RankerConfig = field(default_factory=RankerConfig)
    features: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    targets: np.ndarray = field(default_factory=lambda: np.zeros(0))
    estimates: int | None = None

    def __post_init__(self) -> None:
        self._models: list = []
        if len(self.targets):
            self.fit(self.features, self.targets)

    @property
    def fitted(self) -> bool:
        return bool(self._models)

    def fit(self, features: np.ndarray, targets: np.ndarray) -> Ranker:
        """Fit on the trained candidates' ``features`` (rows) and accuracies."""
        from sklearn.ensemble import GradientBoostingRegressor

        features, targets = np.asarray(features, float), np.asarray(targets, float)
        if features.ndim != 2 or len(features) != len(targets):
            raise ConfigError(
                f"the ranker is fitted on one row of features per accuracy; got "
                f"{features.shape} features and {targets.shape} accuracies"
            )
        for what, values in (("features", features), ("accuracies", targets)):
            bad = np.argwhere(~np.isfinite(values))
            if len(bad):
                raise ConfigError(
                    f"the ranker's {what} hold {len(bad)} values that are not finite (the "
                    f"first at row {int(bad[0][0])}); drop or fill those rows before fitting"
                )
        self.features, self.targets, self._models = features, targets, []
        if len(targets) < 2:
            return self  # nothing to learn from: the prior ranks
        for member in range(self.config.members):
            rng = np.random.default_rng([self.config.seed, member])
            rows = rng.integers(0, len(targets), len(targets))
            model = GradientBoostingRegressor(
                n_estimators=self.config.trees,
                max_depth=self.config.depth,
                learning_rate=self.config.learning_rate,
                random_state=int(rng.integers(2**31)),
            )
            self._models.append(model.fit(_squashed(features[rows]), targets[rows]))
        return self

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The estimate of each row, and how much the members disagree on it (their
        standard deviation; 0 before the ranker is fitted)."""
        features = np.asarray(features, float)
        if not self.fitted:
            return prior(features[:, : self.estimates]), np.zeros(len(features))
        each = np.stack([m.predict(_squashed(features)) for m in self._models])
        return each.mean(axis=0), each.std(axis=0)

    def choose(
        self, features: np.ndarray, k: int, *, taken: AbstractSet[int] = frozenset()
    ) -> list[int]:
        """The ``k`` rows to train next: among the top ``config.top`` share by estimate
        (at least ``k`` rows), those the members disagree on most (by estimate where
        they agree, as before the ranker is fitted); rows in ``taken`` are skipped."""
        mean, spread = self.predict(features)
        order = [i for i in np.argsort(-mean, kind="stable") if int(i) not in taken]
        pool = order[: max(k, int(np.ceil(self.config.top * len(order))))]
        chosen = sorted(pool, key=lambda i: (-spread[i], -mean[i], i))
        return [int(i) for i in chosen[:k]]


def _squashed(features: np.ndarray) -> np.ndarray:
    """``sign(x) log(1 + |x|)`` of every feature: monotone, so the trees split the same
    way, and within the float32 the trees compute in (synflow reaches 1e40 and more)."""
    return np.sign(features) * np.log1p(np.abs(features))


def prior(features: np.ndarray) -> np.ndarray:
    """The columns' ranks combined as the zero-cost estimate combines its proxies (the
    sum of their log ranks; every estimate counted the same, higher better, a value
    that is not finite last): the ranking before anything is trained."""
    from autosearch.scoring.ranks import combined

    if features.size == 0:
        return np.zeros(len(features))
    return combined({str(i): column for i, column in enumerate(features.T)}, "log_rank")
