"""Weight sharing on NAS-Bench-201 (issue 46): a supernet that holds every operation of
every edge, trained by single-path rules (uniform, FairNAS's strict fairness), its
subnets the stand-alone networks of their cells, searched, saved, loaded and exported
as any supernet's; CIFAR-10's JPEG folder read with its own test split."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import autosearch
from autosearch import SupernetConfig, TrainConfig
from autosearch.data import load_data
from autosearch.weight_sharing.supernet import Sandwich
from controllers import RandomSearch
from search_spaces import NB201Space
from search_spaces._nb201_net import OPERATIONS

ROOT = Path(__file__).resolve().parents[1]
CIFAR = ROOT.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"


def _space(**options):
    return NB201Space(channels=4, cells=1, **options).supernet()


def _perturbed(net: torch.nn.Module) -> None:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in [*net.parameters(), *net.buffers()]:
            if tensor.is_floating_point():
                noise = torch.rand(tensor.shape, generator=generator)
                tensor.add_(0.1 * noise if tensor.dim() > 1 else 0.5 + noise)


def test_a_subnet_is_the_standalone_network_of_its_cell_with_the_same_weights():
    space = _space()
    net = space.build_supernet(input_shape=(3, 8, 8), num_classes=5)
    _perturbed(net)
    net.eval()
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    rng = np.random.default_rng(0)
    every = [space.make(dict.fromkeys(space.elastic, op)) for op in OPERATIONS]
    for arch in [*every, *(space.sample(rng) for _ in range(8))]:
        net.activate(arch)
        subnet = net.subnet(arch).eval()
        assert type(subnet).__name__ == "NB201Network"  # an ordinary network of the space
        standalone = NB201Space(channels=4, cells=1).build(
            space.full(arch), input_shape=(3, 8, 8), num_classes=5
        )
        standalone.load_state_dict(subnet.state_dict())  # the same cell, the same shapes
        with torch.no_grad():
            torch.testing.assert_close(subnet(x), net(x), rtol=0, atol=1e-6)
            torch.testing.assert_close(standalone.eval()(x), net(x), rtol=0, atol=1e-6)


def test_the_uniform_rule_draws_single_paths_uniformly_and_trains_them_on_the_labels():
    space = _space()
    net = space.build_supernet(input_shape=(3, 8, 8), num_classes=5)
    rule = Sandwich(net, space, SupernetConfig(schedule="uniform", paths=2), epochs=1)
    torch.manual_seed(0)
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    for _ in range(300):
        step = rule.step()
        assert len(step) == 2
        seen.update((g, a[g]) for a in step for g in space.elastic)
    for gene in space.elastic:  # each of 5 choices about a fifth of 600 draws
        counts = [seen[gene, op] for op in OPERATIONS]
        assert min(counts) > 85 and max(counts) < 155, (gene, counts)
    x, y = torch.randn(6, 3, 8, 8), torch.randint(0, 5, (6,))
    torch.manual_seed(1)
    outputs = rule.train()(x)
    loss = rule.loss(outputs, x, y)
    expected = sum(
        torch.nn.functional.cross_entropy(out, y) for out in outputs
    )  # every path on the labels, summed
    torch.testing.assert_close(loss, expected)


def test_the_fair_rule_trains_every_operation_of_every_edge_once_a_step():
    """FairNAS's strict fairness: each step's m subnets use each choice of every edge
    exactly once, so every operation (none included) is trained as often as any other,
    and every operation's weights get a gradient in every step."""
    space = _space()
    net = space.build_supernet(input_shape=(3, 8, 8), num_classes=5)
    rule = Sandwich(net, space, SupernetConfig(schedule="fair"), epochs=1)
    torch.manual_seed(0)
    for _ in range(20):
        step = rule.step()
        assert len(step) == len(OPERATIONS)
        for gene in space.elastic:
            assert sorted(a[gene] for a in step) == sorted(OPERATIONS)
    x, y = torch.randn(6, 3, 8, 8), torch.randint(0, 5, (6,))
    for _ in range(4):  # a subnet can leave an operation's node unused: over a few steps
        rule.loss(rule.train()(x), x, y).backward()
    mixed = [m for m in net.net.cells if type(m).__name__ == "_MixedCell"]
    for cell in mixed:
        for edge in (e for node in cell.edges for e in node):
            for op in ("nor_conv_1x1", "nor_conv_3x3"):
                grad = edge[op][1].weight.grad
                assert grad is not None and grad.abs().sum() > 0, op
    assert set(rule.trained[0].values()) <= set(OPERATIONS)


@pytest.mark.parametrize("rule", ["uniform", "fair"])
def test_an_nb201_supernet_study_searches_saves_imports_and_exports(rule, tmp_path, digits):
    study = autosearch.create_study(
        f"nb201-{rule}",
        controller=RandomSearch(_space(), seed=0),
        storage=f"sqlite:///{tmp_path}/s.db",
        train=TrainConfig(epochs=1, batch_size=128, lr=0.05),
        supernet=SupernetConfig(schedule=rule, latency=False, eval_images=200),
    )
    trained = study.supernet.train()
    assert trained["epochs"] == 1
    records = study.optimize(4)
    assert all(r.state == "complete" for r in records)
    weights = study.supernet.save(tmp_path / "nb201.safetensors")
    again = autosearch.create_study(
        f"nb201-{rule}-imported",
        controller=RandomSearch(_space(), seed=0),
        storage=f"sqlite:///{tmp_path}/s.db",
        train=TrainConfig(epochs=1, batch_size=128, lr=0.05),
        supernet=SupernetConfig(
            schedule=rule, latency=False, eval_images=200, weights=str(weights)
        ),
    )
    assert "imported_from" in again.supernet.train()
    first = records[0]
    _, scored = again.supernet.evaluator.evaluate(first.arch)
    assert scored["accuracy"] == first.metrics["accuracy"]  # the same weights, the same score
    out = study.export(study.best(), tmp_path / "export")
    card = json.loads((out / "arch.json").read_text())
    assert NB201Space(channels=4, cells=1).from_string(card["description"])  # the benchmark's key
    assert (out / "model.py").is_file() and (out / "model.safetensors").is_file()


def _folder(root: Path, split: str, per_class: int, seed: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    for name in ("cat", "dog", "ship"):
        folder = root / split / name
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.png")


@pytest.mark.parametrize("stream", [False, True])
def test_a_folder_of_train_and_test_keeps_its_own_test_split(tmp_path, monkeypatch, stream):
    """CIFAR-10's JPEG layout: train/CLASS and test/CLASS. The test split is the test
    folder's images (it was drawn from the training images before), held or streamed."""
    from autosearch.data.loading import load_named

    monkeypatch.setenv("AUTOSEARCH_CACHE", str(tmp_path / "cache"))
    load_named.cache_clear()
    _folder(tmp_path / "cifar", "train", 20, seed=0)
    _folder(tmp_path / "cifar", "test", 7, seed=1)
    data = load_data(f"folder:{tmp_path / 'cifar'}", seed=0, stream=stream)
    assert len(data.test) == 21 and len(data.train) + len(data.val) == 60
    assert data.classes == ("cat", "dog", "ship") and data.input_shape == (3, 8, 8)
    assert data.streamed == stream
    if stream:
        assert all("/test/" in f for f in data.test.files)
        assert not any("/test/" in f for f in (*data.train.files, *data.val.files))


def test_a_train_and_test_folder_of_other_classes_is_refused(tmp_path, monkeypatch):
    from autosearch import DataError
    from autosearch.data.loading import load_named

    monkeypatch.setenv("AUTOSEARCH_CACHE", str(tmp_path / "cache"))
    load_named.cache_clear()
    _folder(tmp_path / "cifar", "train", 5, seed=0)
    _folder(tmp_path / "cifar", "test", 5, seed=1)
    (tmp_path / "cifar" / "test" / "ship").rename(tmp_path / "cifar" / "test" / "boat")
    with pytest.raises(DataError, match="test/ holds classes") as info:
        load_data(f"folder:{tmp_path / 'cifar'}")
    assert "\n" not in str(info.value)


def _benchmark(work, *arguments: str) -> subprocess.CompletedProcess:
    """benchmarks/nb201_supernet.py run in ``work`` (its study, cache and files there)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "nb201_supernet.py"), "--work", ".", *arguments],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "AUTOSEARCH_CACHE": str(work / "cache")},
    )


@pytest.mark.slow
def test_the_benchmarks_smallest_setting_runs(tmp_path):
    """benchmarks/nb201_supernet.py end to end on a slice of CIFAR-10 (skipped, saying
    so, where the dataset is not beside the repository)."""
    if not CIFAR.is_file():
        pytest.skip(f"{CIFAR} is absent: the NAS-Bench-201 benchmark needs CIFAR-10's JPEGs")
    run = _benchmark(tmp_path, "--smoke", "--ceiling", "2", "--out", "result.json")
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    ranking = result["ranking"]
    assert (
        ranking["cells"] == result["settings"]["rank_cells"] and -1 <= ranking["kendall_tau"] <= 1
    )
    assert result["search"]["pick"]["published_accuracy"] > 0
    bound = result["ceiling"]
    assert bound["cells"] == 2 and len(bound["trained"]) == 2
    assert all(0 <= accuracy <= 1 for _, accuracy in bound["trained"])
    # the ceiling alone, of the cells that run ranked: the same cells, trained the same way
    again = _benchmark(
        tmp_path, "--ceiling-from", "result.json", "--ceiling", "1", "--out", "ceiling.json"
    )
    assert again.returncode == 0, again.stderr[-3000:]
    alone = json.loads((tmp_path / "ceiling.json").read_text())["ceiling"]["trained"]
    assert alone == bound["trained"][:1]
