"""Multi-fidelity early stopping across trials: successive halving and Hyperband.

The signal is each trial's validation accuracy after every epoch (stored as Optuna
intermediate values), whatever the study's objectives are, so it works in
multi-objective studies, where Optuna's own pruners refuse to run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autosearch._checks import check_fields, whole

__all__ = ["EarlyStopping", "Hyperband", "SuccessiveHalving", "from_dict"]


@dataclass(frozen=True, kw_only=True)
class SuccessiveHalving:
    """Asynchronous successive halving (ASHA, Li et al. 2020).

    Rungs sit at ``min_epochs × reduction^k`` epochs. A trial reaching a rung goes on
    only if its validation accuracy there is among the best ``1 / reduction`` of every
    trial that reached that rung so far; until ``reduction`` trials have, it goes on.
    """

    min_epochs: int = 1
    reduction: int = 3

    def __post_init__(self) -> None:
        check_fields(
            type(self).__name__,
            self,
            (
                ("min_epochs", whole(1), "an integer >= 1"),
                ("reduction", whole(2), "an integer >= 2"),
            ),
        )

    def rungs(self, epochs: int, bracket: int = 0) -> list[int]:
        rungs, rung = [], self.min_epochs * self.reduction**bracket
        while rung < epochs:
            rungs.append(rung)
            rung *= self.reduction
        return rungs

    def bracket(self, trial: int, epochs: int) -> int:
        return 0

    def should_stop(
        self,
        *,
        trial: int,
        epoch: int,
        epochs: int,
        value: float,
        others: Mapping[int, Mapping[int, float]],
    ) -> bool:
        """Whether ``trial``, at ``value`` after ``epoch`` of ``epochs``, stops here.
        ``others`` maps other trials to their {epoch: validation accuracy}."""
        bracket = self.bracket(trial, epochs)
        if epoch not in self.rungs(epochs, bracket):
            return False
        peers = [
            h[epoch] for t, h in others.items() if epoch in h and self.bracket(t, epochs) == bracket
        ]
        if len(peers) + 1 < self.reduction:
            return False
        keep = max(1, (len(peers) + 1) // self.reduction)
        better = sum(p > value for p in peers)
        return better >= keep

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": type(self).__name__,
            "min_epochs": self.min_epochs,
            "reduction": self.reduction,
        }


@dataclass(frozen=True, kw_only=True)
class Hyperband(SuccessiveHalving):
    """Hyperband (Li et al. 2018) on ASHA: trials are dealt round-robin to brackets
    whose first rung is ``min_epochs × reduction^b``, hedging against a first rung
    that is too early to tell good candidates apart."""

    def brackets(self, epochs: int) -> int:
        count = 1
        while self.min_epochs * self.reduction**count < epochs:
            count += 1
        return count

    def bracket(self, trial: int, epochs: int) -> int:
        return trial % self.brackets(epochs)


EarlyStopping = SuccessiveHalving  # Hyperband is one too
_KINDS = {"SuccessiveHalving": SuccessiveHalving, "Hyperband": Hyperband}


def from_dict(data: Mapping[str, object] | None) -> SuccessiveHalving | None:
    if not data:
        return None
    options = {k: v for k, v in data.items() if k != "kind"}
    return _KINDS[str(data["kind"])](**options)  # type: ignore[arg-type]
