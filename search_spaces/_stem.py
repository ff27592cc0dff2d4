"""The stem choice shared by spaces whose networks have a CIFAR and an ImageNet stem."""

from __future__ import annotations

from collections.abc import Sequence

# Below this size a 7×7/2 convolution and a 3×3/2 max-pool throw away most of the image.
IMAGENET_STEM_MIN_SIZE = 128
STEMS = ("auto", "cifar", "imagenet")


def choose_stem(stem: str, input_shape: Sequence[int]) -> str:
    """``"cifar"`` or ``"imagenet"``; ``"auto"`` picks ImageNet-style from 128 px up."""
    if stem != "auto":
        return stem
    return "imagenet" if min(input_shape[1:]) >= IMAGENET_STEM_MIN_SIZE else "cifar"
