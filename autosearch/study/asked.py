"""Ask and tell: a study's candidates run by a loop of the user's own.

``study.ask()`` claims the next trial exactly as ``optimize`` does (a trial cut short
first, else the controller's next architecture; held by a heartbeat while the user's
loop runs it) and hands back an :class:`AskedTrial`; ``study.tell(trial, figures)``
stores its figures (or its failure), counts its costs, scores it and tells the
controller. A trial asked and never told (the user's process died) is taken up by the
next claim, ``ask`` or ``optimize``, once its heartbeat is stale.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from autosearch.architecture import Architecture
from autosearch.compress import Derived
from autosearch.data import Dataset
from autosearch.errors import ConfigError, StudyError, TrialFailed
from autosearch.evaluation.runner import candidate_builder, profile
from autosearch.evaluation.trial import TrialPlan, TrialResult, VariantResult
from autosearch.evaluation.user import checked_figures
from autosearch.study.claims import Claim
from autosearch.study.loop import SearchLoop
from autosearch.study.records import Record
from autosearch.training.train import TrainConfig

__all__ = ["AskedTrial", "Asker"]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class AskedTrial:
    """A candidate the study handed to the user's loop; tell it back with
    :meth:`autosearch.Study.tell`.

    Attributes:
        number: The trial's number in the study.
        arch: Its architecture; ``description`` says it in a line.
        hyperparameters: Its searched training settings (the space's training genes).
        config: The study's training settings with those applied.
        seed: The trial's seed.
    """

    number: int
    arch: Architecture
    description: str
    hyperparameters: Mapping[str, Any]
    config: TrainConfig
    seed: int
    _claim: Claim = field(repr=False)
    _plan: TrialPlan = field(repr=False)
    _data: Dataset | None = field(repr=False)
    _held: contextlib.ExitStack = field(repr=False)
    _asker: Asker = field(repr=False)
    _epochs: list[int] = field(default_factory=list, repr=False)
    told: bool = False

    def build(self) -> nn.Module:
        """The network, built for the study's data and initialised with the trial's seed
        (the same network an evaluator or the study's trainer starts from)."""
        if self._data is None:
            raise StudyError("a table study trains nothing: there is no network to build")
        with torch.random.fork_rng(devices=[]):
            return candidate_builder(self._plan, self._data)()

    def report(self, epoch: int, accuracy: float) -> bool:
        """After epoch ``epoch`` (1, 2, ... in order): its validation ``accuracy``,
        stored as the trial's learning curve. Whether early stopping would stop the
        trial here (as Optuna's ``should_prune``): tell it then with its figures so far.

        Raises:
            ConfigError: an epoch out of order, an accuracy not in [0, 1], or a trial
                already told.
        """
        self._asker.check_open(self)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
            raise ConfigError(f"report(epoch={epoch!r}): epochs are numbered 1, 2, ...")
        if self._epochs and epoch <= self._epochs[-1]:
            raise ConfigError(f"report(epoch={epoch}) after epoch {self._epochs[-1]}: in order")
        value = float(accuracy)
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ConfigError(f"report(accuracy={accuracy!r}): a validation accuracy in [0, 1]")
        self._epochs.append(epoch)
        return self._asker.record_epoch(self, epoch, value)


class Asker:
    """The ask-and-tell side of one study: its search loop's claims and ends, for trials
    the user's loop runs."""

    def __init__(self, loop: SearchLoop, data: Dataset | None, heartbeat_interval: float):
        self.loop, self.data, self.heartbeat_interval = loop, data, heartbeat_interval

    def ask(self) -> AskedTrial:
        """Claim the next trial and hold it (its heartbeat) until it is told."""
        parts = self.loop.parts
        claim = self.loop.claim()
        held = contextlib.ExitStack()
        held.enter_context(parts.claims.beating(claim.trial_id, self.heartbeat_interval))
        plan = parts.planner.plan(claim.arch, number=claim.number)
        if plan.work is not None:
            parts.artifacts.start_attempt(claim.arch, claim.number)
        return AskedTrial(
            number=claim.number,
            arch=claim.arch,
            description=plan.space.describe(claim.arch),
            hyperparameters=dict(plan.space.train_overrides(claim.arch)),
            config=plan.config,
            seed=plan.seed,
            _claim=claim,
            _plan=plan,
            _data=self.data,
            _held=held,
            _asker=self,
        )

    def check_open(self, trial: AskedTrial) -> None:
        if not isinstance(trial, AskedTrial) or trial._asker is not self:
            raise ConfigError(
                f"tell() takes a trial this study's ask() returned, got {type(trial).__name__}"
            )
        if trial.told:
            raise ConfigError(f"trial {trial.number} was told already")

    def record_epoch(self, trial: AskedTrial, epoch: int, value: float) -> bool:
        parts = self.loop.parts
        parts.claims.report(trial._claim.trial_id, epoch, value)
        rule = trial._plan.early_stopping
        if rule is None:
            return False
        peers = {n: curve for n, curve in parts.trials.curves().items() if n != trial.number}
        return rule.should_stop(
            trial=trial.number,
            epoch=epoch,
            epochs=trial.config.epochs,
            value=value,
            others=peers,
        )

    def tell(
        self,
        trial: AskedTrial,
        figures: Mapping[str, float] | None = None,
        *,
        model: nn.Module | None = None,
        failed: str | None = None,
        stopped: bool = False,
    ) -> Record | None:
        """Store ``trial``'s ``figures`` (at least ``"accuracy"``) and tell the
        controller; or its failure (``failed``: the reason). ``model``: the trained
        network, stored as the trial's weights (export and rerun use them) and measured
        (FLOPs, parameters, bytes, latency); without it the costs are counted from the
        architecture. ``stopped``: the loop stopped it early (its figures so far), as
        early stopping does. Its record; None where another worker took the trial over."""
        self.check_open(trial)
        if (figures is None) == (failed is None):
            raise ConfigError("tell() takes the trial's figures, or failed='the reason'")
        try:
            if failed is not None:
                return self.loop.end(trial._claim, None, reason=f"told failed: {failed}"[:2000])
            try:
                result = self._result(trial, figures, model, stopped=stopped)
            except TrialFailed as exc:  # what was told cannot be stored: the trial fails
                return self.loop.end(trial._claim, None, reason=str(exc))
            return self.loop.end(trial._claim, result)
        finally:
            trial.told = True
            trial._held.close()

    def _result(
        self,
        trial: AskedTrial,
        figures: Mapping[str, float] | None,
        model: nn.Module | None,
        *,
        stopped: bool,
    ) -> TrialResult:
        plan, data = trial._plan, self.data
        told = checked_figures(figures, name="tell()", needed=("accuracy",))
        if model is not None and data is not None:
            derived = Derived(model=model, float_model=model)
            costs = profile(derived, data, latency=plan.compression.latency)
        else:
            shape = data.input_shape if data is not None else plan.space.budget_input
            classes = data.num_classes if data is not None else plan.space.budget_classes
            cost = plan.space.cost(plan.arch, input_shape=shape, num_classes=classes)
            costs = {
                "flops": float(cost.flops),
                "macs": float(cost.macs),
                "params": float(cost.params),
            }
        metrics = {**costs, **told}
        if stopped and trial._epochs:
            metrics["stopped_at_epoch"] = float(trial._epochs[-1])
        metrics["reward"] = plan.reward(metrics)
        return TrialResult(
            status="stopped" if stopped else "complete",
            points=(VariantResult(name="base", metrics=metrics),),
            model=None if stopped else model,
            evaluated_by="evaluator",
        )
