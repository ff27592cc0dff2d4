"""One trial, start to end: build → train → variants → cost → score.

The runner knows nothing of storage. The study hands it a :class:`TrialPlan` (what to
evaluate, and how) and a :class:`TrialContext` (what the trial may ask of its study
while it runs: record an epoch, whether to stop, the other trials' learning curves, a
distillation teacher) and gets back one complete :class:`TrialResult`: the base
network's metrics, every variant's, each with its reward, and which point is best.

A candidate's own training settings (the hyperparameters a
``HyperparameterSpace`` searches) are applied once, by :attr:`TrialPlan.config`, and
that config trains the candidate, fine-tunes its variants, and derives them again for
an export or a rerun.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from autosearch.architecture import Architecture
from autosearch.compress import Derived, VariantSpec, derive
from autosearch.data import Dataset
from autosearch.errors import AutosearchError, PlatformError
from autosearch.evaluation.proxies import ProxyConfig, candidate_proxies
from autosearch.evaluation.trial import (
    TRAIN_STATE,
    Interrupted,
    TakenOver,
    Trained,
    TrialContext,
    TrialPlan,
    TrialResult,
    VariantResult,
)
from autosearch.evaluation.user import Candidate, Scorer, checked_figures
from autosearch.scoring.cost import Cost, measure, saved_bytes, sparse_macs
from autosearch.scoring.cost import latency as time_latency
from autosearch.scoring.latency import latency_table
from autosearch.space import SearchSpace
from autosearch.training.runtime import any_rank, broadcast_object, resolve, world
from autosearch.training.train import EpochResult, evaluate, train
from autosearch.weight_sharing.supernet import no_autotuning

__all__ = [
    "TRAIN_STATE",
    "Interrupted",
    "TakenOver",
    "Trained",
    "TrialContext",
    "TrialPlan",
    "TrialResult",
    "VariantResult",
    "derive_variant",
    "evaluate_on_supernet",
    "initial_proxies",
    "profile",
    "run_trial",
    "train_candidate",
    "user_candidate",
]

logger = logging.getLogger(__name__)

LATENCY_BATCH = 32


class _Stopped(Exception):
    def __init__(self, epoch: int, value: float) -> None:
        super().__init__(f"stopped after epoch {epoch} at validation accuracy {value:.4f}")
        self.epoch, self.value = epoch, value


def run_trial(
    plan: TrialPlan, data: Dataset | None, context: TrialContext | None = None
) -> TrialResult:
    """Evaluate ``plan``'s candidate: train it (or look it up in the plan's table),
    derive and measure its variants, and score every point.

    Raises:
        Interrupted: the context reported a user interrupt after an epoch.
        Exception: whatever makes the candidate fail (TrialFailed, BudgetError, ...).
    """
    context = context or TrialContext()
    if plan.table is not None:
        metrics = plan.table.evaluate(plan.space, plan.arch)
        base = _scored(plan, "base", metrics)
        return TrialResult(status="complete", points=(base,), evaluated_by="table")
    assert data is not None, "a trained trial needs its data"
    if plan.supernet is not None:
        with no_autotuning():  # a subnet's passes (costs, variants) meet their shapes once
            model, metrics = evaluate_on_supernet(plan, data)
            base = _scored(plan, "base", {**metrics, **_proxies(plan, data)})
            variants, note = _variants(plan, model, data, base.metrics, context)
        return TrialResult(
            status="complete",
            points=(base, *variants),
            note=note,
            evaluated_by="supernet",
            supernet=plan.supernet.digest,
        )
    if plan.evaluator is not None:
        return _by_evaluator(plan, data, context)
    reported: list[EpochResult] = []
    proxies = _proxies(plan, data)
    try:
        trained = train_candidate(plan, data, on_epoch=_EpochHook(plan, context, reported))
    except _Stopped as stop:
        logger.info("trial %d stopped early after epoch %d", plan.number, stop.epoch)
        return _stopped(plan, data, stop, proxies)
    if world()[0] != 0:  # under torchrun, rank 0 alone measures, scores and records
        unscored = VariantResult(name="base", metrics=trained.metrics)
        return TrialResult(status="complete", points=(unscored,), model=trained.model)
    resumed = len(trained.history) - len(reported)  # epochs restored from a checkpoint
    base = _scored(plan, "base", {**trained.metrics, **proxies})
    variants, note = _variants(plan, trained.model, data, base.metrics, context)
    return TrialResult(
        status="complete",
        points=(base, *variants),
        model=trained.model,
        history=trained.history,
        precision=trained.precision,
        resumed_from_epoch=resumed,
        note=note,
        trained_as=trained.trained_as,
    )


def _by_evaluator(plan: TrialPlan, data: Dataset, context: TrialContext) -> TrialResult:
    """The candidate trained and scored by the user's evaluator; its costs counted here
    where the evaluator does not give them; its variants scored by the evaluator where it
    can score a given network, else skipped (the result's note says which)."""
    assert plan.evaluator is not None
    plan.space.check_budget(plan.arch)
    reported: list[EpochResult] = []
    proxies = _proxies(plan, data)
    candidate = user_candidate(plan, data, on_epoch=_EpochHook(plan, context, reported))
    try:
        with torch.random.fork_rng(devices=[]):
            figures = plan.evaluator(candidate)
    except _Stopped as stop:
        logger.info("trial %d stopped early after epoch %d", plan.number, stop.epoch)
        return _stopped(plan, data, stop, proxies)
    figures = checked_figures(figures, name=plan.evaluator_name, needed=plan.needs)
    model = candidate.model
    measured = profile(
        Derived(model=model, float_model=model), data, latency=plan.compression.latency
    )
    base = _scored(plan, "base", {**measured, **figures, **proxies})
    variants: list[VariantResult] = []
    note = ""
    wanted = [v for v in plan.variants if v.kind != "base"]
    if wanted and isinstance(plan.evaluator, Scorer):
        variants, note = _variants(plan, model, data, base.metrics, context, candidate=candidate)
    elif wanted:
        note = (
            f"variants {', '.join(v.name for v in wanted)} skipped: evaluator "
            f"{plan.evaluator_name} scores no given network (give it a score(model, "
            "candidate) method)"
        )
    return TrialResult(
        status="complete",
        points=(base, *variants),
        model=model,
        history=tuple(reported),
        note=note,
        evaluated_by="evaluator",
    )


def user_candidate(
    plan: TrialPlan, data: Dataset, *, on_epoch: Callable[[EpochResult], None] | None = None
) -> Candidate:
    """The :class:`Candidate` a user's evaluator receives for ``plan``: its network built
    and initialised with the trial's seed (the caller's random state left as it was)."""
    with torch.random.fork_rng(devices=[]):
        model = candidate_builder(plan, data)()
    config = plan.config
    return Candidate(
        model=model,
        arch=plan.arch,
        description=plan.space.describe(plan.arch),
        config=config,
        hyperparameters=dict(plan.space.train_overrides(plan.arch)),
        seed=plan.seed,
        trial=plan.number,
        device=resolve(device=config.device, precision=config.precision).device,
        data=data,
        work=plan.work,
        _on_epoch=on_epoch or (lambda _: None),
    )


def candidate_builder(plan: TrialPlan, data: Dataset) -> Callable[[], nn.Module]:
    """What builds the candidate for ``data``: the same initialization (its seed) at
    every call, as every member of a population starts."""

    def build() -> nn.Module:
        torch.manual_seed(plan.seed)
        return plan.space.build(
            plan.arch, input_shape=data.input_shape, num_classes=data.num_classes
        )

    return build


def train_candidate(
    plan: TrialPlan, data: Dataset, *, on_epoch: Callable[[EpochResult], None] | None = None
) -> Trained:
    """Check the candidate's budget, build it, train it with :attr:`TrialPlan.config`
    and measure it (validation and test accuracy, costs). Deterministic for a seed on
    CPU.

    The global torch RNG (weight initialisation) is seeded inside a fork, so a trial
    neither depends on nor disturbs the caller's random state.
    """
    plan.space.check_budget(plan.arch)  # before any training: over budget ends it here
    build = candidate_builder(plan, data)
    extra: dict[str, float] = {}
    recorded: dict[str, Any] = {}
    with torch.random.fork_rng(devices=[]):
        if plan.trainer is not None:
            if plan.work is None:
                raise AutosearchError("a candidate trained another way needs its attempt folder")
            model, result, recorded = plan.trainer(build, data, plan.config, plan.seed, plan.work)
            extra = _population_metrics(recorded)
        else:
            model = build()
            checkpoint = plan.work / TRAIN_STATE if plan.work else None
            result = train(
                model, data, plan.config, seed=plan.seed, on_epoch=on_epoch, checkpoint=checkpoint
            )
    test_accuracy, _ = evaluate(model, data.test, data)
    # Under torchrun only rank 0's result is kept: the other ranks skip the measurement,
    # which would also compete with rank 0's latency timing for the same cores.
    measured = (
        profile(Derived(model=model, float_model=model), data, latency=plan.compression.latency)
        if world()[0] == 0
        else {}
    )
    metrics = {
        "accuracy": result.val_accuracy,
        "test_accuracy": test_accuracy,
        **measured,
        "train_seconds": result.seconds,
        "world_size": float(result.world_size),
        **extra,
    }
    return Trained(
        model=model,
        metrics=metrics,
        history=result.history,
        precision=result.precision,
        trained_as=recorded,
    )


def _population_metrics(recorded: Mapping[str, Any]) -> dict[str, float]:
    """A population's size and winner as metrics of the trial it trained."""
    population = recorded.get("population") or {}
    if not population:
        return {}
    return {
        "population_size": float(population["size"]),
        "population_winner": float(population["winner"]),
    }


def evaluate_on_supernet(plan: TrialPlan, data: Dataset) -> tuple[nn.Module, dict[str, float]]:
    """Check the candidate's budget, then score it on the plan's trained supernet: its
    inherited, recalibrated subnet and that subnet's metrics (accuracy on the evaluator's
    images, costs, latency where the supernet config asks for it)."""
    assert plan.supernet is not None
    plan.space.check_budget(plan.arch)
    start = time.perf_counter()
    model, metrics = plan.supernet.evaluate(plan.arch)
    # The space counts a dense subnet analytically (equal to the FLOP counter, without
    # its forward pass, which would cost more than the evaluation itself).
    counted = plan.space.cost(plan.arch, input_shape=data.input_shape, num_classes=data.num_classes)
    measured = profile(
        Derived(model=model, float_model=model),
        data,
        latency=plan.compression.latency if plan.supernet.config.latency else None,
        counted=counted,
    )
    metrics = {**metrics, **measured, "eval_seconds": time.perf_counter() - start}
    return model, metrics


def evaluation_splits(plan: TrialPlan, data: Dataset) -> tuple[Any, Any]:
    """The validation and test images a plan's points are scored on: a supernet's
    subnet and its variants on the evaluator's (the same images, already on its device),
    a trained candidate on the whole splits."""
    if plan.supernet is not None:
        return plan.supernet.val, plan.supernet.test
    return data.val, data.test


def derive_variant(
    plan: TrialPlan,
    spec: VariantSpec | str,
    parent: nn.Module,
    data: Dataset,
    *,
    teacher: nn.Module | None = None,
    estimate: bool = False,
) -> Derived:
    """Derive variant ``spec`` of the trained ``parent`` as the trial does: with the
    candidate's own training config and the trial's seed (an export derives it again
    the same way). ``estimate``: a simulation where the variant has one (see derive)."""
    return derive(
        spec,
        parent,
        data,
        plan.config,
        compression=plan.compression,
        seed=plan.seed,
        teacher=teacher,
        estimate=estimate,
    )


def profile(
    derived: Derived,
    data: Dataset,
    *,
    latency: str | None = "measured",
    counted: Cost | None = None,
) -> dict[str, float]:
    """Measure a model: FLOPs, MACs, sparse MACs and params counted on the float network
    with the variant's structure, BOPs at the variant's bit widths, saved bytes, and
    latency of the model that really runs (conventions: autosearch.scoring.cost): ``latency``
    ``"measured"`` times it, ``"predicted"`` predicts it from this machine's lookup
    table (``latency_predicted`` = 1), a path from the table of that file's device
    (``latency_from_device_table`` = 1), None skips it;
    an estimated variant (``estimated`` = 1) has no latency until it is measured.
    ``counted``: the dense network's cost, counted already (no zeros to discount)."""
    shape = data.input_shape
    cost = counted or measure(derived.float_model, shape)
    sparse = cost.macs if counted or derived.estimated else sparse_macs(derived.float_model, shape)
    measured = {
        "flops": float(cost.flops),
        "macs": float(cost.macs),
        "sparse_macs": float(sparse),
        "params": float(cost.params),
        "bops": float(cost.macs * derived.weight_bits * derived.activation_bits),
        "bytes": float(derived.saved_bytes or saved_bytes(derived.float_model)),
    }
    if derived.estimated:
        return {**measured, "estimated": 1.0}
    if latency is None:
        return measured
    runs = derived.model
    if latency == "measured":
        if next(runs.parameters(), torch.empty(0)).device.type != "cpu":
            runs = copy.deepcopy(runs).cpu()  # latency is timed on one CPU thread
        return {
            **measured,
            "latency": time_latency(runs, shape, batch=1),
            "latency_batched": time_latency(runs, shape, batch=LATENCY_BATCH),
        }
    host = latency == "predicted"
    table = latency_table(None if host else latency)
    return {
        **measured,
        "latency": table.predict(runs, shape, batch=1),
        "latency_batched": table.predict(runs, shape, batch=LATENCY_BATCH),
        # This machine's prediction is measured on the front; another device's is final.
        ("latency_predicted" if host else "latency_from_device_table"): 1.0,
    }


# The steps of a trial ---------------------------------------------------------------
class _EpochHook:
    """After each epoch: rank 0 records it and decides whether to go on (user interrupt,
    early stopping); under torchrun every rank follows rank 0's decision, so all stop at
    the same epoch, and a signal to any rank (torchrun's agent and Slurm signal every
    one) is a stop for all."""

    def __init__(self, plan: TrialPlan, context: TrialContext, reported: list[EpochResult]):
        self.plan, self.context, self.reported = plan, context, reported

    def __call__(self, epoch: EpochResult) -> None:
        rank_0 = world()[0] == 0
        lost = self._record(epoch) if rank_0 else None
        asked = any_rank(self.context.interrupted())  # also a signal during the recording
        decision = self._decide(epoch, lost, asked) if rank_0 else None
        decision = broadcast_object(decision)
        if decision == "interrupt":
            raise Interrupted(f"after epoch {epoch.epoch}")
        if decision == "stop":
            raise _Stopped(epoch.epoch, epoch.val_accuracy)
        if decision is not None:
            raise TakenOver(decision)

    def _record(self, epoch: EpochResult) -> str | None:
        """Why the trial is no longer this worker's; else the epoch recorded (None)."""
        lost = self.context.taken_over()  # before writing anything more for this trial
        if lost is None:
            self.reported.append(epoch)
            self.context.epoch_done(epoch)
        return lost

    def _decide(self, epoch: EpochResult, lost: str | None, asked: bool) -> str | None:
        if lost is not None:
            return lost
        if asked:  # the epoch's checkpoint is written: stop here
            return "interrupt"
        rule = self.plan.early_stopping
        if rule is not None and rule.should_stop(
            trial=self.plan.number,
            epoch=epoch.epoch,
            epochs=self.plan.config.epochs,
            value=epoch.val_accuracy,
            others=self.context.peers(),
        ):
            return "stop"
        return None


def _scored(plan: TrialPlan, name: str, metrics: Mapping[str, float]) -> VariantResult:
    return VariantResult(name=name, metrics={**metrics, "reward": plan.reward(metrics)})


def _proxies(plan: TrialPlan, data: Dataset) -> dict[str, float]:
    """The candidate's zero-cost proxies, where the plan asks for them: of the network
    at the initialization it trains from (its seed), before it trains (rank 0 alone)."""
    if plan.proxies is None or world()[0] != 0:
        return {}
    return initial_proxies(plan.proxies, plan.space, plan.arch, plan.seed, data)


def initial_proxies(
    config: ProxyConfig, space: SearchSpace, arch: Architecture, seed: int, data: Dataset
) -> dict[str, float]:
    """The zero-cost proxies of ``arch`` at the initialization a trial of seed ``seed``
    trains it from, on the study's batch: what the trial stores (a zero-cost warm-up
    scores its pool with it, untrained)."""
    space.check_budget(arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = space.build(arch, input_shape=data.input_shape, num_classes=data.num_classes)
    return candidate_proxies(config, model, data)


def _stopped(
    plan: TrialPlan, data: Dataset, stop: _Stopped, proxies: Mapping[str, float]
) -> TrialResult:
    """A trial stopped early: its accuracy so far and its cost (not trained further)."""
    cost = plan.space.cost(plan.arch, input_shape=data.input_shape, num_classes=data.num_classes)
    metrics = {
        "accuracy": stop.value,
        "flops": float(cost.flops),
        "macs": float(cost.macs),
        "params": float(cost.params),
        "stopped_at_epoch": float(stop.epoch),
        **proxies,
    }
    return TrialResult(status="stopped", points=(_scored(plan, "base", metrics),))


def _variants(
    plan: TrialPlan,
    model: nn.Module,
    data: Dataset,
    base: Mapping[str, float],
    context: TrialContext,
    *,
    candidate: Candidate | None = None,
) -> tuple[list[VariantResult], str]:
    """Derive, evaluate (validation and test), measure and score each variant. A variant
    that cannot be derived is returned failed with its reason; the others go on. With
    ``candidate``, the user's evaluator scores each variant (its ``score`` method)."""
    wanted = [v for v in plan.variants if v.kind != "base"]
    if not wanted:
        return [], ""
    if plan.compression.only_front and not context.on_front(base):
        return [], "not on the accuracy-FLOPs front (only_front)"
    teacher = context.teacher(base) if any(v.kind == "distill" for v in wanted) else None
    # A variant of the same structure (int8) is counted as the base was.
    same = Cost(flops=int(base["flops"]), macs=int(base["macs"]), params=int(base["params"]))
    results = []
    for spec in wanted:
        counted = same if spec.kind in ("int8", "qat-int8") else None
        results.append(_variant(plan, spec, model, data, teacher, counted, candidate))
        context.work_saved()  # its result is in the attempt's folder
    return results, ""


def _variant(
    plan: TrialPlan,
    spec: VariantSpec,
    model: nn.Module,
    data: Dataset,
    teacher: nn.Module | None,
    counted: Cost | None,
    candidate: Candidate | None = None,
) -> VariantResult:
    saved = plan.work / "variants" / f"{spec.name}.json" if plan.work else None
    if saved is not None and saved.is_file():  # derived by an attempt this one resumes
        earlier = _read_variant(saved, spec.name)
        if earlier is not None:
            return earlier
    start = time.perf_counter()
    try:
        derived = derive_variant(
            plan, spec, model, data, teacher=teacher, estimate=plan.compression.estimate
        )
        seconds = time.perf_counter() - start
        metrics = {
            **_variant_figures(plan, derived.model, data, candidate),
            **profile(derived, data, latency=_variant_latency(plan), counted=counted),
            "finetune_seconds": seconds,
            **{f"detail_{k}": float(v) for k, v in derived.details.items()},
        }
        result = _scored(plan, spec.name, metrics)
    except Exception as exc:  # one variant failing must not lose the others
        log = logger.info if isinstance(exc, AutosearchError) else logger.warning
        log("variant %s failed: %s", spec.name, exc, exc_info=True)
        reason = f"{type(exc).__name__}: {exc}"[:2000]
        result = VariantResult(name=spec.name, metrics={}, reason=reason)
    if saved is not None:
        _save_json(saved, dataclasses.asdict(result))
    return result


def _variant_figures(
    plan: TrialPlan, model: nn.Module, data: Dataset, candidate: Candidate | None
) -> dict[str, float]:
    """A variant's accuracy: on the study's validation and test images, or as the user's
    evaluator scores it (``candidate``: the evaluator scores the trial's variants)."""
    if candidate is not None and isinstance(plan.evaluator, Scorer):
        figures = plan.evaluator.score(model, candidate)
        return checked_figures(figures, name=f"{plan.evaluator_name}.score", needed=plan.needs)
    val, test = evaluation_splits(plan, data)
    return {
        "accuracy": evaluate(model, val, data)[0],
        "test_accuracy": evaluate(model, test, data)[0],
    }


def _variant_latency(plan: TrialPlan) -> str | None:
    """A derived variant's latency is timed where it runs (its derivation costs far more
    than timing it); a study for another device has none (its table holds float parts)."""
    return None if plan.compression.latency_table else "measured"


def _read_variant(path: Path, name: str) -> VariantResult | None:
    """A variant's result saved by an earlier attempt; None (logged) where it cannot be
    read as one: it is then derived again."""
    try:
        stored = json.loads(path.read_text())
        result = VariantResult(
            name=str(stored["name"]),
            metrics={str(k): float(v) for k, v in stored["metrics"].items()},
            reason=str(stored.get("reason", "")),
        )
        if result.name == name:
            return result
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        logger.warning("%s cannot be read (%s); deriving variant %s again", path, exc, name)
        return None
    logger.warning("%s holds variant %s, not %s; deriving it again", path, result.name, name)
    return None


def _save_json(path: Path, value: object) -> None:
    """Write a file whole or not at all (temporary name, then renamed)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(value))
        tmp.replace(path)
    except OSError as exc:
        raise PlatformError(f"cannot write {path}: {exc.strerror or exc}") from None
