"""The stem choice shared by spaces whose networks have a CIFAR and an ImageNet stem."""

from __future__ import annotations

from collections.abc import Sequence

from autosearch.scoring.cost import Tally

# Below this size a 7×7/2 convolution and a 3×3/2 max-pool throw away most of the image.
IMAGENET_STEM_MIN_SIZE = 128
STEMS = ("auto", "cifar", "imagenet")


def choose_stem(stem: str, input_shape: Sequence[int]) -> str:
    """``"cifar"`` or ``"imagenet"``; ``"auto"`` picks ImageNet-style from 128 px up."""
    if stem != "auto":
        return stem
    return "imagenet" if min(input_shape[1:]) >= IMAGENET_STEM_MIN_SIZE else "cifar"


def tally_stem(tally: Tally, stem: str, width: int, *, cifar_bn: bool = True) -> Tally:
    """Count a stem: 7×7/2 conv-BN and 3×3/2 max-pool, or one 3×3 conv (with BN unless
    the network's first block normalises it, as DenseNet's does)."""
    if stem == "imagenet":
        return tally.conv(width, 7, 2).pool(3, 2, padding=1)
    return tally.conv(width, 3, bn=cifar_bn)
