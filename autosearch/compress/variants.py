"""What a variant is: its name parsed (``prune-l1@0.5`` → kind and amount), the
compression settings a study derives variants with, and a derived variant (the network
the runner evaluates and measures, and what it was derived from)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch.nn as nn

from autosearch._checks import Check, check_fields, flag, real, whole
from autosearch.errors import AutosearchError, UnknownNameError

__all__ = [
    "Compression",
    "Derived",
    "VariantSpec",
    "parse_variant",
    "parse_variants",
    "variant_kinds",
]


@dataclass(frozen=True, kw_only=True)
class VariantSpec:
    """A parsed variant name: its kind and, for pruning, the sparsity or ratio."""

    kind: str
    amount: float | None = None

    @property
    def name(self) -> str:
        return self.kind if self.amount is None else f"{self.kind}@{self.amount:g}"

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, kw_only=True)
class Compression:
    """How variants are derived (the same for every candidate of a study).

    Attributes:
        finetune_epochs: Epochs of fine-tuning for pruned, QAT and distilled variants.
        finetune_lr_scale: Fine-tuning learning rate = the study's ``lr`` × this.
        temperature: Softmax temperature of knowledge distillation.
        alpha: Weight of the soft-target term (1 - alpha goes to the labels).
        calibration_images: Training images that calibrate int8 activation ranges.
        only_front: Derive variants only for candidates whose base is on the current
            accuracy-FLOPs front of the study (keeps CPU studies fast).
        estimate: Estimate each candidate's ``int8`` accuracy with simulated (fake)
            quantization of its float weights (autosearch.compress._fake_quant), and
            lower to a real int8 program only the points on the study's front (measured
            when the search ends, or by ``study.pareto(measured=True)``), ``best()`` and
            exports. False: every candidate's int8 program is lowered and measured.
            (Studies with latency among their objectives lower every candidate: an
            int8 program's latency is not predicted.)
        latency: How candidates' latency is known: ``"predicted"`` from this machine's
            lookup table of measured layers (autosearch.scoring.latency; front members are then
            timed too), ``"measured"`` (timed for every candidate), or the path of a
            table measured on another device (``autosearch latency-table``).
    """

    finetune_epochs: int = 2
    finetune_lr_scale: float = 0.5
    temperature: float = 4.0
    alpha: float = 0.9
    calibration_images: int = 512
    only_front: bool = False
    estimate: bool = True
    latency: str = "predicted"

    def __post_init__(self) -> None:
        check_fields("Compression", self, _COMPRESSION_CHECKS)

    @property
    def latency_table(self) -> str | None:
        """The path of a table of another device, if ``latency`` names one."""
        return None if self.latency in ("predicted", "measured") else self.latency


_COMPRESSION_CHECKS: tuple[Check, ...] = (
    ("finetune_epochs", whole(1), "an integer >= 1"),
    ("finetune_lr_scale", real(0, above=True), "a finite number > 0"),
    ("temperature", real(0, above=True), "a finite number > 0"),
    ("alpha", lambda v: real(0)(v) and v <= 1, "a number in [0, 1]"),
    ("calibration_images", whole(1), "an integer >= 1"),
    ("only_front", flag, "True or False"),
    ("estimate", flag, "True or False"),
    (
        "latency",
        lambda v: isinstance(v, str) and bool(v.strip()) and "\x00" not in v,
        "'predicted', 'measured' or a latency table's path",
    ),
)


@dataclass(frozen=True, kw_only=True, eq=False)
class Derived:
    """A variant ready to evaluate and measure.

    ``model`` is what runs (for int8: the lowered program); ``float_model`` is the float
    network with the variant's structure and zeros, on which MACs are counted.
    ``saved_bytes`` is set where the saved form is not a float state dict. ``reference``
    (int8 only) is the portable quantized graph: int8 weights with quantize / dequantize
    operations, which ``torch.export`` can save and plain torch can load.
    ``estimated``: ``model`` simulates the variant (int8 by fake quantization), so its
    accuracy and bytes are estimates; the real variant is derived with ``estimate=False``.
    """

    model: nn.Module
    float_model: nn.Module
    weight_bits: int = 32
    activation_bits: int = 32
    saved_bytes: int | None = None
    details: dict[str, float] = field(default_factory=dict)
    reference: nn.Module | None = None
    estimated: bool = False


# Parsing ------------------------------------------------------------------------------
def _no_amount(kind: str) -> Callable[[str | None], VariantSpec]:
    def parse(amount: str | None) -> VariantSpec:
        if amount is not None:
            raise AutosearchError(f"variant {kind!r} takes no '@' amount, got {kind}@{amount}")
        return VariantSpec(kind=kind)

    return parse


def _fraction(kind: str, what: str) -> Callable[[str | None], VariantSpec]:
    def parse(amount: str | None) -> VariantSpec:
        try:
            value = float(amount) if amount is not None else None
        except ValueError:
            value = None
        if value is None or not 0.0 < value < 1.0:
            raise AutosearchError(
                f"variant {kind!r} needs a {what} between 0 and 1 after '@', "
                f"e.g. {kind}@0.5; got {kind}@{amount}"
            )
        return VariantSpec(kind=kind, amount=value)

    return parse


_PARSERS: dict[str, Callable[[str | None], VariantSpec]] = {
    "base": _no_amount("base"),
    "prune-l1": _fraction("prune-l1", "sparsity"),
    "prune-channels": _fraction("prune-channels", "ratio"),
    "int8": _no_amount("int8"),
    "qat-int8": _no_amount("qat-int8"),
    "distill": _no_amount("distill"),
}


def variant_kinds() -> list[str]:
    return list(_PARSERS)


def parse_variant(text: str) -> VariantSpec:
    """``"prune-channels@0.5"`` → VariantSpec(kind="prune-channels", amount=0.5)."""
    kind, _, amount = str(text).strip().partition("@")
    try:
        parser = _PARSERS[kind]
    except KeyError:
        raise UnknownNameError("variant", kind, _PARSERS) from None
    return parser(amount if _ else None)


def parse_variants(names: Iterable[str]) -> tuple[VariantSpec, ...]:
    """Parse a study's variants: ``base`` first (added when missing), no duplicates."""
    specs = [parse_variant(n) for n in names]
    seen = [s.name for s in specs]
    if len(set(seen)) != len(seen):
        raise AutosearchError(f"variants must be distinct, got {seen}")
    if "base" not in seen:
        specs.insert(0, VariantSpec(kind="base"))
    return tuple(sorted(specs, key=lambda s: s.kind != "base"))


# Distillation -------------------------------------------------------------------------
