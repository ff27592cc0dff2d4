"""ResNet search space: stem, stages of basic or bottleneck blocks, shortcut type.

It contains the published CIFAR ResNets (ResNet-20/56/110, He et al. 2016, with
option-A shortcuts) and the ImageNet ResNets (ResNet-18/34/50 as in torchvision),
exactly, and their neighbourhood.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from autosearch.architecture import Architecture, Gene
from autosearch.errors import ConfigError
from autosearch.registry import register_space
from autosearch.scoring.cost import Cost, Tally
from autosearch.space import Categorical, Domain, IntRange, NetworkSpec, SearchSpace, check_sizes
from search_spaces._shareable import WithSupernet
from search_spaces._stem import STEMS, choose_stem, tally_stem

__all__ = ["ResNetSpace"]

_EXPANSION = {"basic": 1, "bottleneck": 4}


def _cifar(n: int) -> dict[str, Gene]:
    stages = {1: (n, 16, 1), 2: (n, 32, 2), 3: (n, 64, 2)}
    return {"stem.width": 16, "block": "basic", "shortcut": "pad", "stages": 3, **_stages(stages)}


def _imagenet(block: str, depths: tuple[int, int, int, int]) -> dict[str, Gene]:
    stages = {i + 1: (d, 64 * 2**i, 1 if i == 0 else 2) for i, d in enumerate(depths)}
    return {
        "stem.width": 64,
        "block": block,
        "shortcut": "projection",
        "stages": 4,
        **_stages(stages),
    }


def _stages(stages: Mapping[int, tuple[int, int, int]]) -> dict[str, Gene]:
    genes: dict[str, Gene] = {}
    for i, (depth, width, stride) in stages.items():
        genes |= {f"stage{i}.depth": depth, f"stage{i}.width": width, f"stage{i}.stride": stride}
    return genes


_REFERENCES: dict[str, dict[str, Gene]] = {
    "resnet20": _cifar(3),
    "resnet56": _cifar(9),
    "resnet110": _cifar(18),
    "resnet18": _imagenet("basic", (2, 2, 2, 2)),
    "resnet34": _imagenet("basic", (3, 4, 6, 3)),
    "resnet50": _imagenet("bottleneck", (3, 4, 6, 3)),
}


@register_space("resnet")
@dataclass(frozen=True, kw_only=True)
class ResNetSpace(WithSupernet, SearchSpace):
    """Residual networks of 1 to ``max_stages`` stages.

    Genes: ``stem.width``, ``block`` (basic / bottleneck), ``shortcut`` (projection /
    pad), ``stages``, and for each stage ``stageI.depth``, ``stageI.width`` (for
    bottleneck blocks the inner width; outputs are 4×) and ``stageI.stride``. Genes
    of stages beyond ``stages`` are reset to their defaults, and so is ``shortcut``
    when no block changes shape, so equal networks share an ``arch_id``.

    Args:
        min_stages, max_stages: Range of the number of stages.
        depths: Allowed blocks per stage.
        widths: Allowed stage widths.
        stem_widths: Allowed stem widths.
        strides: Allowed stage strides.
        blocks: Allowed block types.
        shortcuts: Allowed shortcut types where shapes change.
        stem: ``"cifar"`` (3×3 conv), ``"imagenet"`` (7×7/2 conv + 3×3/2 max-pool) or
            ``"auto"`` (ImageNet-style for inputs of 128 px and more).
    """

    min_stages: int = 1
    max_stages: int = 4
    depths: tuple[int, ...] = (1, 2, 3, 4, 6, 9, 18)
    widths: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    stem_widths: tuple[int, ...] = (16, 32, 64)
    strides: tuple[int, ...] = (1, 2)
    blocks: tuple[str, ...] = ("basic", "bottleneck")
    shortcuts: tuple[str, ...] = ("projection", "pad")
    stem: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("depths", "widths", "stem_widths", "strides", "blocks", "shortcuts"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
            if not getattr(self, name):
                raise ConfigError(f"ResNetSpace {name} must not be empty")
        check_sizes("ResNetSpace", "channels", widths=self.widths, stem_widths=self.stem_widths)
        check_sizes("ResNetSpace", "blocks", depths=self.depths)
        check_sizes("ResNetSpace", "stride", strides=self.strides)
        check_sizes("ResNetSpace", "stages", min_stages=self.min_stages, max_stages=self.max_stages)
        if not 1 <= self.min_stages <= self.max_stages:
            raise ConfigError(
                f"need 1 <= min_stages <= max_stages, got {self.min_stages}, {self.max_stages}"
            )
        if self.stem not in STEMS:
            raise ConfigError(f"stem must be 'auto', 'cifar' or 'imagenet', got {self.stem!r}")
        if set(self.blocks) - set(_EXPANSION):
            raise ConfigError(f"blocks must be among 'basic', 'bottleneck', got {self.blocks}")
        if set(self.shortcuts) - {"projection", "pad"}:
            raise ConfigError(f"shortcuts must be among 'projection', 'pad', got {self.shortcuts}")

    def domains(self) -> Mapping[str, Domain]:
        genes: dict[str, Domain] = {
            "stem.width": Categorical(self.stem_widths),
            "block": Categorical(self.blocks),
            "shortcut": Categorical(self.shortcuts),
            "stages": IntRange(self.min_stages, self.max_stages, default=self.max_stages),
        }
        for i in range(1, self.max_stages + 1):
            genes[f"stage{i}.depth"] = Categorical(self.depths)
            genes[f"stage{i}.width"] = Categorical(self.widths)
            stride = 1 if i == 1 or 2 not in self.strides else 2
            genes[f"stage{i}.stride"] = Categorical(self.strides, default=stride)
        return genes

    def canonicalize(self, arch: Architecture) -> Architecture:
        self.validate(arch)
        unused = [
            f"stage{i}.{part}"
            for i in range(int(arch["stages"]) + 1, self.max_stages + 1)
            for part in ("depth", "width", "stride")
        ]
        if not self._changes_shape(arch):
            unused.append("shortcut")
        return self.reset(arch, unused)

    def _changes_shape(self, genes: Mapping[str, Gene]) -> bool:
        """Whether any block's input and output shapes differ (so shortcut matters)."""
        expansion = _EXPANSION[str(genes["block"])]
        channels = int(genes["stem.width"])
        for i in range(1, int(genes["stages"]) + 1):
            out = int(genes[f"stage{i}.width"]) * expansion
            if genes[f"stage{i}.stride"] != 1 or out != channels:
                return True
            channels = out
        return False

    def network(
        self, arch: Architecture, *, input_shape: Sequence[int], num_classes: int
    ) -> NetworkSpec:
        stem = choose_stem(self.stem, input_shape)
        stages = [
            [arch[f"stage{i}.depth"], arch[f"stage{i}.width"], arch[f"stage{i}.stride"]]
            for i in range(1, int(arch["stages"]) + 1)
        ]
        kwargs: dict[str, Any] = {
            "in_channels": input_shape[0],
            "num_classes": num_classes,
            "stem": stem,
            "stem_width": arch["stem.width"],
            "block": arch["block"],
            "shortcut": arch["shortcut"],
            "stages": stages,
        }
        return NetworkSpec(module="search_spaces._resnet_net", factory="ResNet", kwargs=kwargs)

    def cost_model(
        self, arch: Architecture, input_shape: tuple[int, int, int], num_classes: int
    ) -> Cost:
        kw = self.network(arch, input_shape=input_shape, num_classes=num_classes).kwargs
        t = tally_stem(Tally.of(input_shape), kw["stem"], kw["stem_width"])
        expansion = _EXPANSION[kw["block"]]
        for depth, width, stride in kw["stages"]:
            for index in range(depth):
                s = stride if index == 0 else 1
                shortcut = t.fork()
                c_out = width * expansion
                if s != 1 or t.channels != c_out:
                    if kw["shortcut"] == "pad" and c_out >= t.channels:
                        shortcut.pool(1, s)
                        shortcut.channels = c_out
                    else:
                        shortcut.conv(c_out, 1, s)
                if kw["block"] == "basic":
                    t.conv(width, 3, s).conv(c_out, 3)
                else:
                    t.conv(width, 1).conv(width, 3, s).conv(c_out, 1)
                t.join(shortcut)
                t.channels = c_out
        return t.linear_head(num_classes).cost()

    def describe(self, arch: Architecture) -> str:
        stages = "-".join(
            f"{arch[f'stage{i}.depth']}x{arch[f'stage{i}.width']}"
            + (f"/{arch[f'stage{i}.stride']}" if arch[f"stage{i}.stride"] != 1 else "")
            for i in range(1, int(arch["stages"]) + 1)
        )
        return f"resnet {arch['block']} {arch['shortcut']} stem{arch['stem.width']} {stages}"

    # Weight sharing ----------------------------------------------------------------------
    def elastic_genes(self) -> tuple[str, ...]:
        """Genes a supernet shares weights across: the stem width, and each stage's depth
        (its first blocks run) and width (the first channels of every weight)."""
        per_stage = ("depth", "width")
        stages = range(1, self.max_stages + 1)
        return ("stem.width", *(f"stage{i}.{part}" for i in stages for part in per_stage))

    def build_supernet(
        self, largest: Architecture, *, input_shape: Sequence[int], num_classes: int, **_: Any
    ) -> nn.Module:
        """The supernet module at ``largest``'s sizes (search_spaces._resnet_super)."""
        from search_spaces._resnet_super import ResNetSupernet

        spec = self.network(largest, input_shape=input_shape, num_classes=num_classes)
        return ResNetSupernet(**spec.kwargs)

    def references(self) -> list[str]:
        """Names of the published networks :meth:`reference` knows."""
        return sorted(_REFERENCES)

    def reference(self, name: str) -> Architecture:
        """The architecture of a published ResNet (see :meth:`references`)."""
        return self._reference(name, _REFERENCES)
