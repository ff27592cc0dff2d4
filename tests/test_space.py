from __future__ import annotations

import numpy as np
import pytest
import torch

from autosearch import Categorical, IntRange, InvalidArchitectureError
from autosearch.scoring.cost import measure
from search_spaces import ResNetSpace


def test_domains():
    c = Categorical((1, 2, 3), default=2)
    assert c.contains(2) and not c.contains(True) and not c.contains("2")
    assert c.encode(1) == 0.0 and c.encode(3) == 1.0
    r = IntRange(2, 10, step=2)
    assert r.values() == (2, 4, 6, 8, 10) and r.contains(4) and not r.contains(5)
    rng = np.random.default_rng(0)
    assert all(r.contains(r.sample(rng)) for _ in range(50))
    with pytest.raises(ValueError):
        IntRange(3, 8, step=2)
    with pytest.raises(ValueError):
        Categorical(())


def test_validate_messages_name_gene_and_allowed_values():
    space = ResNetSpace()
    arch = space.default()
    with pytest.raises(
        InvalidArchitectureError, match=r"'stage1.depth' = 5 .* allowed: \{1, 2, 3, 4, 6, 9, 18\}"
    ):
        space.validate(arch.replace(**{"stage1.depth": 5}))
    with pytest.raises(InvalidArchitectureError, match="did you mean 'stage1.depth'"):
        space.validate(arch.replace(**{"stage1.dept": 2}))
    missing = {k: v for k, v in arch.items() if k != "block"}
    with pytest.raises(InvalidArchitectureError, match="lacks gene 'block'"):
        space.make(missing)


def test_mutation_exhaustion_is_bounded_and_explained():
    space = ResNetSpace(
        max_stages=1,
        depths=(1,),
        widths=(8,),
        stem_widths=(8,),
        blocks=("basic",),
        strides=(1,),
        shortcuts=("pad",),
    )
    with pytest.raises(InvalidArchitectureError, match="one point"):
        space.mutate(space.default(), np.random.default_rng(0))


def test_resnet_builds_the_network_its_genes_say():
    space = ResNetSpace(max_stages=2)
    arch = space.make(
        {
            "stem.width": 16,
            "block": "basic",
            "shortcut": "projection",
            "stages": 2,
            "stage1.depth": 2,
            "stage1.width": 16,
            "stage1.stride": 1,
            "stage2.depth": 1,
            "stage2.width": 32,
            "stage2.stride": 2,
        }
    )
    model = space.build(arch, input_shape=(3, 32, 32), num_classes=10)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    # stem + 2 blocks × 2 convs + 1 block × 2 convs + 1 projection shortcut
    assert len(convs) == 1 + 4 + 2 + 1
    cost = measure(model, (3, 32, 32))
    # MACs by hand: stem 3·16·9·32² ; stage1: 4 convs 16·16·9·32² ; stage2 conv1 16·32·9·16²,
    # conv2 32·32·9·16², shortcut 16·32·16² ; head 32·10.
    macs = (
        3 * 16 * 9 * 1024
        + 4 * 16 * 16 * 9 * 1024
        + 16 * 32 * 9 * 256
        + 32 * 32 * 9 * 256
        + 16 * 32 * 256
        + 32 * 10
    )
    assert cost.macs == macs and cost.flops == 2 * macs


def test_resnet_stem_follows_input_size():
    space = ResNetSpace(max_stages=1)
    big = space.network(space.default(), input_shape=(3, 224, 224), num_classes=5)
    small = space.network(space.default(), input_shape=(1, 8, 8), num_classes=5)
    assert big.kwargs["stem"] == "imagenet" and small.kwargs["stem"] == "cifar"
    out = big.build()(torch.zeros(1, 3, 224, 224))
    assert out.shape == (1, 5)


def test_bad_space_configuration_is_refused():
    with pytest.raises(ValueError, match="stem"):
        ResNetSpace(stem="vgg")
    with pytest.raises(ValueError, match="blocks"):
        ResNetSpace(blocks=("dense",))
