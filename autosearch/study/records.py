"""How a trial is written to an Optuna storage and read back: the one codec.

A trial is created with its architecture (the genes as Optuna params; the JSON, id,
description, seed and provenance as user attributes). When it ends, its whole result
is written as one user attribute, ``result``: every measured point (the base network,
then each variant, with its metrics and reward, or the reason it failed), which point
is best, and the facts of the run. Reading turns a trial into :class:`Record`\\ s, one
per point, all with the same keys whether base or variant.

Studies stored before this layout (metrics as separate attributes) are read too.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from optuna.trial import FrozenTrial, TrialState, create_trial

from autosearch._version import __version__
from autosearch.architecture import Architecture
from autosearch.controller import Outcome
from autosearch.distributions import distributions
from autosearch.errors import InvalidArchitectureError
from autosearch.evaluation.trial import TrialResult
from autosearch.scoring.metrics import METRICS
from autosearch.space import SearchSpace

__all__ = [
    "ARCH_ID",
    "CONFIRMS",
    "FAIL_REASON",
    "POPULATION",
    "POPULATION_KEY",
    "RESULT",
    "RESUME",
    "RESUMES",
    "SUPERSEDED",
    "VALUES_FROM",
    "Record",
    "State",
    "UnreadableTrial",
    "architecture",
    "claim_key",
    "decode",
    "encode",
    "new_trial",
    "objective_values",
    "outcome",
    "provenance",
    "result_facts",
    "superseded",
    "trial_kind",
    "weights_digest",
    "weights_id",
]

ARCH = "arch"
ARCH_ID = "arch_id"
RESULT = "result"
FAIL_REASON = "fail_reason"
# A trial given up for another that replaces it: a duplicate claim, or a run whose worker
# died or was interrupted (resumed from its checkpoint by a new trial). Kept in storage
# for the record, left out of records, counts and the controller's history.
SUPERSEDED = "superseded"
RESUME = "resume"  # on a superseded trial: its architecture still needs training
RESUMES = "resumes"  # on a trial: the number of the superseded trial it continues
VALUES_FROM = "values_from"  # on a complete trial: the variant its objective values are
# On a confirmation trial: the number of the supernet trial whose subnet it trains from
# scratch (autosearch.weight_sharing.confirm). Left out of the controller's history.
CONFIRMS = "confirms"
# On a trial that trains its architecture as a population (autosearch.population.trial):
# the population's key. Left out of the controller's history too.
POPULATION_KEY = "population_key"
POPULATION = "population"  # on a trial trained as a population: the population's definition

State = Literal["complete", "failed", "running", "stopped", "waiting"]
_STATES: dict[TrialState, State] = {
    TrialState.COMPLETE: "complete",
    TrialState.FAIL: "failed",
    TrialState.RUNNING: "running",
    TrialState.PRUNED: "stopped",
    TrialState.WAITING: "waiting",
}
FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)

# The layout before ``result``: metrics were separate user attributes.
_LEGACY_METRICS = (
    "accuracy",
    "test_accuracy",
    "flops",
    "macs",
    "params",
    "train_seconds",
    "reward",
    "world_size",
    "stopped_at_epoch",
    "sparse_macs",
    "bops",
    "bytes",
    "latency",
    "latency_batched",
)


_REPR_METRICS = ("accuracy", "test_accuracy", "flops", "params")
_MEASURED = ("accuracy", "flops")  # what every measured point holds (every layout)


@dataclass(frozen=True, kw_only=True)
class Record:
    """One evaluated (architecture, variant) point of a study.

    A trial gives one record per variant, all with the trial's number: ``variant`` is
    ``"base"`` for the trained network, else the compressed variant's name. ``metrics``
    holds what was measured of that point (names, units and conventions:
    autosearch.scoring.metrics): ``accuracy`` (validation), ``test_accuracy`` (held out),
    ``flops`` (2 × MACs, one image), ``macs``, ``sparse_macs``, ``params``, ``bops``,
    ``bytes``, ``latency``, ``latency_batched`` and ``reward``; training or deriving
    time; and, for variants, ``detail_*`` figures of the compression. ``confirms``: on
    a confirmation trial's records, the supernet trial whose subnet it trained from
    scratch (None elsewhere). ``kind``: None for a search trial's records, else what
    the trial was (:func:`trial_kind`: ``confirm``, ``population:KEY``).
    """

    trial: int
    arch: Architecture
    description: str
    state: State
    variant: str = "base"
    metrics: Mapping[str, float] = field(default_factory=dict)
    reason: str = ""
    confirms: int | None = None
    kind: str | None = None

    def __hash__(self) -> int:
        return hash((self.trial, self.variant))

    def __repr__(self) -> str:
        """The network as its space describes it (only the genes it uses), not every gene."""
        shown = [f"trial={self.trial}", f"variant={self.variant!r}", f"state={self.state!r}"]
        shown.append(f"arch={(self.description or self.arch.arch_id)!r}")
        shown += [f"{k}={self.metrics[k]:.6g}" for k in _REPR_METRICS if k in self.metrics]
        if self.reason:
            shown.append(f"reason={self.reason!r}")
        return f"Record({', '.join(shown)})"

    @property
    def accuracy(self) -> float | None:
        return self.metrics.get("accuracy")

    @property
    def test_accuracy(self) -> float | None:
        return self.metrics.get("test_accuracy")

    @property
    def flops(self) -> float | None:
        return self.metrics.get("flops")

    @property
    def params(self) -> float | None:
        return self.metrics.get("params")

    @property
    def is_base(self) -> bool:
        return self.variant == "base"


def trial_kind(attrs: Mapping[str, Any]) -> str | None:
    """What a trial is besides a search trial (None): ``confirm`` (a subnet confirmed by
    training) or ``population:KEY`` (an architecture trained as population KEY)."""
    if CONFIRMS in attrs:
        return "confirm"
    if POPULATION_KEY in attrs:
        return f"population:{attrs[POPULATION_KEY]}"
    return None


def claim_key(attrs: Mapping[str, Any]) -> str | None:
    """What a trial holds for the claims (autosearch.study.claims): its architecture's
    id, or for a trial of another kind ``KIND:ID`` (a subnet is evaluated on the
    supernet once and confirmed by training once; an architecture is searched once and
    trained as a given population once)."""
    arch_id = attrs.get(ARCH_ID)
    if arch_id is None:
        return None
    kind = trial_kind(attrs)
    return str(arch_id) if kind is None else f"{kind}:{arch_id}"


class UnreadableTrial(Exception):
    """A stored trial whose attributes cannot be decoded (edited or corrupted)."""


def new_trial(
    space: SearchSpace,
    arch: Architecture,
    *,
    system_attrs: dict[str, Any] | None = None,
    **attrs: Any,
) -> FrozenTrial:
    """The template of a new running trial for ``arch``: its genes as Optuna params (so
    Optuna's tools read the study), its JSON, id and description, and ``attrs`` (seed,
    provenance, worker...) as user attributes; ``system_attrs`` (its first heartbeat)
    as system attributes."""
    return create_trial(
        state=TrialState.RUNNING,
        system_attrs=system_attrs,
        params=dict(arch),
        distributions=distributions(space),
        user_attrs={
            ARCH: arch.to_json(),
            ARCH_ID: arch.arch_id,
            "description": space.describe(arch),
            **attrs,
        },
    )


def encode(
    result: TrialResult, *, weights: str | None, weights_digest: str | None = None
) -> dict[str, Any]:
    """A finished trial's whole result as the JSON of its one ``result`` attribute
    (``weights``: the artifact of its trained weights, with their content digest)."""
    return {
        "points": [
            {"variant": p.name, "reason": p.reason}
            if p.failed
            else {"variant": p.name, "metrics": p.metrics}
            for p in result.points
        ],
        "best": result.best.name,
        "precision": result.precision,
        "resumed_from_epoch": result.resumed_from_epoch,
        "note": result.note,
        "weights": weights,
        **({"weights_digest": weights_digest} if weights_digest else {}),
        "evaluated_by": result.evaluated_by,
        **({"supernet": result.supernet} if result.supernet else {}),
        **result.trained_as,
    }


def decode(trial: FrozenTrial, objectives: tuple[str, ...] = ()) -> list[Record]:
    """The trial's base record, then one record per variant; [] for a superseded trial
    or one some other tool added to the Optuna study.

    Raises:
        UnreadableTrial: the stored architecture or result cannot be parsed, or a
            measured point lacks a metric every trial measures (or one of
            ``objectives``).
    """
    attrs = trial.user_attrs
    if ARCH not in attrs or SUPERSEDED in attrs:
        return []
    try:
        base = Record(
            trial=trial.number,
            arch=Architecture.from_json(attrs[ARCH]),
            description=str(attrs.get("description", "")),
            state=_STATES[trial.state],
            reason=str(attrs.get(FAIL_REASON, "")),
            confirms=int(attrs[CONFIRMS]) if CONFIRMS in attrs else None,
            kind=trial_kind(attrs),
        )
        found = [_point(base, p) for p in _points(attrs)] or [base]
    except (InvalidArchitectureError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UnreadableTrial(f"trial {trial.number}: {type(exc).__name__}: {exc}") from None
    needed = {*_MEASURED, *objectives}
    for record in found:
        missing = sorted(needed - set(record.metrics))
        if record.state in ("complete", "stopped") and missing:
            raise UnreadableTrial(
                f"trial {trial.number}: its stored {record.variant} point has no "
                f"{', '.join(missing)}; its result was edited or damaged"
            )
    return found


def outcome(trial: FrozenTrial, objectives: tuple[str, ...]) -> Outcome:
    """What the controller is told of a finished trial: its best point's reward and
    objective values (a failure when it has none)."""
    best = _best_metrics(trial.user_attrs)
    if trial.state == TrialState.FAIL or best is None or "reward" not in best:
        return Outcome.failed(str(trial.user_attrs.get(FAIL_REASON, "failed")))
    return Outcome(
        reward=float(best["reward"]),
        status="stopped" if trial.state == TrialState.PRUNED else "complete",
        objectives={o: float(best[o]) for o in objectives if o in best},
    )


def objective_values(result: TrialResult, objectives: tuple[str, ...]) -> list[float]:
    best = result.best.metrics
    return [float(best[o]) for o in objectives]


def architecture(trial: FrozenTrial) -> Architecture:
    return Architecture.from_json(trial.user_attrs[ARCH])


def superseded(trial: FrozenTrial) -> bool:
    return SUPERSEDED in trial.user_attrs


def weights_id(trial: FrozenTrial) -> str | None:
    """The artifact id of the trial's trained weights (None: not trained, or a table)."""
    attrs = trial.user_attrs
    stored = attrs.get(RESULT, attrs).get("weights")
    return str(stored) if stored else None


def weights_digest(trial: FrozenTrial) -> str | None:
    """The content digest of the trial's trained weights as they were stored (None for
    a trial stored before digests were)."""
    attrs = trial.user_attrs
    stored = attrs.get(RESULT, attrs).get("weights_digest")
    return str(stored) if stored else None


def result_facts(trial: FrozenTrial) -> Mapping[str, Any]:
    """The run's facts besides metrics: precision, resumed_from_epoch, note, weights."""
    stored = trial.user_attrs.get(RESULT)
    return {k: v for k, v in stored.items() if k not in ("points", "best")} if stored else {}


# Reading both layouts ------------------------------------------------------------------
def _points(attrs: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The stored points, base first, in the ``result`` layout."""
    if RESULT in attrs:
        return list(attrs[RESULT]["points"])
    legacy = {k: attrs[k] for k in _LEGACY_METRICS if k in attrs}
    if not legacy:
        return []
    points: list[Mapping[str, Any]] = [{"variant": "base", "metrics": legacy}]
    for name, stored in attrs.get("variants", {}).items():
        reason = stored.get(FAIL_REASON, "")
        points.append(
            {"variant": name, "reason": reason} if reason else {"variant": name, "metrics": stored}
        )
    return points


def _point(base: Record, point: Mapping[str, Any]) -> Record:
    reason = str(point.get("reason", ""))
    name = str(point["variant"])
    if name == "base":
        return dataclasses.replace(base, metrics=_floats(point.get("metrics", {})))
    return dataclasses.replace(
        base,
        variant=name,
        state="failed" if reason else base.state,
        metrics=_floats(point.get("metrics", {})),
        reason=reason,
    )


def _best_metrics(attrs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    points = {str(p["variant"]): p for p in _points(attrs)}
    if not points:
        return None
    best = (
        attrs[RESULT].get("best", "base") if RESULT in attrs else attrs.get("best_variant", "base")
    )
    return points.get(best, points["base"]).get("metrics")


def _floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    """A point's stored figures as numbers; a figure of the metric vocabulary within its
    bounds (autosearch.scoring.metrics: accuracy in [0, 1], costs finite and >= 0), else the
    ValueError that makes the trial unreadable."""
    return {str(k): METRICS[k].parse(v) if k in METRICS else float(v) for k, v in metrics.items()}


# What a trial's result depends on besides its architecture and seed: package versions
# and the code version, stored with the trial (compared by ``autosearch rerun``).
_PACKAGES = ("torch", "numpy", "optuna", "torchao", "torch-pruning", "scikit-learn")


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _code_version() -> str:
    """The git commit of the source tree autosearch runs from (``+dirty`` when it has
    uncommitted changes), else the package version."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return __version__
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return __version__
    return commit.stdout.strip() + ("+dirty" if dirty else "")


@functools.lru_cache(maxsize=1)
def provenance() -> dict[str, Any]:
    """Versions of Python, autosearch (with its code version) and the packages results
    depend on."""
    return {
        "python": platform.python_version(),
        "autosearch": __version__,
        "code": _code_version(),
        "packages": {name: _installed(name) for name in _PACKAGES},
    }
