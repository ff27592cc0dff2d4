"""Compressed variants of a trained candidate, derived and measured for real.

A study names its variants with short strings:

========================  ==============================================================
``base``                  the trained network itself
``prune-l1@S``            unstructured magnitude (L1) pruning of every conv / linear
                          weight at sparsity ``S`` (0 < S < 1), then a short fine-tune
                          that keeps the zeros
``prune-channels@R``      structural channel pruning with torch-pruning at ratio ``R``:
                          a really smaller network, fine-tuned with knowledge
                          distillation from its parent
``int8``                  post-training static int8 (torchao PT2E, X86InductorQuantizer,
                          calibrated on training images, lowered to oneDNN int8 kernels);
                          in a search, estimated by fake quantization first
``qat-int8``              quantization-aware fine-tuning, then int8 as above
``distill``               the candidate fine-tuned on a teacher's soft targets (the
                          study's most accurate model so far, else itself)
========================  ==============================================================

:func:`derive` turns a trained parent into a :class:`Derived` variant; the runner
evaluates and measures it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from autosearch.compress.variants import (
    Compression,
    Derived,
    VariantSpec,
    parse_variant,
    parse_variants,
    variant_kinds,
)
from autosearch.data import Dataset
from autosearch.training.runtime import resolve
from autosearch.training.train import Criterion, TrainConfig, train

__all__ = [
    "Compression",
    "Derived",
    "VariantSpec",
    "derive",
    "distillation_loss",
    "parse_variant",
    "parse_variants",
    "variant_kinds",
]


def distillation_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float,
    alpha: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Hinton et al. (2015): ``alpha · T² · KL(softmax(t/T) ‖ softmax(s/T))
    + (1 - alpha) · CE(s, labels)``. The T² keeps the soft term's gradients on the
    scale of the hard term's as T changes."""
    t = temperature
    soft = F.kl_div(
        F.log_softmax(student / t, dim=1), F.softmax(teacher / t, dim=1), reduction="batchmean"
    )
    hard = F.cross_entropy(student, labels, label_smoothing=label_smoothing)
    return alpha * t * t * soft + (1.0 - alpha) * hard


def _distill_criterion(
    teacher: nn.Module, compression: Compression, label_smoothing: float
) -> Criterion:
    teacher.eval()

    def criterion(logits: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = teacher(x).float()
        return distillation_loss(
            logits.float(),
            target,
            y,
            temperature=compression.temperature,
            alpha=compression.alpha,
            label_smoothing=label_smoothing,
        )

    return criterion


def _finetune(
    model: nn.Module,
    data: Dataset,
    config: TrainConfig,
    compression: Compression,
    *,
    seed: int,
    teacher: nn.Module | None = None,
) -> None:
    """A few epochs at a lower learning rate, in this process only (no DDP: variants
    are derived on rank 0 after the candidate has been trained)."""
    tune = dataclasses.replace(
        config,
        epochs=compression.finetune_epochs,
        lr=config.lr * compression.finetune_lr_scale,
        auto_batch_size=False,
        compile=False,
    )
    runtime = dataclasses.replace(
        resolve(device=config.device, precision=config.precision), rank=0, world_size=1
    )
    if teacher is not None:
        teacher.to(runtime.device)
    criterion = (
        _distill_criterion(teacher, compression, config.label_smoothing) if teacher else None
    )
    train(model, data, tune, seed=seed, runtime=runtime, criterion=criterion)


# The variants ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, eq=False)
class _Job:
    spec: VariantSpec
    parent: nn.Module
    data: Dataset
    config: TrainConfig
    compression: Compression
    seed: int
    teacher: nn.Module | None
    estimate: bool = False


def _base(job: _Job) -> Derived:
    return Derived(model=job.parent, float_model=job.parent)


def _prune_l1(job: _Job) -> Derived:
    from torch.nn.utils import prune

    model = copy.deepcopy(job.parent)
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    for layer in layers:
        prune.l1_unstructured(layer, "weight", amount=job.spec.amount)
    # The masks stay on while fine-tuning, so pruned weights stay zero.
    _finetune(model, job.data, job.config, job.compression, seed=job.seed)
    for layer in layers:
        prune.remove(layer, "weight")
    zeros = sum(int((m.weight == 0).sum()) for m in layers)
    total = sum(m.weight.numel() for m in layers)
    return Derived(model=model, float_model=model, details={"sparsity": zeros / total})


def _prune_channels(job: _Job) -> Derived:
    from autosearch.compress._channels import prune_channels

    model = prune_channels(
        copy.deepcopy(job.parent), job.data.input_shape, ratio=float(job.spec.amount or 0)
    )
    job.parent.eval()
    _finetune(model, job.data, job.config, job.compression, seed=job.seed, teacher=job.parent)
    kept = sum(p.numel() for p in model.parameters()) / sum(
        p.numel() for p in job.parent.parameters()
    )
    return Derived(model=model, float_model=model, details={"params_kept": kept})


def _int8(job: _Job) -> Derived:
    if job.estimate:
        from autosearch.compress._fake_quant import estimate_int8

        return estimate_int8(job.parent, job.data, job.compression, seed=job.seed)
    from autosearch.compress._quantize import quantize_ptq

    return quantize_ptq(job.parent, job.data, job.compression, seed=job.seed)


def _qat_int8(job: _Job) -> Derived:
    from autosearch.compress._quantize import quantize_qat

    def tune(model: nn.Module) -> None:
        _finetune(model, job.data, job.config, job.compression, seed=job.seed)

    return quantize_qat(job.parent, job.data, job.compression, seed=job.seed, finetune=tune)


def _distill(job: _Job) -> Derived:
    model = copy.deepcopy(job.parent)
    teacher = job.teacher if job.teacher is not None else job.parent
    _finetune(model, job.data, job.config, job.compression, seed=job.seed, teacher=teacher)
    return Derived(
        model=model,
        float_model=model,
        details={"self_distilled": float(job.teacher is None)},
    )


_DERIVERS: dict[str, Callable[[_Job], Derived]] = {
    "base": _base,
    "prune-l1": _prune_l1,
    "prune-channels": _prune_channels,
    "int8": _int8,
    "qat-int8": _qat_int8,
    "distill": _distill,
}


def derive(
    spec: VariantSpec | str,
    parent: nn.Module,
    data: Dataset,
    config: TrainConfig,
    *,
    compression: Compression | None = None,
    seed: int = 0,
    teacher: nn.Module | None = None,
    estimate: bool = False,
) -> Derived:
    """Derive variant ``spec`` of the trained ``parent`` (which is left unchanged).

    ``teacher`` is the distillation teacher of ``distill`` (default: the parent).
    ``estimate``: where a variant has a cheap simulation (``int8``: fake quantization),
    return that instead of the real variant (``Derived.estimated`` says which it is).
    """
    spec = parse_variant(spec) if isinstance(spec, str) else spec
    job = _Job(
        spec=spec,
        parent=parent,
        data=data,
        config=config,
        compression=compression or Compression(),
        seed=seed,
        teacher=teacher,
        estimate=estimate,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _DERIVERS[spec.kind](job)
