"""The predictor that ranks unseen neighbours: ridge regression on one-hot genes.

As in BANANAS and NPENAS, a cheap model of the results decides which candidate to
evaluate next; here a linear one over the genes' one-hot encoding (which value of each
gene pays), refitted at every ask in well under a millisecond. Fitted on the best and
the most recent results (a local model) it ranked one-gene neighbours better than
fitted on all of them (benchmarks/RESULTS.md). Several targets (objectives) are fitted
at once, each standardised.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autosearch.architecture import Architecture
from autosearch.space import SearchSpace


class OneHotRidge:
    """Encodes architectures (one indicator per gene value, and an intercept), with a
    cache by architecture id, and fits ridge regressions on them."""

    def __init__(self, space: SearchSpace, ridge: float = 1.0) -> None:
        self.space, self.ridge = space, ridge
        self._rows: dict[str, np.ndarray] = {}

    def encode(self, archs: Sequence[Architecture]) -> np.ndarray:
        if len(self._rows) > 20_000:  # a cache: bounded, whatever the study's length
            self._rows.clear()
        rows = []
        for arch in archs:
            row = self._rows.get(arch.arch_id)
            if row is None:
                row = self._rows[arch.arch_id] = np.append(self.space.one_hot(arch), 1.0)
            rows.append(row)
        return np.stack(rows)

    def fit(self, archs: Sequence[Architecture], targets: np.ndarray) -> _Fitted:
        """Ridge regression of ``targets`` (n, or n × k) on ``archs`` (the intercept is
        not shrunk; each target column is standardised, and predictions are in those
        standard units)."""
        x = self.encode(archs)
        y = np.asarray(targets, dtype=np.float64).reshape(len(archs), -1)
        fitted = _Fitted(self, y.mean(axis=0), y.std(axis=0) + 1e-12)
        penalty = self.ridge * np.eye(x.shape[1])
        penalty[-1, -1] = 0.0
        fitted.weights = np.linalg.solve(x.T @ x + penalty, x.T @ fitted.standardise(y))
        return fitted


class _Fitted:
    """A fitted regression; predictions are in the targets' standard units."""

    def __init__(self, model: OneHotRidge, mean: np.ndarray, scale: np.ndarray) -> None:
        self.model, self.mean, self.scale = model, mean, scale
        self.weights = np.zeros((0, len(mean)))

    def standardise(self, targets: np.ndarray) -> np.ndarray:
        return np.asarray((np.asarray(targets, dtype=np.float64) - self.mean) / self.scale)

    def predict(self, archs: Sequence[Architecture]) -> np.ndarray:
        """(n × k) predictions, in the training targets' standard units."""
        return np.asarray(self.model.encode(archs) @ self.weights)
