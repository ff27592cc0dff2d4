"""How a study evaluates an architecture: the plan (autosearch.evaluation.runner.TrialPlan) of a
new trial, or of a stored one with the seed it ran with, from the study's definition,
its space, where attempts keep their work, and the supernet evaluator, if any."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from optuna.trial import FrozenTrial

from autosearch.architecture import Architecture
from autosearch.compress import Compression
from autosearch.evaluation.trial import TrialPlan
from autosearch.evaluation.user import Evaluator
from autosearch.space import SearchSpace
from autosearch.storage.artifacts import Artifacts
from autosearch.study.definition import StudyDefinition, trial_seed
from autosearch.study.records import trial_kind
from autosearch.weight_sharing.supernet import SubnetEvaluator

__all__ = ["Planner"]


def _compression(d: StudyDefinition) -> Compression:
    """The study's compression settings as trials use them: an int8 program's latency
    is not predicted, so a study that scores latency lowers every int8 candidate; nor
    is a variant's accuracy estimated where a user's evaluator scores it."""
    uses_latency = "latency" in d.objectives or (
        d.reward.kind not in ("accuracy", "accuracy-per-gflop") and d.reward.metric == "latency"
    )
    if (uses_latency or d.evaluator) and d.compression.estimate:
        # A user's evaluator scores real variants: none is left to measure again later.
        return dataclasses.replace(d.compression, estimate=False)
    return d.compression


@dataclass(frozen=True, kw_only=True)
class Planner:
    """Plans of one study's trials. ``evaluator`` gives the trained supernet's
    evaluator (for a supernet study: asked for only when a plan is made);
    ``user_evaluator`` is a user's evaluator that trains each candidate (the study's
    definition names it)."""

    definition: StudyDefinition
    space: SearchSpace
    artifacts: Artifacts
    evaluator: Callable[[], SubnetEvaluator] | None = None
    user_evaluator: Evaluator | None = None

    def plan(
        self,
        arch: Architecture,
        *,
        number: int = 0,
        seed: int | None = None,
        confirm: bool = False,
    ) -> TrialPlan:
        """How ``arch`` is evaluated as trial ``number`` (with its own seed unless
        ``seed`` is given). ``confirm``: trained from scratch with the study's training
        config, as a supernet study confirms a subnet (autosearch.weight_sharing.confirm)."""
        d = self.definition
        trained = confirm or not (d.table or d.supernet)
        return TrialPlan(
            space=self.space,
            arch=arch,
            train=d.train,
            seed=trial_seed(d.seed, arch) if seed is None else seed,
            number=number,
            reward=d.reward,
            variants=d.variants,
            compression=_compression(d),
            early_stopping=d.early_stopping,
            table=d.table,
            supernet=self.evaluator() if self.evaluator is not None and not confirm else None,
            proxies=d.proxies,
            work=self.artifacts.attempt(arch, number) if trained else None,
            evaluator=self.user_evaluator if d.evaluator else None,
            evaluator_name=d.evaluator or "",
            needs=("accuracy", *(o for o in d.objectives if o in d.metrics)),
        )

    def stored(self, trial: FrozenTrial, arch: Architecture) -> TrialPlan:
        """How stored ``trial`` (of ``arch``) was evaluated: with the seed it stored."""
        seed = trial.user_attrs.get("seed")
        return self.plan(
            arch,
            number=trial.number,
            seed=int(seed) if seed is not None else None,
            confirm=trial_kind(trial.user_attrs) is not None,
        )
