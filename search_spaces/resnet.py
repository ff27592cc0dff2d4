"""ResNet search space: per-stage depth and width, block type and stem width."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autosearch.architecture import Architecture
from autosearch.registry import register_space
from autosearch.space import Categorical, Domain, NetworkSpec, SearchSpace

__all__ = ["ResNetSpace"]

_IMAGENET_STEM_MIN_SIZE = 128  # below this a 7×7/4 stem throws away most of the image


@register_space("resnet")
@dataclass(frozen=True, kw_only=True)
class ResNetSpace(SearchSpace):
    """Residual networks with ``stages`` stages; the first keeps the resolution,
    each later one halves it.

    Genes: ``stem.width``, ``block`` (basic / bottleneck), and per stage ``stageI.depth``
    and ``stageI.width`` (for bottleneck blocks the inner width; outputs are 4×).

    Args:
        stages: Number of stages.
        depths: Allowed blocks per stage.
        widths: Allowed channel widths (stem and stages).
        blocks: Allowed block types.
        stem: ``"cifar"``, ``"imagenet"`` or ``"auto"`` (ImageNet-style from 128 px up).
    """

    stages: int = 3
    depths: tuple[int, ...] = (1, 2, 3)
    widths: tuple[int, ...] = (16, 32, 64)
    blocks: tuple[str, ...] = ("basic", "bottleneck")
    stem: str = "auto"

    def __post_init__(self) -> None:
        for name in ("depths", "widths", "blocks"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.stages < 1:
            raise ValueError(f"ResNetSpace needs at least one stage, got stages={self.stages}")
        if self.stem not in ("auto", "cifar", "imagenet"):
            raise ValueError(f"stem must be 'auto', 'cifar' or 'imagenet', got {self.stem!r}")
        unknown = set(self.blocks) - {"basic", "bottleneck"}
        if unknown or not self.blocks:
            raise ValueError(f"blocks must be among 'basic', 'bottleneck', got {self.blocks}")
        if not self.depths or min(self.depths) < 1 or not self.widths or min(self.widths) < 1:
            raise ValueError("depths and widths must be non-empty and positive")

    def domains(self) -> Mapping[str, Domain]:
        genes: dict[str, Domain] = {
            "stem.width": Categorical(self.widths),
            "block": Categorical(self.blocks),
        }
        for i in range(1, self.stages + 1):
            genes[f"stage{i}.depth"] = Categorical(self.depths)
            genes[f"stage{i}.width"] = Categorical(self.widths)
        return genes

    def network(
        self, arch: Architecture, *, input_shape: Sequence[int], num_classes: int
    ) -> NetworkSpec:
        channels, height, width = input_shape
        stem = self.stem
        if stem == "auto":
            stem = "imagenet" if min(height, width) >= _IMAGENET_STEM_MIN_SIZE else "cifar"
        stages = [
            [arch[f"stage{i}.depth"], arch[f"stage{i}.width"], 1 if i == 1 else 2]
            for i in range(1, self.stages + 1)
        ]
        return NetworkSpec(
            module="search_spaces._resnet_net",
            factory="ResNet",
            kwargs={
                "in_channels": channels,
                "num_classes": num_classes,
                "stem": stem,
                "stem_width": arch["stem.width"],
                "block": arch["block"],
                "stages": stages,
            },
        )

    def describe(self, arch: Architecture) -> str:
        stages = "-".join(
            f"{arch[f'stage{i}.depth']}x{arch[f'stage{i}.width']}"
            for i in range(1, self.stages + 1)
        )
        return f"resnet {arch['block']} stem{arch['stem.width']} {stages}"
