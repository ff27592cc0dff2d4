"""MobileNet search space: depthwise-separable and inverted-residual blocks.

Per stage: block type, depth, width, stride, expansion ratio, kernel size (3/5/7) and
squeeze-excitation; globally: activation, width multiplier, stem and head. It
contains MobileNetV2 (ImageNet, as in torchvision) and its common CIFAR variant
(stem and second stage at stride 1) exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch.nn as nn

from autosearch.architecture import Architecture, Gene
from autosearch.errors import ConfigError
from autosearch.registry import register_space
from autosearch.scoring.cost import Cost, Tally
from autosearch.space import Categorical, Domain, IntRange, NetworkSpec, SearchSpace, check_sizes
from search_spaces._shareable import WithSupernet

__all__ = ["MobileNetSpace"]

# MobileNetV2's stages as (expansion t, width c, depth n, stride s), Sandler et al. Table 2.
_MNV2 = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def _mobilenetv2(*, cifar: bool) -> dict[str, Gene]:
    genes: dict[str, Gene] = {
        "width_mult": 1.0,
        "activation": "relu6",
        "stem.width": 32,
        "stem.stride": 1 if cifar else 2,
        "head.width": 1280,
        "stages": 7,
    }
    for i, (t, c, n, s) in enumerate(_MNV2, start=1):
        stride = 1 if cifar and i == 2 else s
        genes |= {
            f"stage{i}.block": "ir",
            f"stage{i}.depth": n,
            f"stage{i}.width": c,
            f"stage{i}.stride": stride,
            f"stage{i}.expansion": t,
            f"stage{i}.kernel": 3,
            f"stage{i}.se": False,
        }
    return genes


_REFERENCES = {
    "mobilenetv2": _mobilenetv2(cifar=False),
    "mobilenetv2_cifar": _mobilenetv2(cifar=True),
}


def _divisible(value: float, divisor: int = 8) -> int:
    # Same rounding as make_divisible in _mobilenet_net.py (which may import only torch).
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


@register_space("mobilenet")
@dataclass(frozen=True, kw_only=True)
class MobileNetSpace(WithSupernet, SearchSpace):
    """MobileNet-family networks of 1 to ``max_stages`` stages.

    Genes: ``width_mult``, ``activation``, ``stem.width``, ``stem.stride``,
    ``head.width``, ``stages``, and per stage ``stageI.block`` (``ir`` inverted
    residual or ``ds`` depthwise-separable), ``.depth``, ``.width``, ``.stride``,
    ``.expansion``, ``.kernel`` and ``.se``. Stages beyond ``stages`` are reset, and
    so is the expansion of ``ds`` stages (they have none).
    """

    min_stages: int = 1
    max_stages: int = 7
    width_mults: tuple[float, ...] = (1.0, 0.35, 0.5, 0.75, 1.4)
    activations: tuple[str, ...] = ("relu6", "relu", "hswish")
    stem_widths: tuple[int, ...] = (32, 16, 24)
    stem_strides: tuple[int, ...] = (1, 2)
    head_widths: tuple[int, ...] = (1280, 640, 1024)
    block_types: tuple[str, ...] = ("ir", "ds")
    depths: tuple[int, ...] = (1, 2, 3, 4)
    widths: tuple[int, ...] = (16, 24, 32, 40, 48, 64, 80, 96, 112, 160, 192, 320)
    strides: tuple[int, ...] = (1, 2)
    expansions: tuple[int, ...] = (1, 3, 4, 6)
    kernels: tuple[int, ...] = (3, 5, 7)
    se: tuple[bool, ...] = (False, True)
    dropout: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        names = (
            "width_mults",
            "activations",
            "stem_widths",
            "stem_strides",
            "head_widths",
            "block_types",
            "depths",
            "widths",
            "strides",
            "expansions",
            "kernels",
            "se",
        )
        for name in names:
            object.__setattr__(self, name, tuple(getattr(self, name)))
            if not getattr(self, name):
                raise ConfigError(f"MobileNetSpace {name} must not be empty")
        owner = "MobileNetSpace"
        channels = {"stem_widths": self.stem_widths, "head_widths": self.head_widths}
        check_sizes(owner, "channels", widths=self.widths, expansions=self.expansions, **channels)
        check_sizes(owner, "blocks", depths=self.depths)
        check_sizes(owner, "stride", strides=self.strides, stem_strides=self.stem_strides)
        check_sizes(owner, "kernel", kernels=self.kernels)
        check_sizes(owner, "stages", min_stages=self.min_stages, max_stages=self.max_stages)
        if not 1 <= self.min_stages <= self.max_stages:
            raise ConfigError(
                f"need 1 <= min_stages <= max_stages, got {self.min_stages}, {self.max_stages}"
            )
        if set(self.activations) - {"relu", "relu6", "hswish"}:
            raise ConfigError(f"activations must be among relu, relu6, hswish: {self.activations}")
        if set(self.block_types) - {"ir", "ds"}:
            raise ConfigError(f"block_types must be among 'ir', 'ds': {self.block_types}")
        if any(k % 2 == 0 for k in self.kernels):
            raise ConfigError(f"kernels must be odd, got {self.kernels}")

    def domains(self) -> Mapping[str, Domain]:
        genes: dict[str, Domain] = {
            "width_mult": Categorical(self.width_mults),
            "activation": Categorical(self.activations),
            "stem.width": Categorical(self.stem_widths),
            "stem.stride": Categorical(
                self.stem_strides, default=2 if 2 in self.stem_strides else None
            ),
            "head.width": Categorical(self.head_widths),
            "stages": IntRange(self.min_stages, self.max_stages, default=self.max_stages),
        }
        for i in range(1, self.max_stages + 1):
            genes |= {
                f"stage{i}.block": Categorical(self.block_types),
                f"stage{i}.depth": Categorical(self.depths),
                f"stage{i}.width": Categorical(self.widths),
                f"stage{i}.stride": Categorical(self.strides),
                f"stage{i}.expansion": Categorical(self.expansions),
                f"stage{i}.kernel": Categorical(self.kernels),
                f"stage{i}.se": Categorical(self.se),
            }
        return genes

    def canonicalize(self, arch: Architecture) -> Architecture:
        self.validate(arch)
        every = ("block", "depth", "width", "stride", "expansion", "kernel", "se")
        unused = [
            f"stage{i}.{part}"
            for i in range(int(arch["stages"]) + 1, self.max_stages + 1)
            for part in every
        ]
        unused += [
            f"stage{i}.expansion"
            for i in range(1, int(arch["stages"]) + 1)
            if arch[f"stage{i}.block"] == "ds"
        ]  # depthwise-separable: no expansion
        return self.reset(arch, unused)

    def network(
        self, arch: Architecture, *, input_shape: Sequence[int], num_classes: int
    ) -> NetworkSpec:
        mult = float(arch["width_mult"])
        stages = [
            [
                arch[f"stage{i}.block"],
                arch[f"stage{i}.depth"],
                _divisible(int(arch[f"stage{i}.width"]) * mult),
                arch[f"stage{i}.stride"],
                arch[f"stage{i}.expansion"],
                arch[f"stage{i}.kernel"],
                arch[f"stage{i}.se"],
            ]
            for i in range(1, int(arch["stages"]) + 1)
        ]
        return NetworkSpec(
            module="search_spaces._mobilenet_net",
            factory="MobileNet",
            kwargs={
                "in_channels": input_shape[0],
                "num_classes": num_classes,
                "stem_width": _divisible(int(arch["stem.width"]) * mult),
                "stem_stride": arch["stem.stride"],
                "stages": stages,
                "head_width": _divisible(int(arch["head.width"]) * max(1.0, mult)),
                "activation": arch["activation"],
                "dropout": self.dropout,
            },
        )

    def cost_model(
        self, arch: Architecture, input_shape: tuple[int, int, int], num_classes: int
    ) -> Cost:
        kw = self.network(arch, input_shape=input_shape, num_classes=num_classes).kwargs
        t = Tally.of(input_shape)
        t.conv(kw["stem_width"], 3, kw["stem_stride"])
        for block, depth, width, stride, expansion, kernel, se in kw["stages"]:
            for index in range(depth):
                s = stride if index == 0 else 1
                if block == "ir":
                    hidden = round(t.channels * expansion)
                    if expansion != 1:
                        t.conv(hidden, 1)
                else:
                    hidden = t.channels
                t.conv(hidden, kernel, s, groups=hidden)
                if se:
                    squeeze = t.fork()
                    squeeze.height = squeeze.width = 1
                    squeeze.conv(_divisible(hidden / 4), 1, bias=True, bn=False)
                    squeeze.conv(hidden, 1, bias=True, bn=False)
                    t.macs += squeeze.macs
                    t.params += squeeze.params
                t.conv(width, 1)
        t.conv(kw["head_width"], 1)
        return t.linear_head(num_classes).cost()

    def describe(self, arch: Architecture) -> str:
        """timm-style block strings, e.g. ``ir_r3_k3_s2_e6_c32`` per stage."""
        stages = []
        for i in range(1, int(arch["stages"]) + 1):
            g = {
                p: arch[f"stage{i}.{p}"]
                for p in ("block", "depth", "kernel", "stride", "expansion", "width", "se")
            }
            expansion = f"_e{g['expansion']}" if g["block"] == "ir" else ""
            se = "_se0.25" if g["se"] else ""
            stages.append(
                f"{g['block']}_r{g['depth']}_k{g['kernel']}_s{g['stride']}"
                f"{expansion}_c{g['width']}{se}"
            )
        return (
            f"mobilenet x{arch['width_mult']} {arch['activation']} "
            f"stem{arch['stem.width']}/{arch['stem.stride']} {' '.join(stages)} "
            f"head{arch['head.width']}"
        )

    # Weight sharing ----------------------------------------------------------------------
    def elastic_genes(self) -> tuple[str, ...]:
        """Genes a supernet shares weights across, per stage: depth (its first blocks
        run), width and expansion (the first channels of every weight), kernel (the
        centred crop of the largest) and squeeze-excitation (on or off)."""
        per_stage = ("depth", "width", "expansion", "kernel", "se")
        stages = range(1, self.max_stages + 1)
        return tuple(f"stage{i}.{part}" for i in stages for part in per_stage)

    def build_supernet(
        self,
        largest: Architecture,
        *,
        input_shape: Sequence[int],
        num_classes: int,
        kernels: tuple[int, ...] = (),
        transforms: bool = False,
    ) -> nn.Module:
        """The supernet module at ``largest``'s sizes (search_spaces._mobilenet_super)."""
        from search_spaces._mobilenet_super import MobileNetSupernet

        spec = self.network(largest, input_shape=input_shape, num_classes=num_classes)
        return MobileNetSupernet(**spec.kwargs, kernels=kernels, transforms=transforms)

    def references(self) -> list[str]:
        return sorted(_REFERENCES)

    def reference(self, name: str) -> Architecture:
        return self._reference(name, _REFERENCES)
