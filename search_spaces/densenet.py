"""DenseNet search space: growth rate, layers per block, bottleneck and compression.

It contains DenseNet-BC-100 (k = 12, CIFAR) and DenseNet-121 (ImageNet, as in
torchvision) exactly, and their neighbourhood.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autosearch.architecture import Architecture, Gene
from autosearch.errors import ConfigError, InvalidArchitectureError
from autosearch.registry import register_space
from autosearch.scoring.cost import Cost, Tally
from autosearch.space import Categorical, Domain, IntRange, NetworkSpec, SearchSpace, check_sizes
from search_spaces._stem import STEMS, choose_stem, tally_stem

__all__ = ["DenseNetSpace"]

_REFERENCES: dict[str, dict[str, Gene]] = {
    # (100 - 4) / 6 = 16 bottleneck layers per block; 2k initial features; θ = 0.5.
    "densenet_bc_100_k12": {
        "growth": 12,
        "stem.width": 24,
        "bottleneck": True,
        "compression": 0.5,
        "blocks": 3,
        "block1.layers": 16,
        "block2.layers": 16,
        "block3.layers": 16,
    },
    "densenet121": {
        "growth": 32,
        "stem.width": 64,
        "bottleneck": True,
        "compression": 0.5,
        "blocks": 4,
        "block1.layers": 6,
        "block2.layers": 12,
        "block3.layers": 24,
        "block4.layers": 16,
    },
}


@register_space("densenet")
@dataclass(frozen=True, kw_only=True)
class DenseNetSpace(SearchSpace):
    """Densely connected networks of 1 to ``max_blocks`` dense blocks.

    Genes: ``growth`` (k), ``stem.width`` (initial features), ``bottleneck``,
    ``compression``, ``blocks``, and ``blockI.layers`` per block. Layer counts of
    blocks beyond ``blocks`` are reset to their default, and so is ``compression``
    for a single block (it has no transition).

    Args:
        min_blocks, max_blocks: Range of the number of dense blocks.
        growths: Allowed growth rates.
        layers: Allowed dense layers per block.
        stem_widths: Allowed initial feature counts.
        bottlenecks: Allowed bottleneck settings.
        compressions: Allowed transition compressions (1.0 = none).
        bn_size: Bottleneck width in multiples of the growth rate.
        stem: ``"cifar"``, ``"imagenet"`` or ``"auto"`` (ImageNet-style from 128 px up).
    """

    min_blocks: int = 1
    max_blocks: int = 4
    growths: tuple[int, ...] = (12, 16, 24, 32)
    layers: tuple[int, ...] = (2, 4, 6, 8, 12, 16, 24, 32)
    stem_widths: tuple[int, ...] = (16, 24, 32, 48, 64)
    bottlenecks: tuple[bool, ...] = (True, False)
    compressions: tuple[float, ...] = (0.5, 1.0)
    bn_size: int = 4
    stem: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("growths", "layers", "stem_widths", "bottlenecks", "compressions"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
            if not getattr(self, name):
                raise ConfigError(f"DenseNetSpace {name} must not be empty")
        owner = "DenseNetSpace"
        check_sizes(owner, "channels", growths=self.growths, stem_widths=self.stem_widths)
        check_sizes(owner, "channels", bn_size=self.bn_size)
        check_sizes(owner, "blocks", layers=self.layers)
        check_sizes(owner, "stages", min_blocks=self.min_blocks, max_blocks=self.max_blocks)
        if not 1 <= self.min_blocks <= self.max_blocks:
            raise ConfigError(
                f"need 1 <= min_blocks <= max_blocks, got {self.min_blocks}, {self.max_blocks}"
            )
        if any(not 0 < c <= 1 for c in self.compressions):
            raise ConfigError(f"compressions must be in (0, 1], got {self.compressions}")
        if self.stem not in STEMS:
            raise ConfigError(f"stem must be 'auto', 'cifar' or 'imagenet', got {self.stem!r}")

    def domains(self) -> Mapping[str, Domain]:
        genes: dict[str, Domain] = {
            "growth": Categorical(self.growths),
            "stem.width": Categorical(self.stem_widths),
            "bottleneck": Categorical(self.bottlenecks),
            "compression": Categorical(self.compressions),
            "blocks": IntRange(self.min_blocks, self.max_blocks, default=self.max_blocks),
        }
        for i in range(1, self.max_blocks + 1):
            genes[f"block{i}.layers"] = Categorical(self.layers)
        return genes

    def canonicalize(self, arch: Architecture) -> Architecture:
        self.validate(arch)
        unused = [f"block{i}.layers" for i in range(int(arch["blocks"]) + 1, self.max_blocks + 1)]
        if arch["blocks"] == 1:
            unused.append("compression")  # a single block has no transition
        return self.reset(arch, unused)

    def check_input(self, arch: Architecture, input_shape: Sequence[int]) -> None:
        """Each transition halves the feature map (2×2 pooling, rounding down)."""
        size = min(input_shape[1:])
        if choose_stem(self.stem, input_shape) == "imagenet":
            size = ((size - 1) // 2 + 1 - 1) // 2 + 1  # 7×7/2 conv, then 3×3/2 max-pool
        for i in range(1, int(arch["blocks"])):
            if size < 2:
                raise InvalidArchitectureError(
                    f"gene 'blocks' = {arch['blocks']}: the transition after block {i} would "
                    f"pool a {size}×{size} feature map to nothing for {tuple(input_shape)} "
                    f"inputs; use at most {i} blocks for images this small"
                )
            size //= 2

    def network(
        self, arch: Architecture, *, input_shape: Sequence[int], num_classes: int
    ) -> NetworkSpec:
        blocks = [arch[f"block{i}.layers"] for i in range(1, int(arch["blocks"]) + 1)]
        return NetworkSpec(
            module="search_spaces._densenet_net",
            factory="DenseNet",
            kwargs={
                "in_channels": input_shape[0],
                "num_classes": num_classes,
                "stem": choose_stem(self.stem, input_shape),
                "stem_width": arch["stem.width"],
                "growth": arch["growth"],
                "blocks": blocks,
                "bottleneck": arch["bottleneck"],
                "compression": arch["compression"],
                "bn_size": self.bn_size,
            },
        )

    def cost_model(
        self, arch: Architecture, input_shape: tuple[int, int, int], num_classes: int
    ) -> Cost:
        kw = self.network(arch, input_shape=input_shape, num_classes=num_classes).kwargs
        t = tally_stem(Tally.of(input_shape), kw["stem"], kw["stem_width"], cifar_bn=False)
        growth = kw["growth"]
        for index, layers in enumerate(kw["blocks"]):
            for _ in range(layers):
                channels = t.channels
                t.bn()  # each dense layer opens with BN-ReLU on everything so far
                if kw["bottleneck"]:
                    t.conv(self.bn_size * growth, 1, bn=False).bn()
                t.conv(growth, 3, bn=False)
                t.channels = channels + growth
            if index < len(kw["blocks"]) - 1:
                t.bn().conv(int(t.channels * kw["compression"]), 1, bn=False).pool(2, 2)
        return t.bn().linear_head(num_classes).cost()

    def describe(self, arch: Architecture) -> str:
        compressed = float(arch["compression"]) < 1 and int(arch["blocks"]) > 1
        kind = ("BC" if compressed else "B") if arch["bottleneck"] else ("C" if compressed else "")
        blocks = "-".join(str(arch[f"block{i}.layers"]) for i in range(1, int(arch["blocks"]) + 1))
        return (
            f"densenet{('-' + kind) if kind else ''} k{arch['growth']} "
            f"stem{arch['stem.width']} blocks {blocks}"
            + (f" theta{arch['compression']}" if compressed else "")
        )

    def references(self) -> list[str]:
        return sorted(_REFERENCES)

    def reference(self, name: str) -> Architecture:
        return self._reference(name, _REFERENCES)
