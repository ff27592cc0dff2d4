"""One trial, start to end: build → train → measure → evaluate, then its variants."""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from autosearch.architecture import Architecture
from autosearch.compress import Compression, Derived, VariantSpec, derive
from autosearch.cost import latency, measure, saved_bytes, sparse_macs
from autosearch.data import Dataset
from autosearch.errors import AutosearchError
from autosearch.runtime import world
from autosearch.space import SearchSpace
from autosearch.train import EpochResult, TrainConfig, evaluate, train

__all__ = ["TrialResult", "VariantResult", "profile", "run_trial", "run_variants"]

logger = logging.getLogger(__name__)

LATENCY_BATCH = 32


@dataclass(frozen=True, kw_only=True, eq=False)
class TrialResult:
    """A trained candidate and what was measured of it.

    ``metrics`` holds ``accuracy`` (validation, the search signal), ``test_accuracy``
    (held out, for reports only), the costs of :func:`profile`, ``train_seconds`` and
    ``world_size`` (DDP processes that trained it).
    """

    model: nn.Module | None
    metrics: dict[str, float]
    history: tuple[EpochResult, ...]
    precision: str = "fp32"


def run_trial(
    space: SearchSpace,
    arch: Architecture,
    data: Dataset,
    config: TrainConfig,
    *,
    seed: int,
    on_epoch: Callable[[EpochResult], None] | None = None,
    checkpoint: str | Path | None = None,
) -> TrialResult:
    """Check ``arch``'s budget, build it, train it on ``data`` (with the hyperparameters
    it carries, if its space searches them) and measure it. Deterministic for a seed
    on CPU.

    The global torch RNG (weight initialisation) is seeded inside a fork, so a trial
    neither depends on nor disturbs the caller's random state.
    """
    space.check_budget(arch)  # before any training; over budget ends the trial here
    config = dataclasses.replace(config, **space.train_overrides(arch))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = space.build(arch, input_shape=data.input_shape, num_classes=data.num_classes)
        result = train(model, data, config, seed=seed, on_epoch=on_epoch, checkpoint=checkpoint)
    test_accuracy, _ = evaluate(model, data.test, data)
    # Under torchrun only rank 0's result is kept: the other ranks skip the measurement,
    # which would also compete with rank 0's latency timing for the same cores.
    measured = profile(Derived(model=model, float_model=model), data) if world()[0] == 0 else {}
    metrics = {
        "accuracy": result.val_accuracy,
        "test_accuracy": test_accuracy,
        **measured,
        "train_seconds": result.seconds,
        "world_size": float(result.world_size),
    }
    return TrialResult(
        model=model, metrics=metrics, history=result.history, precision=result.precision
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class VariantResult:
    """A compressed variant of a trained candidate: its metrics (as a TrialResult's,
    with ``finetune_seconds``), or the reason it could not be derived."""

    name: str
    metrics: dict[str, float]
    reason: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.reason)


def profile(derived: Derived, data: Dataset) -> dict[str, float]:
    """Measure a model: FLOPs, MACs, sparse MACs and params counted on the float network
    with the variant's structure, BOPs at the variant's bit widths, saved bytes, and
    latency of the model that really runs (conventions: autosearch.cost)."""
    shape = data.input_shape
    cost = measure(derived.float_model, shape)
    runs = derived.model
    if next(runs.parameters(), torch.empty(0)).device.type != "cpu":
        runs = copy.deepcopy(runs).cpu()  # latency is reported on one CPU thread
    return {
        "flops": float(cost.flops),
        "macs": float(cost.macs),
        "sparse_macs": float(sparse_macs(derived.float_model, shape)),
        "params": float(cost.params),
        "bops": float(cost.macs * derived.weight_bits * derived.activation_bits),
        "bytes": float(derived.saved_bytes or saved_bytes(derived.float_model)),
        "latency": latency(runs, shape, batch=1),
        "latency_batched": latency(runs, shape, batch=LATENCY_BATCH),
    }


def run_variants(
    model: nn.Module,
    variants: Sequence[VariantSpec],
    data: Dataset,
    config: TrainConfig,
    *,
    seed: int,
    compression: Compression | None = None,
    teacher: nn.Module | None = None,
) -> list[VariantResult]:
    """Derive, evaluate (validation and test) and measure each non-base variant of the
    trained ``model``. A variant that cannot be derived is returned failed with its
    reason; the others go on."""
    results = []
    for spec in variants:
        if spec.kind == "base":
            continue
        start = time.perf_counter()
        try:
            derived = derive(
                spec, model, data, config, compression=compression, seed=seed, teacher=teacher
            )
            seconds = time.perf_counter() - start
            metrics = {
                "accuracy": evaluate(derived.model, data.val, data)[0],
                "test_accuracy": evaluate(derived.model, data.test, data)[0],
                **profile(derived, data),
                "finetune_seconds": seconds,
                **{f"detail_{k}": float(v) for k, v in derived.details.items()},
            }
        except Exception as exc:  # one variant failing must not lose the others
            log = logger.info if isinstance(exc, AutosearchError) else logger.warning
            log("variant %s failed: %s", spec.name, exc, exc_info=True)
            results.append(VariantResult(name=spec.name, metrics={}, reason=_reason(exc)))
        else:
            results.append(VariantResult(name=spec.name, metrics=metrics))
    return results


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]
