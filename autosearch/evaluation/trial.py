"""One trial's plan and result: what the study hands the runner (a
:class:`TrialPlan`, and a :class:`TrialContext` that answers from the study while the
trial runs) and what it gets back (a :class:`TrialResult`: every measured point, base
and variants, each with its reward). Plain types, so that the study's parts and the
runner agree on them without importing each other."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch.nn as nn

from autosearch.architecture import Architecture
from autosearch.compress import Compression, VariantSpec
from autosearch.controller import Outcome
from autosearch.data import Dataset
from autosearch.evaluation.proxies import ProxyConfig
from autosearch.evaluation.tabular import Table
from autosearch.evaluation.user import Evaluator
from autosearch.scoring import Reward
from autosearch.space import SearchSpace
from autosearch.training.early_stopping import SuccessiveHalving
from autosearch.training.train import EpochResult, TrainConfig, TrainResult
from autosearch.weight_sharing.supernet import SubnetEvaluator

__all__ = [
    "TRAIN_STATE",
    "CandidateTrainer",
    "Interrupted",
    "TakenOver",
    "Trained",
    "TrialContext",
    "TrialPlan",
    "TrialResult",
    "VariantResult",
]

TRAIN_STATE = "train.pt"  # the training checkpoint, in an attempt's work folder


# (build, data, config, seed, the attempt's folder) -> (the trained model, its result,
# what else to record): how a candidate trains where not by one run (the shape of
# autosearch.export.retrain.Trainer, so a population trains an export or a trial alike).
CandidateTrainer = Callable[
    [Callable[[], nn.Module], Dataset, TrainConfig, int, Path],
    tuple[nn.Module, TrainResult, dict[str, Any]],
]


@dataclass(frozen=True, kw_only=True)
class TrialPlan:
    """What one trial evaluates, and how.

    Attributes:
        space, arch: The candidate.
        train: The study's training config (see :attr:`config` for what trains).
        seed: The trial's seed (weights, data order, augmentation, variants).
        number: The trial's number (Hyperband deals trials to brackets by it).
        reward: Turns each point's metrics into the scalar controllers maximise.
        variants: Variants derived and measured besides the base network.
        compression: How variants are derived.
        early_stopping: Stops the trial when it falls behind its peers.
        table: Look the candidate up in this benchmark table instead of training.
        supernet: Evaluate the candidate on this trained supernet instead of training
            it (weights inherited, batch norm recalibrated).
        proxies: Score the candidate with these zero-cost proxies at its
            initialization (autosearch.evaluation.proxies), beside training it.
        work: This attempt's folder: training writes its checkpoint there every epoch,
            and each variant's result once derived; what it already holds (an attempt
            resumed) is not done again.
        trainer: Trains the candidate another way than one run, in ``work`` (a
            population: autosearch.population, where a confirmation asks).
        evaluator: A user's evaluator trains and scores the candidate instead of the
            study's trainer (autosearch.evaluation.user); ``evaluator_name`` names it;
            ``needs``: the figures it must return (accuracy, and the study's objectives
            it declared as its own metrics).
    """

    space: SearchSpace
    arch: Architecture
    train: TrainConfig = field(default_factory=TrainConfig)
    seed: int = 0
    number: int = 0
    reward: Reward = field(default_factory=lambda: Reward(kind="accuracy"))
    variants: tuple[VariantSpec, ...] = ()
    compression: Compression = field(default_factory=Compression)
    early_stopping: SuccessiveHalving | None = None
    table: Table | None = None
    supernet: SubnetEvaluator | None = None
    proxies: ProxyConfig | None = None
    work: Path | None = None
    trainer: CandidateTrainer | None = None
    evaluator: Evaluator | None = None
    evaluator_name: str = ""
    needs: tuple[str, ...] = ("accuracy",)  # the figures an evaluator (or a tell) must give

    @property
    def config(self) -> TrainConfig:
        """The study's training config with this candidate's own settings applied
        (searched hyperparameters): it trains the candidate and fine-tunes its variants."""
        return dataclasses.replace(self.train, **self.space.train_overrides(self.arch))


class TrialContext:
    """What a running trial may ask of its study; the defaults suit a trial run alone."""

    def epoch_done(self, epoch: EpochResult) -> None:
        """An epoch finished (its checkpoint is written): record it, show progress."""

    def work_saved(self) -> None:
        """Something was written to the attempt's folder (a derived variant)."""

    def interrupted(self) -> bool:
        """Whether the user asked to stop (Ctrl-C, SIGTERM) after this epoch."""
        return False

    def peers(self) -> Mapping[int, Mapping[int, float]]:
        """Other trials' validation accuracy by epoch (early stopping compares)."""
        return {}

    def on_front(self, metrics: Mapping[str, float]) -> bool:
        """Whether a trained candidate is on the study's accuracy-FLOPs front so far."""
        return True

    def teacher(self, metrics: Mapping[str, float]) -> nn.Module | None:
        """The distillation teacher for a candidate (None: it teaches itself)."""
        return None

    def taken_over(self) -> str | None:
        """Why this trial is no longer this worker's (another took it over), or None."""
        return None


class Interrupted(Exception):
    """The user stopped the study after an epoch; the trial resumes from its checkpoint."""


class TakenOver(Exception):
    """Another worker took this trial over (this one was silent too long): drop it."""


@dataclass(frozen=True, kw_only=True)
class VariantResult:
    """One measured point of a candidate: ``"base"`` or a variant, with its metrics
    (reward included), or the reason the variant could not be derived."""

    name: str
    metrics: dict[str, float]
    reason: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.reason)


@dataclass(frozen=True, kw_only=True, eq=False)
class TrialResult:
    """A whole trial: the base point first, then each variant's.

    ``status`` is ``"stopped"`` when early stopping ended training (the base point then
    holds the accuracy reached and the architecture's cost). ``note`` says why no
    variants were derived, when that was decided.
    """

    status: Literal["complete", "stopped"]
    points: tuple[VariantResult, ...]
    model: nn.Module | None = None
    history: tuple[EpochResult, ...] = ()
    precision: str = "fp32"
    resumed_from_epoch: int = 0
    note: str = ""
    evaluated_by: Literal["training", "table", "supernet", "evaluator"] = "training"
    supernet: str = ""  # the digest of the supernet weights that scored it
    # How it trained where not by one run ({"population": its rounds, winner, schedule}).
    trained_as: dict[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> VariantResult:
        return self.points[0]

    @property
    def best(self) -> VariantResult:
        """The point with the highest reward: a candidate is ranked by its best variant."""
        done = [p for p in self.points if not p.failed]
        return max(done, key=lambda p: p.metrics["reward"])

    def outcome(self, objectives: tuple[str, ...]) -> Outcome:
        best = self.best.metrics
        return Outcome(
            reward=best["reward"],
            status=self.status,
            objectives={o: best[o] for o in objectives if o in best},
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class Trained:
    """A trained candidate (before variants): its network, metrics and history."""

    model: nn.Module
    metrics: dict[str, float]
    history: tuple[EpochResult, ...]
    precision: str
    trained_as: dict[str, Any] = field(default_factory=dict)  # see TrialResult
