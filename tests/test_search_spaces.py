"""The four architecture spaces: published references, input sizes, budgets, canonical forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autosearch import BudgetError, InvalidArchitectureError, UnknownNameError
from autosearch.scoring.cost import measure
from search_spaces import (
    DenseNetSpace,
    HyperparameterSpace,
    MobileNetSpace,
    NB201Space,
    ResNetSpace,
)

CIFAR, IMAGENET = (3, 32, 32), (3, 224, 224)

# name, space, input, classes, exact params (or None), published MACs, relative tolerance.
# Params: He et al. 2016 (CIFAR, option-A shortcuts) and torchvision (ImageNet). MACs: conv
# and linear multiply-accumulates; ResNet-20 40.8 M, ResNet-56 125.49 M, ResNet-110 252.89 M
# as in the pruning literature; torchvision's "GFLOPS" column for ImageNet models (MACs).
REFERENCES = [
    ("resnet20", ResNetSpace, CIFAR, 10, 269_722, 40.8e6, 0.01),
    ("resnet56", ResNetSpace, CIFAR, 10, 853_018, 125.49e6, 0.001),
    ("resnet110", ResNetSpace, CIFAR, 10, 1_727_962, 252.89e6, 0.001),
    ("resnet18", ResNetSpace, IMAGENET, 1000, 11_689_512, 1.81e9, 0.01),
    ("resnet34", ResNetSpace, IMAGENET, 1000, 21_797_672, 3.66e9, 0.01),
    ("resnet50", ResNetSpace, IMAGENET, 1000, 25_557_032, 4.09e9, 0.01),
    ("densenet121", DenseNetSpace, IMAGENET, 1000, 7_978_856, 2.83e9, 0.01),
    ("mobilenetv2", MobileNetSpace, IMAGENET, 1000, 3_504_872, 300e6, 0.01),
]


@pytest.mark.parametrize(
    ("name", "space_cls", "shape", "classes", "params", "macs", "tol"),
    REFERENCES,
    ids=[r[0] for r in REFERENCES],
)
def test_reference_matches_published_figures(name, space_cls, shape, classes, params, macs, tol):
    space = space_cls()
    assert name in space.references()
    cost = space.cost(space.reference(name), input_shape=shape, num_classes=classes)
    assert cost.params == params
    assert cost.macs == pytest.approx(macs, rel=tol)


def test_densenet_bc_100_has_the_papers_0_8_m_parameters():
    space = DenseNetSpace()
    arch = space.reference("densenet_bc_100_k12")
    cost = space.cost(arch, input_shape=CIFAR, num_classes=10)
    # Huang et al. 2017, Table 2: DenseNet-BC (L = 100, k = 12) has 0.8 M parameters.
    assert cost.params == 769_162 and round(cost.params / 1e6, 1) == 0.8
    # 100 layers: 3 blocks × 16 bottleneck layers × 2 convs + 2 transitions + stem + head.
    model = space.build(arch, input_shape=CIFAR, num_classes=10)
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    assert convs + 1 == 100


def test_mobilenetv2_cifar_is_torchvisions_network_at_cifar_strides():
    space = MobileNetSpace()
    imagenet = space.reference("mobilenetv2")
    cifar = space.reference("mobilenetv2_cifar")
    changed = {g for g in imagenet if imagenet[g] != cifar[g]}
    assert changed == {"stem.stride", "stage2.stride"}
    cost = space.cost(cifar, input_shape=CIFAR, num_classes=10)
    # torchvision's 3,504,872 with a 10-class head instead of 1000: − 1280·990 − 990.
    assert cost.params == 3_504_872 - 1280 * 990 - 990
    assert cost.macs == pytest.approx(0.09e9, rel=0.03)  # published as 0.09 G MACs


def test_nb201_matches_the_benchmarks_published_cost():
    space = NB201Space()
    text = (
        "|avg_pool_3x3~0|+|nor_conv_1x1~0|skip_connect~1|+"
        "|nor_conv_1x1~0|skip_connect~1|skip_connect~2|"
    )
    arch = space.from_string(text)
    assert space.to_string(arch) == text
    cost = space.cost(arch, input_shape=CIFAR, num_classes=10)
    assert cost.params == 129_306  # 0.129306 M
    # NAS-Bench-201 counts the classifier's 10 bias additions too: 15.64737 M.
    assert cost.macs + 10 == 15_647_370


SPACES = {
    "resnet": ResNetSpace(max_flops=40e6),
    "densenet": DenseNetSpace(max_flops=40e6),
    "mobilenet": MobileNetSpace(max_flops=40e6),
    "nb201": NB201Space(),
}
SIZES = [(1, 8, 8), (1, 28, 28), CIFAR, IMAGENET]


@pytest.mark.parametrize("name", SPACES)
def test_random_samples_build_and_run_at_every_input_size(name):
    space = SPACES[name]
    rng = np.random.default_rng(0)
    for arch in (space.sample(rng) for _ in range(2)):
        for shape in SIZES:
            model = space.build(arch, input_shape=shape, num_classes=7).eval()
            with torch.no_grad():
                out = model(torch.randn(1, *shape))
            assert out.shape == (1, 7) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", SPACES)
def test_analytic_cost_equals_flop_counter(name):
    space = SPACES[name]
    rng = np.random.default_rng(1)
    archs = [space.sample(rng) for _ in range(6)]
    archs += [
        space.reference(r)
        for r in space.references()
        if space.cost(space.reference(r)).params < 3e6
    ]
    for arch in archs:
        for shape in SIZES[:3]:
            analytic = space.cost(arch, input_shape=shape, num_classes=10)
            counted = measure(space.build(arch, input_shape=shape, num_classes=10), shape)
            assert analytic == counted, space.describe(arch)


def test_budget_is_met_by_sampling_and_mutation_and_explained_when_impossible():
    space = ResNetSpace(max_flops=60e6, max_params=1_000_000)
    rng = np.random.default_rng(0)
    for _ in range(10):
        arch = space.sample(rng)
        assert space.within_budget(arch)
        child = space.mutate(arch, rng)
        assert child != arch and space.within_budget(child)
    with pytest.raises(BudgetError, match="over the budget"):
        space.check_budget(space.reference("resnet56"))
    impossible = ResNetSpace(max_params=10, depths=(2,), widths=(64,))
    with pytest.raises(BudgetError, match="Loosen the budget"):
        impossible.sample(rng)


def test_budget_checks_use_the_analytic_cost_models():
    # Budget checks stay fast (benchmarks/spaces.py measures them) because they never
    # build a network: every built-in space has an
    # analytic cost model for every architecture. Assert that, not a time.
    space = ResNetSpace()
    for i in range(20):
        arch = space.canonicalize(space.sample(np.random.default_rng(i)))
        assert space.cost_model(arch, CIFAR, 10) is not None


def test_inactive_genes_are_reset_so_equal_networks_share_an_id():
    space = ResNetSpace()
    arch = space.reference("resnet20")  # 3 of 4 stages
    other = space.make({**arch, "stage4.depth": 9, "stage4.width": 512})
    assert other == arch and other.arch_id == arch.arch_id
    same_shape = ResNetSpace(max_stages=1, stem_widths=(16,), widths=(16,))
    a = same_shape.make({**same_shape.default(), "stage1.stride": 1, "shortcut": "pad"})
    assert a["shortcut"] == "projection"  # no block changes shape: shortcut is moot
    dense = DenseNetSpace()
    one = dense.make({**dense.default(), "blocks": 1, "compression": 1.0})
    assert one["compression"] == 0.5 and "theta" not in dense.describe(one)
    mobile = MobileNetSpace()
    ds = mobile.make({**mobile.reference("mobilenetv2"), "stage3.block": "ds"})
    assert ds == mobile.make({**ds, "stage3.expansion": 3})


def test_validate_rejects_shrinking_to_nothing_and_names_the_gene():
    dense = DenseNetSpace(stem="imagenet")
    arch = dense.reference("densenet121")
    with pytest.raises(InvalidArchitectureError, match="gene 'blocks' = 4.*at most 2 blocks"):
        dense.validate(arch, input_shape=(1, 8, 8))
    dense.validate(arch, input_shape=IMAGENET)
    with pytest.raises(InvalidArchitectureError, match="gene 'blocks'"):
        dense.build(arch, input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(InvalidArchitectureError, match="even feature map"):
        NB201Space().validate(NB201Space().default(), input_shape=(1, 7, 7))


def test_nb201_string_errors_say_what_is_expected():
    space = NB201Space()
    for bad, match in [
        ("|nor_conv_3x3~0|", "has 1 nodes, expected 3"),
        ("|a~0|+|b~0|+|c~0|d~1|e~2|", "node 2 .* has 1 edges, expected 2"),
        ("|none~1|+|none~0|none~1|+|none~0|none~1|none~2|", "should come from node 0"),
        ("|conv~0|+|none~0|none~1|+|none~0|none~1|none~2|", "'node1.in0' = 'conv'"),
    ]:
        with pytest.raises(InvalidArchitectureError, match=match):
            space.from_string(bad)
    assert space.size() == 5**6


def test_unknown_reference_and_one_outside_the_space():
    with pytest.raises(UnknownNameError, match="Did you mean .*'resnet50'"):
        ResNetSpace().reference("resnet5O")
    with pytest.raises(InvalidArchitectureError, match="does not fit this ResNetSpace"):
        ResNetSpace(depths=(1, 2, 3)).reference("resnet110")


def test_hyperparameters_ride_along_and_the_trainer_applies_them(digits, monkeypatch):
    from autosearch import TrainConfig
    from autosearch.evaluation import runner

    space = HyperparameterSpace(
        space=NB201Space(channels=4, cells=1),
        lr=(0.2,),
        batch_size=(100,),
        optimizer=("adamw",),
        weight_decay=(),
    )
    arch = space.sample(np.random.default_rng(0))
    assert {"hp.lr", "hp.batch_size", "hp.optimizer", "hp.label_smoothing"} <= set(arch)
    assert "hp.weight_decay" not in arch
    seen = []

    def spy(model, data, config, **kwargs):
        seen.append(config)
        raise RuntimeError("stop after capturing the config")

    monkeypatch.setattr(runner, "train", spy)
    with pytest.raises(RuntimeError):
        plan = runner.TrialPlan(space=space, arch=arch, train=TrainConfig(lr=0.01, batch_size=32))
        runner.train_candidate(plan, digits)
    assert (seen[0].lr, seen[0].batch_size, seen[0].optimizer) == (0.2, 100, "adamw")
    assert seen[0].weight_decay == TrainConfig().weight_decay  # not searched: the study's
    assert space.describe(arch).endswith("adamw") or "adamw" in space.describe(arch)
    rebuilt = HyperparameterSpace(**space.config())
    assert rebuilt == space and rebuilt.reference  # config round trip rebuilds the inner space


# Property tests --------------------------------------------------------------------------
ALL = [
    ResNetSpace(),
    DenseNetSpace(),
    MobileNetSpace(),
    NB201Space(),
    HyperparameterSpace(space=NB201Space()),
]


@settings(max_examples=40, deadline=None)
@given(index=st.integers(0, len(ALL) - 1), seed=st.integers(0, 2**32 - 1))
def test_sample_mutate_canonicalize_and_json_properties(index, seed):
    from autosearch import Architecture

    space = ALL[index]
    rng = np.random.default_rng(seed)
    arch = space.sample(rng)
    assert space.canonicalize(arch) == arch  # canonical, and canonicalize is idempotent
    assert space.canonicalize(space.canonicalize(arch)) == arch
    again = Architecture.from_json(arch.to_json())
    assert again == arch and again.arch_id == arch.arch_id
    child = space.mutate(arch, rng)
    assert child != arch and space.canonicalize(child) == child
    assert space.encode(arch).shape == space.encode(child).shape == (len(space.domains()),)
