"""NNI interop: NNI 3 model spaces as autosearch spaces, cost cross-checked with NNI's
own counter, and an NNI space searched as an autosearch study from the CLI."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("nni", reason="NNI is an optional extra: pip install 'autosearch-nas[nni]'")

import autosearch
from autosearch.errors import ConfigError, InvalidArchitectureError
from autosearch.registry import spaces
from autosearch.scoring.cost import measure
from search_spaces import NNISpace, from_nni


def test_hub_spaces_become_search_spaces():
    from nni.nas.hub.pytorch import MobileNetV3Space, NasBench201

    nb201 = from_nni(NasBench201)
    assert nb201.factory == "nni.nas.hub.pytorch.nasbench201:NasBench201"
    assert len(nb201.domains()) == 6 and nb201.size() == 5**6  # six edges, five operations
    assert set(nb201.domains()["cell/0_1"].values()) == {
        "none",
        "skip_connect",
        "conv_1x1",
        "conv_3x3",
        "avg_pool_3x3",
    }
    arch = nb201.sample(np.random.default_rng(0))
    model = nb201.build(arch, input_shape=(3, 32, 32), num_classes=10).eval()
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    # Stored studies rebuild the space from its configuration.
    again = spaces.get("nni")(**json.loads(json.dumps(nb201.config())))
    assert again.domains() == nb201.domains() and again.make(dict(arch)) == arch

    mobile = from_nni(MobileNetV3Space)
    assert len(mobile.domains()) > 50  # widths, kernel sizes, expansions, depths (Repeat)
    arch = mobile.sample(np.random.default_rng(1))
    assert mobile.build(arch, input_shape=(3, 64, 64), num_classes=7).eval()(
        torch.zeros(1, 3, 64, 64)
    ).shape == (1, 7)  # the classes reach NNI's num_labels


@pytest.mark.parametrize(
    ("factory", "kwargs", "shape"),
    [  # NB201 with 2 cells per stack: its cell, stems and reductions, counted faster
        ("nni.nas.hub.pytorch:NasBench201", {"num_modules_per_stack": 2}, (3, 32, 32)),
        ("nni.nas.hub.pytorch:MobileNetV3Space", {}, (3, 224, 224)),
        ("search_spaces.nni_examples:SmallCNN", {}, (1, 8, 8)),
    ],
)
def test_macs_agree_with_nnis_counter(factory, kwargs, shape):
    from nni.compression.utils.counter import count_flops_params

    space = from_nni(factory, **kwargs)
    rng = np.random.default_rng(0)
    for arch in (space.default(), space.sample(rng), space.sample(rng)):
        model = space.build(arch, input_shape=shape, num_classes=10).eval()
        ours = measure(model, shape)
        nni_macs, nni_params, _ = count_flops_params(model, torch.zeros(1, *shape), verbose=False)
        assert ours.macs == nni_macs  # NNI's "flops" are multiply-accumulates
        assert ours.flops == 2 * nni_macs
        # NNI leaves batch-norm parameters out of its count; autosearch counts them.
        bn = sum(
            p.numel()
            for m in model.modules()
            if isinstance(m, torch.nn.BatchNorm2d)
            for p in m.parameters()
        )
        assert ours.params - bn == nni_params
        assert space.cost(arch, input_shape=shape, num_classes=10).macs == ours.macs


def test_an_nni_space_runs_as_a_study_from_the_cli(tmp_path, monkeypatch, capsys):
    from autosearch.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "nni_study.py").write_text(
        "from autosearch import StudySpec, TrainConfig\n"
        "from controllers import RegularizedEvolution\n"
        "from search_spaces import from_nni\n"
        "study = StudySpec(name='nni-cli', controller=RegularizedEvolution(\n"
        "    from_nni('search_spaces.nni_examples:SmallCNN'), seed=0, population=2, sample=2),\n"
        "    train=TrainConfig(epochs=2, batch_size=64, lr=0.1), n_trials=3)\n"
    )
    assert main(["run", "nni_study.py"]) == 0
    assert "Pareto front" in capsys.readouterr().out
    study = autosearch.load_study("nni-cli", storage="sqlite:///runs/nni-cli/study.db")
    records = study.records()
    assert len(records) == 3 and all(r.state == "complete" for r in records)
    assert all(r.metrics["accuracy"] > 0.1 for r in records)
    assert isinstance(study.space, NNISpace)
    # The export rebuilds the frozen NNI network (needs NNI) and matches the stored one.
    out = study.export(study.best(), tmp_path / "export")
    assert json.loads((out / "arch.json").read_text())["onnx"]["max_abs_diff"] < 1e-4


def test_the_shipped_study_file_names_an_nni_space():
    from autosearch.studyfile import load_spec

    spec = load_spec("studies/nni_small_cnn.py")
    assert spec.name == "nni-small-cnn" and spec.controller.space.name == "nni"


def test_without_nni_the_error_says_how_to_install(monkeypatch):
    for name in [m for m in sys.modules if m == "nni" or m.startswith("nni.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "nni", None)  # import nni now fails
    with pytest.raises(ImportError, match=r"pip install 'autosearch-nas\[nni\]'"):
        from_nni("nni.nas.hub.pytorch:NasBench201")


def test_the_small_cnn_written_both_ways_builds_the_same_networks():
    from search_spaces import SmallCNNSpace

    native, wrapped = SmallCNNSpace(), from_nni("search_spaces.nni_examples:SmallCNN")
    assert set(native.domains()) == set(wrapped.domains())
    rng = np.random.default_rng(0)
    for _ in range(8):
        genes = dict(wrapped.sample(rng))
        ours = native.build(native.make(genes), input_shape=(1, 8, 8), num_classes=10)
        theirs = wrapped.build(wrapped.make(genes), input_shape=(1, 8, 8), num_classes=10)
        a, b = measure(ours, (1, 8, 8)), measure(theirs, (1, 8, 8))
        assert (a.macs, a.params) == (b.macs, b.params), genes
        # Same parameter shapes in the same order: the same network.
        assert [p.shape for p in ours.parameters()] == [p.shape for p in theirs.parameters()]


def test_from_nni_takes_an_instance_as_nni_users_write_it():
    from nni.nas.hub.pytorch import NasBench201

    assert from_nni(NasBench201()) == from_nni(NasBench201)
    assert from_nni(NasBench201(stem_out_channels=8)).kwargs == {"stem_out_channels": 8}
    with pytest.raises(ConfigError, match=r"takes an NNI ModelSpace class .* an instance"):
        from_nni(42)


def test_a_space_without_in_channels_says_it_wants_rgb_images():
    from nni.nas.hub.pytorch import NasBench201

    space = from_nni(NasBench201)
    with pytest.raises(InvalidArchitectureError, match="takes no in_channels argument"):
        space.check_input(space.default(), (1, 8, 8))
