"""Bring your own training: a user's evaluator trains or scores each candidate.

A study normally trains every candidate with autosearch's own trainer. With
``create_study(..., evaluator=fn)`` it hands each candidate to ``fn`` instead: ``fn``
receives a :class:`Candidate` (the network the space built, initialised with the trial's
seed; its architecture, training settings and searched hyperparameters, seed, device and
the study's data; a folder of its own) and returns the figures it measured, a mapping of
names to numbers that holds at least ``"accuracy"`` (validation accuracy in [0, 1], what
every controller and reward reads) and whatever else it measures (``"test_accuracy"``,
``"f1"``, ...). The study counts the network's costs (FLOPs, parameters, bytes, latency)
itself where the evaluator does not return them, scores, stores, and tells the
controller, as for its own trainer: every controller, storage and executor, early
stopping, resume after a kill, tracking, the report and the export work the same.

While it trains, the evaluator calls :meth:`Candidate.report` after each epoch (the
study records the curve, early stopping compares it, Ctrl-C and SIGTERM stop there) and
may keep a checkpoint with :meth:`Candidate.save` and :meth:`Candidate.load` (a trial cut
by a kill resumes from it on the next claim). An evaluator that can also score a given
network (a method ``score(model, candidate)`` returning figures) scores the study's
compressed variants too; one that cannot has them skipped, and the trial says so.

The study stores the evaluator's import path (``module:qualname``) with its definition, to
check that every process runs the same one; it never imports a path read from a storage:
each process is given the evaluator (a pool's workers get the object itself; ``autosearch
worker --evaluator module:name`` and a study file name it on the command line).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn as nn

from autosearch.architecture import Architecture
from autosearch.data import Dataset
from autosearch.errors import ConfigError, TrialFailed
from autosearch.training import _checkpoint
from autosearch.training.train import EpochResult, TrainConfig

__all__ = [
    "USER_STATE",
    "Candidate",
    "Evaluator",
    "Scorer",
    "check_evaluator",
    "checked_figures",
    "evaluator_name",
    "next_epoch",
]

USER_STATE = "evaluator.pt"  # a user evaluator's checkpoint, in the attempt's folder


@runtime_checkable
class Evaluator(Protocol):
    """Trains (or scores) one candidate and returns its figures: at least
    ``"accuracy"`` (validation, in [0, 1]); any other name a study may store."""

    def __call__(self, candidate: Candidate) -> Mapping[str, float]: ...


@runtime_checkable
class Scorer(Protocol):
    """An evaluator that also scores a given network (a compressed variant of the
    candidate it trained): the same figures, for ``model``."""

    def __call__(self, candidate: Candidate) -> Mapping[str, float]: ...

    def score(self, model: nn.Module, candidate: Candidate) -> Mapping[str, float]: ...


@dataclass(eq=False)
class Candidate:
    """One candidate, as a user's evaluator receives it.

    Attributes:
        model: The network the space built for the study's data, initialised with the
            trial's seed; the evaluator trains it in place (the study measures, stores
            and exports this object after the evaluator returns).
        arch: Its architecture; ``description`` says it in a line.
        config: The study's training settings with the candidate's searched
            hyperparameters applied (``hyperparameters`` holds those alone).
        seed: The trial's seed (the same whenever this architecture is trained again).
        trial: The trial's number.
        device: Where the study's trainer would train it (its ``config.device``).
        data: The study's data: train, validation and test splits (an evaluator with
            data of its own may ignore them; the network is built for their shape).
        work: A folder of this attempt's own (kept until the trial completes, the same
            on a resumed attempt); None where the study keeps no attempt folders.
    """

    model: nn.Module
    arch: Architecture
    description: str
    config: TrainConfig
    hyperparameters: Mapping[str, Any]
    seed: int
    trial: int
    device: torch.device
    data: Dataset | None
    work: Path | None
    _on_epoch: Callable[[EpochResult], None] = field(repr=False, default=lambda _: None)
    _epochs: list[int] = field(default_factory=list, repr=False)

    def report(
        self,
        epoch: int,
        accuracy: float,
        *,
        loss: float = math.nan,
        train_loss: float = math.nan,
        seconds: float = 0.0,
    ) -> None:
        """After epoch ``epoch`` (1, 2, ... in order): its validation ``accuracy``
        (and losses). The study records it; early stopping may end the trial here, and
        Ctrl-C or SIGTERM stop it here: this call then raises, and the evaluator should
        let that exception pass (a checkpoint saved before reporting is resumed from).

        Raises:
            TrialFailed: an epoch out of order, or an accuracy that is not a number in
                [0, 1].
        """
        value = next_epoch(self._epochs, epoch, accuracy, error=TrialFailed)
        self._on_epoch(
            EpochResult(
                epoch=epoch,
                train_loss=float(train_loss),
                val_accuracy=value,
                val_loss=float(loss),
                seconds=float(seconds),
            )
        )

    def save(self, state: Mapping[str, Any]) -> None:
        """Keep ``state`` (tensors and plain values: ``model.state_dict()``, an
        optimizer's, the epoch) as this attempt's checkpoint, written whole."""
        if self.work is None:
            return
        try:
            _checkpoint.write_state(self.work / USER_STATE, dict(state))
        except (TypeError, AttributeError, RuntimeError) as exc:
            raise TrialFailed(
                f"save(): a checkpoint holds tensors and plain values only ({exc})"
            ) from None

    def load(self) -> dict[str, Any] | None:
        """The state the last :meth:`save` of this trial kept (an attempt cut by a kill
        resumes from it), or None: nothing kept, or a checkpoint that does not read whole
        (moved aside, said in one line). Read as data, never as code."""
        if self.work is None:
            return None
        return _checkpoint.read_or_set_aside(self.work / USER_STATE)


def next_epoch(
    epochs: list[int], epoch: object, accuracy: object, *, error: type[Exception]
) -> float:
    """Check a reported epoch (1, 2, ... after ``epochs``, each once) and its validation
    accuracy (a number in [0, 1]); record the epoch; the accuracy as a float.

    Raises:
        error: saying what was reported and what is expected.
    """
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise error(f"report(epoch={epoch!r}): epochs are numbered 1, 2, ...")
    if epochs and epoch <= epochs[-1]:
        raise error(
            f"report(epoch={epoch}) after epoch {epochs[-1]}: report each epoch once, in order"
        )
    try:
        value = _number("accuracy", accuracy)
    except TrialFailed as exc:
        raise error(f"report({exc})") from None
    if not 0.0 <= value <= 1.0:
        raise error(f"report(accuracy={value!r}): a validation accuracy in [0, 1]")
    epochs.append(epoch)
    return value


def evaluator_name(evaluator: object) -> str:
    """``module:qualname`` of an evaluator (a function, a class's instance: its class)."""
    target = evaluator if hasattr(evaluator, "__qualname__") else type(evaluator)
    module = getattr(target, "__module__", None) or "?"
    return f"{module}:{getattr(target, '__qualname__', type(evaluator).__name__)}"


def check_evaluator(evaluator: object) -> str:
    """Refuse what cannot evaluate a candidate; the evaluator's name.

    Raises:
        ConfigError: not callable, saying what was given.
    """
    if not callable(evaluator):
        raise ConfigError(
            f"evaluator must be a function or an object called with a Candidate, got "
            f"{type(evaluator).__name__}"
        )
    return evaluator_name(evaluator)


def checked_figures(figures: object, *, name: str, needed: tuple[str, ...]) -> dict[str, float]:
    """What an evaluator returned, as figures: a mapping of names to finite numbers
    holding every name in ``needed``.

    Raises:
        TrialFailed: saying what was returned and what was expected (the trial fails with
            that reason; the study goes on).
    """
    if not isinstance(figures, Mapping):
        raise TrialFailed(
            f"evaluator {name} returned {type(figures).__name__}; return a dict of figures, "
            'e.g. {"accuracy": 0.91}'
        )
    checked = {}
    for key, value in figures.items():
        if not isinstance(key, str) or not key:
            raise TrialFailed(f"evaluator {name} returned a figure named {key!r}; name it")
        checked[key] = _number(key, value, who=f"evaluator {name}")
    missing = [n for n in needed if n not in checked]
    if missing:
        raise TrialFailed(
            f"evaluator {name} returned no {', '.join(map(repr, missing))} (it returned "
            f"{', '.join(map(repr, checked)) or 'nothing'}); the study needs it"
        )
    accuracy = checked.get("accuracy")
    if accuracy is not None and not 0.0 <= accuracy <= 1.0:
        raise TrialFailed(
            f"evaluator {name} returned accuracy={accuracy!r}: a validation accuracy in [0, 1]"
        )
    return checked


def _number(key: str, value: object, *, who: str = "") -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TrialFailed(
            f"{who + ' returned ' if who else ''}{key}={value!r}: figures are numbers"
        )
    if not math.isfinite(value):
        raise TrialFailed(
            f"{who + ' returned ' if who else ''}{key}={value!r}: figures are finite numbers"
        )
    return float(value)
