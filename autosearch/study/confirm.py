"""Confirming a supernet's choice by training it: the ``k`` most accurate subnets of a
supernet study's front, each trained from scratch with the study's training config, as
trials of the study.

A confirmation trial is an ordinary trial (claimed, checkpointed every epoch, resumed
after a kill or Ctrl-C, its variants measured, its weights stored) with one more user
attribute, ``confirms``: the number of the supernet trial whose subnet it trains. Its
claim holds ``confirm:ID`` (records.claim_key), so a subnet is scored on the supernet
once and trained once, however many workers confirm at the same time; the controller
never hears of it (its accuracy is a training's, not the supernet's).

A worker confirms the subnets no trial holds yet; then it waits for those other workers
hold, and takes up any whose worker dies (its silent heartbeat gives it away), so that
``confirm(k)`` returns when all ``k`` are trained.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from autosearch.architecture import Architecture
from autosearch.controller import Outcome
from autosearch.errors import ConfigError, StudyError
from autosearch.evaluation.trial import TrialPlan
from autosearch.study import records, results
from autosearch.study.claims import Claim
from autosearch.study.loop import AllClaimed, RecordCallback, SearchLoop, SearchParts
from autosearch.study.records import CONFIRMS, Record

__all__ = ["Confirmation", "Confirmer", "candidates", "confirmations"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Confirmation:
    """A subnet's accuracy inherited from the supernet against its accuracy trained
    from scratch (validation; None while its training is not complete)."""

    trial: int  # the supernet trial
    confirmed_by: int | None  # the confirmation trial, once one holds it
    description: str
    flops: float
    inherited: float
    confirmed: float | None
    confirmed_test: float | None
    state: str  # the confirmation's: complete, running, failed, ... or "not started"

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def candidates(points: list[Record], objectives: tuple[str, ...]) -> list[Record]:
    """The supernet's front (complete base records scored on it), most accurate first."""
    scored = [r for r in points if r.is_base and r.confirms is None]
    front = results.front(scored, objectives)
    return sorted(front, key=lambda r: (-r.metrics["accuracy"], r.metrics["flops"], r.trial))


def _confirming(trials: list[FrozenTrial]) -> dict[int, FrozenTrial]:
    """Supernet trial number -> the live confirmation trial that holds it."""
    held: dict[int, FrozenTrial] = {}
    for t in trials:
        if CONFIRMS in t.user_attrs and not records.superseded(t):
            held.setdefault(int(t.user_attrs[CONFIRMS]), t)
    return held


def confirmations(points: list[Record], trials: list[FrozenTrial]) -> list[Confirmation]:
    """Every confirmed (or being confirmed) subnet, in supernet trial order."""
    base = {r.trial: r for r in points if r.is_base}
    rows = []
    for number, trial in sorted(_confirming(trials).items()):
        scored, done = base.get(number), base.get(trial.number)
        if scored is None or "accuracy" not in scored.metrics:
            continue
        complete = done is not None and done.state == "complete"
        rows.append(
            Confirmation(
                trial=number,
                confirmed_by=trial.number,
                description=scored.description,
                flops=scored.metrics["flops"],
                inherited=scored.metrics["accuracy"],
                confirmed=done.metrics.get("accuracy") if complete and done else None,
                confirmed_test=done.metrics.get("test_accuracy") if complete and done else None,
                state=done.state if done is not None else "running",
            )
        )
    return rows


class _ConfirmLoop(SearchLoop):
    """A search loop whose architectures are the subnets to confirm, in order."""

    def __init__(self, parts: SearchParts, targets: list[Record], **options: Any) -> None:
        super().__init__(parts, **options)
        self.targets = {r.arch.arch_id: r for r in targets}
        # Every scored subnet (one trial per architecture): what a resumed confirmation
        # of an earlier call, not among ``targets``, confirms.
        self.scored = {
            r.arch.arch_id: r.trial
            for r in parts.trials.records(variants=False)
            if r.confirms is None
        }

    def _propose(self, trials: list[FrozenTrial]) -> Architecture:
        held = self.parts.claims.index.read(trials)
        for record in self.targets.values():
            if self.parts.claims.key(record.arch) not in held:
                return record.arch
        raise AllClaimed("every subnet to confirm is held by a confirmation trial")

    def _attrs(self, arch: Architecture) -> dict[str, Any]:
        return {**super()._attrs(arch), CONFIRMS: self.scored[arch.arch_id]}

    def _plan(self, claim: Claim) -> TrialPlan:
        return self.parts.planner.plan(claim.arch, number=claim.number, confirm=True)

    def _tell(self, claim: Claim, outcome: Outcome) -> None:
        pass  # a training's accuracy is not the supernet's: the controller never hears it


class Confirmer:
    """Confirms a supernet study's front by training. ``parts``: the study's search
    parts (its claims become claims on confirmation trials)."""

    def __init__(self, parts: SearchParts) -> None:
        self.parts = dataclasses.replace(parts, claims=parts.claims.of_confirmations())
        self.signal: str | None = None  # the signal that cut the last confirm() short

    def targets(self, k: Any) -> list[Record]:
        """The ``k`` most accurate subnets of the supernet's front.

        Raises:
            ConfigError: ``k`` is not an integer from 1 to the front's size.
        """
        front = candidates(self.parts.trials.records(variants=False), self.parts.objectives)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"k must be an integer >= 1 (subnets to confirm), got {k!r}")
        if not front:
            raise StudyError(
                f"study {self.parts.name!r} has no complete supernet trial to confirm; run "
                "trials first (study.optimize(n), or autosearch run FILE --n-trials N)"
            )
        if k > len(front):
            raise ConfigError(
                f"k={k} but the supernet's front of study {self.parts.name!r} has "
                f"{len(front)} subnet(s); confirm at most {len(front)}"
            )
        return front[:k]

    def confirm(self, k: Any, *, callbacks: Sequence[RecordCallback] = ()) -> list[Record]:
        """Train each of the :meth:`targets` once across all workers; return the
        confirmation records, in the targets' order. Interrupted (Ctrl-C, SIGTERM): the
        running training resumes at the next call, :attr:`signal` says which."""
        targets = self.targets(k)
        loop = _ConfirmLoop(
            self.parts,
            targets,
            callbacks=list(callbacks),
            epoch_callbacks=[],
            max_failures_in_a_row=len(targets) + 1,
        )
        wanted, said = {r.trial for r in targets}, None
        with loop.graceful_interrupts():
            while True:
                loop.run(len(targets))  # what no trial holds, and what a dead worker held
                if loop.signal is not None:
                    break
                held = _confirming(self.parts.trials.all())
                waiting = sorted(
                    held[n].number
                    for n in wanted
                    if n in held and held[n].state in (TrialState.RUNNING, TrialState.WAITING)
                )
                if not waiting:
                    break
                if waiting != said:
                    logger.info(
                        "confirmation trial(s) %s run in other workers; waiting for them",
                        ", ".join(map(str, waiting)),
                    )
                    said = waiting
                time.sleep(self.parts.heartbeat_interval)
        self.signal = loop.signal
        held = _confirming(self.parts.trials.all())
        return [
            self.parts.trials.record(held[r.trial].number)
            for r in targets
            if r.trial in held and held[r.trial].state.is_finished()
        ]
