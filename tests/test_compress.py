"""Compressed variants, their measurement, rewards, and studies that store them."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autosearch
from autosearch import AutosearchError, Compression, TrainConfig, UnknownNameError
from autosearch.compress import derive, distillation_loss, parse_variant, parse_variants
from autosearch.compress._channels import prune_channels
from autosearch.compress._quantize import int8_ops
from autosearch.data import load_data
from autosearch.evaluation.runner import profile
from autosearch.scoring import parse_reward, resolve_reward, reward
from autosearch.scoring.cost import latency, layer_macs, measure, saved_bytes, sparse_macs
from autosearch.scoring.pareto import pareto_mask
from autosearch.study.records import result_facts
from autosearch.training.train import evaluate, train
from controllers import RandomSearch
from search_spaces import DenseNetSpace, MobileNetSpace, ResNetSpace

SHAPE = (1, 8, 8)
FAST = TrainConfig(epochs=3, batch_size=64, lr=0.05)


@pytest.fixture(scope="module")
def digits():
    return load_data("digits", seed=0)


@pytest.fixture(scope="module")
def trained(digits):
    """A small ResNet with zero-padding shortcuts, trained for a few epochs."""
    space = ResNetSpace()
    defaults = {gene: domain.default for gene, domain in space.domains().items()}
    arch = space.make(
        {
            **defaults,
            "block": "basic",
            "shortcut": "pad",
            "stem.width": 16,
            "stages": 2,
            "stage1.depth": 1,
            "stage1.width": 16,
            "stage1.stride": 1,
            "stage2.depth": 1,
            "stage2.width": 32,
            "stage2.stride": 2,
        }
    )
    torch.manual_seed(0)
    model = space.build(arch, input_shape=digits.input_shape, num_classes=digits.num_classes)
    train(model, digits, FAST, seed=0)
    return model.eval()


# Cost ------------------------------------------------------------------------------------
def test_sparse_macs_follow_planted_masks():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),  # 8·1·9 weights × 64 positions = 4608 MACs
        nn.ReLU(),
        nn.Conv2d(8, 4, 1),  # 4·8 × 64 = 2048 MACs
        nn.Flatten(),
        nn.Linear(4 * 64, 10),  # 2560 MACs
    )
    assert layer_macs(model, SHAPE) == {"0": 4608, "2": 2048, "4": 2560}
    assert sum(layer_macs(model, SHAPE).values()) == measure(model, SHAPE).macs
    with torch.no_grad():
        model[0].weight.view(-1)[:18] = 0  # a quarter of 72
        model[2].weight.zero_()
        model[4].weight.view(-1)[::2] = 0  # half
    assert sparse_macs(model, SHAPE) == 4608 * 3 // 4 + 0 + 2560 // 2
    assert measure(model, SHAPE).macs == 4608 + 2048 + 2560  # dense count unchanged


def test_latency_is_measured_in_eval_mode_and_leaves_the_model_as_it_was(trained):
    model = copy.deepcopy(trained).train()
    stats = {k: v.clone() for k, v in model.state_dict().items()}
    ms = latency(model, SHAPE, batch=1, repeats=3, min_seconds=0.001)
    assert ms > 0 and model.training
    for key, value in model.state_dict().items():  # batch-norm statistics untouched
        assert torch.equal(value, stats[key]), key


def test_the_latency_sample_length_is_read_from_the_environment_and_checked(trained, monkeypatch):
    from autosearch.scoring.cost import sample_seconds

    monkeypatch.setenv("AUTOSEARCH_LATENCY_SAMPLE_SECONDS", "0.02")
    assert sample_seconds() == 0.02
    monkeypatch.delenv("AUTOSEARCH_LATENCY_SAMPLE_SECONDS")
    assert sample_seconds() == 0.05
    for bad in ("fast", "0", "-1", "nan", "inf"):
        monkeypatch.setenv("AUTOSEARCH_LATENCY_SAMPLE_SECONDS", bad)
        with pytest.raises(autosearch.ConfigError, match="expected seconds > 0"):
            latency(trained, SHAPE)


def test_profile_reports_every_cost(trained, digits):
    from autosearch.compress import Derived

    metrics = profile(Derived(model=trained, float_model=trained), digits)
    cost = measure(trained, SHAPE)
    assert metrics["macs"] == cost.macs and metrics["flops"] == 2 * cost.macs
    assert metrics["bops"] == cost.macs * 32 * 32
    assert metrics["bytes"] == saved_bytes(trained) > 4 * cost.params
    assert metrics["latency"] > 0 and metrics["latency_batched"] > 0


# Variants --------------------------------------------------------------------------------
def test_variant_names_parse_and_bad_ones_say_what_to_write():
    assert parse_variant("prune-channels@0.5").amount == 0.5
    assert parse_variant("int8").name == "int8"
    assert [v.name for v in parse_variants(["int8", "prune-l1@0.25"])] == [
        "base",
        "int8",
        "prune-l1@0.25",
    ]
    with pytest.raises(UnknownNameError, match="int8"):
        parse_variant("in8")
    with pytest.raises(AutosearchError, match=r"between 0 and 1.*prune-l1@0.5"):
        parse_variant("prune-l1@1.5")
    with pytest.raises(AutosearchError, match="takes no"):
        parse_variant("int8@4")
    with pytest.raises(AutosearchError, match="distinct"):
        parse_variants(["int8", "int8"])


def test_unstructured_pruning_reaches_its_sparsity_and_keeps_zeros(trained, digits):
    derived = derive("prune-l1@0.6", trained, digits, FAST, seed=0)
    assert derived.details["sparsity"] == pytest.approx(0.6, abs=0.01)
    dense = measure(trained, SHAPE).macs
    assert sparse_macs(derived.model, SHAPE) == pytest.approx(0.4 * dense, rel=0.05)
    assert not any(hasattr(m, "weight_mask") for m in derived.model.modules())  # baked in
    base = evaluate(trained, digits.val, digits)[0]
    assert evaluate(derived.model, digits.val, digits)[0] > base - 0.1, base


@pytest.mark.parametrize("space_cls", [ResNetSpace, DenseNetSpace, MobileNetSpace])
def test_channel_pruning_makes_smaller_well_formed_networks(space_cls):
    space = space_cls()
    for seed in range(4):
        arch = space.sample(np.random.default_rng(seed))
        model = space.build(arch, input_shape=SHAPE, num_classes=10).eval()
        before = measure(model, SHAPE)
        pruned = prune_channels(model, SHAPE, ratio=0.5)
        after = measure(pruned, SHAPE)
        out = pruned(torch.randn(5, *SHAPE))
        assert out.shape == (5, 10) and torch.isfinite(out).all()
        assert after.macs * 2 <= before.macs, space.describe(arch)
        assert after.params < before.params


def test_zero_padding_shortcut_becomes_an_equivalent_convolution():
    from search_spaces._resnet_net import PadShortcut

    shortcut = PadShortcut(4, 10, 2)
    x = torch.randn(3, 4, 8, 8)
    assert torch.equal(shortcut.to_prunable()(x), shortcut(x))


def test_distillation_loss_matches_its_formula():
    torch.manual_seed(0)
    s, t, y = torch.randn(6, 5), torch.randn(6, 5), torch.randint(0, 5, (6,))
    temp, alpha = 3.0, 0.7
    p_t = torch.softmax(t / temp, 1)
    kl = (p_t * (p_t.log() - torch.log_softmax(s / temp, 1))).sum(1).mean()
    expected = alpha * temp**2 * kl + (1 - alpha) * F.cross_entropy(s, y)
    got = distillation_loss(s, t, y, temperature=temp, alpha=alpha)
    assert got.item() == pytest.approx(expected.item(), rel=1e-6)
    # A student that equals its teacher pays only the hard term.
    same = distillation_loss(s, s, y, temperature=temp, alpha=alpha)
    assert same.item() == pytest.approx((1 - alpha) * F.cross_entropy(s, y).item(), rel=1e-5)


def test_int8_runs_quantized_kernels_within_tolerance(trained, digits):
    derived = derive("int8", trained, digits, FAST, seed=0)
    ops = int8_ops(derived.model)
    assert any("qconv" in op for op in ops), ops
    assert derived.weight_bits == derived.activation_bits == 8
    float_acc = evaluate(trained, digits.val, digits)[0]
    int8_acc = evaluate(derived.model, digits.val, digits)[0]
    assert abs(float_acc - int8_acc) <= 0.02, (float_acc, int8_acc)
    assert derived.saved_bytes is not None and derived.saved_bytes < saved_bytes(trained) / 2
    # Batch sizes other than the calibration's run through the same program.
    assert derived.model(torch.zeros(1, *SHAPE)).shape == (1, 10)
    assert derived.model(torch.zeros(7, *SHAPE)).shape == (7, 10)


@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)`:FutureWarning")
def test_the_converted_graph_lowers_to_torchaos_program_without_strict_tracing(
    trained, digits, monkeypatch
):
    """The converted graph is exported again without torch's compiler tracing it (faster
    than torchao's strict export): the same program, but for the order it reads its
    attributes in, and the same logits to the bit."""
    from autosearch.compress import _quantize

    derived = derive("int8", trained, digits, FAST, seed=0)
    example = torch.zeros(2, *SHAPE)
    ours = _quantize._lower(copy.deepcopy(derived.reference), example)
    export = torch.export.export
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: export(*a, **{**k, "strict": True}))
    theirs = _quantize._lower(copy.deepcopy(derived.reference), example)
    assert sorted(ours.code.splitlines()) == sorted(theirs.code.splitlines())
    images = digits.normalize(digits.val.take(torch.arange(64))).float()
    with torch.no_grad():
        assert torch.equal(ours(images), theirs(images))


@pytest.mark.slow
def test_int8_handles_a_batchnorm_after_a_shared_convolution(digits):
    """DenseNet: the stem's conv feeds a concatenation and a BatchNorm; PT2E would fold
    the BatchNorm into it and corrupt the concatenated branch."""
    from search_spaces._densenet_net import DenseNet

    torch.manual_seed(0)
    model = DenseNet(
        in_channels=1,
        num_classes=10,
        stem="cifar",
        stem_width=8,
        growth=8,
        blocks=[2, 2],
        bottleneck=False,
        compression=0.5,
    )
    train(model, digits, TrainConfig(epochs=1, batch_size=64), seed=0)
    derived = derive("int8", model.eval(), digits, FAST, seed=0)
    assert derived.details["float_gap"] < 1e-3
    agree = (
        (derived.model(digits.normalize(digits.val.x)).argmax(1))
        == model(digits.normalize(digits.val.x)).argmax(1)
    ).float()
    assert agree.mean() > 0.9


def test_an_int8_program_with_a_projection_shortcut_evaluates_the_same_every_time(digits):
    """oneDNN's int8 convolution with a fused residual sum whose other input is a
    convolution's (a projection shortcut) gave logits a quantization step apart from
    call to call on two threads; a point measured again got another accuracy. Evaluated
    on one thread, its accuracy and loss repeat to the bit (the caller's threads kept)."""
    from search_spaces._resnet_net import BasicBlock

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        BasicBlock(8, 8, stride=2, shortcut="projection"),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )
    train(model, digits, TrainConfig(epochs=1, batch_size=64), seed=0)
    derived = derive("int8", model.eval(), digits, FAST, seed=0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        figures = {evaluate(derived.model, digits.val, digits) for _ in range(5)}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert len(figures) == 1, figures


@pytest.mark.slow
def test_qat_and_distillation_variants_train_and_stay_accurate(trained, digits):
    compression = Compression(finetune_epochs=1)
    qat = derive("qat-int8", trained, digits, FAST, compression=compression, seed=0)
    assert int8_ops(qat.model)
    distilled = derive("distill", trained, digits, FAST, compression=compression, seed=0)
    base_acc = evaluate(trained, digits.val, digits)[0]
    for variant in (qat, distilled):
        assert evaluate(variant.model, digits.val, digits)[0] >= base_acc - 0.03
    assert any(
        not torch.equal(a, b)
        for a, b in zip(distilled.model.parameters(), trained.parameters(), strict=True)
    )


# Rewards ---------------------------------------------------------------------------------
def test_rewards_follow_their_formulas():
    m = {"accuracy": 0.9, "flops": 2e6, "macs": 1e6, "latency": 0.5}
    assert reward("accuracy", m) == 0.9
    assert reward("accuracy-per-gflop", m) == pytest.approx(0.9 / 2e-3)
    assert reward("mnas@flops=1e6", m) == pytest.approx(0.9 * 2.0**-0.07)
    assert reward("mnas@latency=1,w=-0.5", m) == pytest.approx(0.9 * 0.5**-0.5)
    assert reward("hard@macs=1e6", m) == 0.9 and reward("hard@macs=5e5", m) == 0.0
    assert str(parse_reward("mnas@flops=5e6")) == "mnas@flops=5e+06,w=-0.07"
    with pytest.raises(UnknownNameError, match="mnas"):
        parse_reward("mnsa")
    with pytest.raises(AutosearchError, match="one cost target"):
        parse_reward("mnas@speed=3")
    with pytest.raises(AutosearchError, match="needs a target"):
        resolve_reward("mnas@latency", lambda metric: None)


def test_the_plain_ratio_favours_useless_tiny_networks_and_mnas_does_not():
    useful = {"accuracy": 0.98, "flops": 5e6}
    useless = {"accuracy": 0.10, "flops": 1e3}  # guesses
    assert reward("accuracy-per-gflop", useless) > reward("accuracy-per-gflop", useful)
    assert reward("mnas@flops=5e6", useful) > reward("mnas@flops=5e6", useless)


# Studies ---------------------------------------------------------------------------------
def _study(tmp_path, name, **options):
    space = ResNetSpace(max_flops=2e6, budget_input=SHAPE)
    return autosearch.create_study(
        name,
        controller=RandomSearch(space, seed=0),
        train=TrainConfig(epochs=2, batch_size=64),
        storage=f"sqlite:///{tmp_path}/{name}.db",
        **options,
    )


@pytest.mark.slow
def test_a_study_stores_plots_and_ranks_every_variant(tmp_path):
    study = _study(
        tmp_path,
        "variants",
        variants=("base", "prune-channels@0.5", "int8"),
        objectives=("accuracy", "macs"),
        compression=Compression(finetune_epochs=1, estimate=False),
    )
    assert str(study.definition.reward) == "mnas@flops=2e+06,w=-0.07"  # the space's budget
    study.optimize(3)
    records = study.records()
    assert len(records) == 9 and len(study.records(variants=False)) == 3
    for trial in range(3):
        by_variant = {r.variant: r for r in records if r.trial == trial}
        assert set(by_variant) == {"base", "prune-channels@0.5", "int8"}
        for r in by_variant.values():
            assert r.state == "complete", r.reason
            for key in ("accuracy", "test_accuracy", "macs", "latency", "bytes", "reward"):
                assert math.isfinite(r.metrics[key]), (r.variant, key)
        base, pruned = by_variant["base"], by_variant["prune-channels@0.5"]
        assert pruned.metrics["macs"] * 2 <= base.metrics["macs"]
        assert by_variant["int8"].metrics["bops"] * 16 == base.metrics["bops"]
        # The candidate is ranked (and its Optuna values set) by its best variant.
        best = max(by_variant.values(), key=lambda r: r.metrics["reward"])
        trial_values = study.optuna_study.trials[trial].values
        assert trial_values == [best.metrics["accuracy"], best.metrics["macs"]]
    # The front is the non-dominated set of every (architecture, variant) point.
    done = [r for r in records if r.state == "complete"]
    values = np.array([[r.metrics["accuracy"], r.metrics["macs"]] for r in done])
    mask = pareto_mask(values, ["maximize", "minimize"])
    expected = {(r.trial, r.variant) for r, keep in zip(done, mask, strict=True) if keep}
    assert {(r.trial, r.variant) for r in study.pareto()} == expected
    figure = autosearch.report.plots.pareto(study, x="macs")
    names = {trace.name for trace in figure.data}
    assert {"variant of", "Pareto front"} <= names
    links = next(t for t in figure.data if t.name == "variant of")
    assert sum(v is None for v in links.x) == 6  # one segment per variant
    with pytest.raises(autosearch.ExportError, match="derive it again"):
        study.load_model(next(r for r in records if r.variant == "int8"))
    again = autosearch.load_study("variants", storage=study.storage_url)
    assert [v.name for v in again.definition.variants] == ["base", "prune-channels@0.5", "int8"]
    assert len(again.records()) == 9


def test_a_failing_variant_is_recorded_and_the_study_goes_on(tmp_path, monkeypatch):
    import autosearch.compress as compress

    def broken(job):
        raise RuntimeError("no kernel for this layer")

    monkeypatch.setitem(compress._DERIVERS, "prune-l1", broken)
    study = _study(tmp_path, "broken", variants=("base", "prune-l1@0.5"))
    study.optimize(2)
    failed = [r for r in study.records() if r.variant == "prune-l1@0.5"]
    assert len(failed) == 2 and all(r.state == "failed" for r in failed)
    assert "no kernel for this layer" in failed[0].reason
    assert study.trials.count("complete") == 2  # the candidates themselves are complete


def test_only_front_skips_dominated_candidates(tmp_path):
    study = _study(
        tmp_path,
        "front",
        variants=("base", "prune-l1@0.5"),
        compression=Compression(finetune_epochs=1, only_front=True),
    )
    study.optimize(4)
    facts = {t.number: result_facts(t) for t in study.optuna_study.trials}
    skipped = [n for n, f in facts.items() if "only_front" in f["note"]]
    derived = sorted({r.trial for r in study.records() if not r.is_base})
    assert 0 in derived and set(skipped) | set(derived) == {0, 1, 2, 3}
    bases = study.records(variants=False)
    for number in skipped:  # dominated by an earlier trial when it finished
        me = bases[number].metrics
        assert any(
            o.metrics["accuracy"] >= me["accuracy"] and o.metrics["flops"] <= me["flops"]
            for o in bases[:number]
        )


def test_bad_variants_and_rewards_change_nothing_stored(tmp_path):
    with pytest.raises(UnknownNameError, match="prune-channels"):
        _study(tmp_path, "bad", variants=("prune-chanels@0.5",))
    with pytest.raises(AutosearchError, match="needs a target"):
        _study(tmp_path, "bad", reward="mnas@latency")
    assert not (tmp_path / "bad.db").exists()


def test_importing_torchao_for_int8_prints_no_known_noise():
    """torchao's CUDA-extension, Triton and pytree warnings are silenced (only those)."""
    import subprocess
    import sys

    code = (
        "import logging, autosearch.compress._quantize\n"
        "import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer, torchao.kernel.intmm\n"
        "logging.getLogger('torchao').warning('another torchao warning')\n"
    )
    err = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=1800, check=True
    ).stderr
    assert "Failed to load" not in err and "no triton" not in err and "Enum subclass" not in err
    assert "another torchao warning" in err
