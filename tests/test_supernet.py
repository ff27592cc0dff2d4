"""Weight sharing: supernets of the ResNet and MobileNet spaces, trained on the shared
stack with the sandwich rule, searched by every controller, exported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from _controllers import registered_controller

import autosearch
from autosearch import (
    BudgetError,
    ConfigError,
    InvalidArchitectureError,
    StudyError,
    SupernetConfig,
    TrainConfig,
)
from autosearch.cli import main
from autosearch.registry import controllers
from autosearch.testing import ControllerContract
from autosearch.weight_sharing.supernet import Sandwich, recalibrate
from controllers import RandomSearch, RegularizedEvolution
from search_spaces import ElasticSpace, MobileNetSpace, ResNetSpace

SPACES = {
    "resnet basic pad": lambda: ResNetSpace(
        max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16)
    ).supernet(fixed={"stages": 2, "block": "basic", "shortcut": "pad"}),
    "resnet bottleneck projection": lambda: ResNetSpace(
        max_stages=3, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16), stem="imagenet"
    ).supernet(fixed={"stages": 3, "block": "bottleneck", "shortcut": "projection"}),
    "mobilenet ds and ir, kernels, se": lambda: MobileNetSpace(
        max_stages=3, depths=(1, 2), widths=(16, 24), expansions=(1, 3, 6), kernels=(3, 5, 7)
    ).supernet(fixed={"stages": 3, "stage1.block": "ds", "width_mult": 1.0, "head.width": 640}),
    "mobilenet with kernel transforms": lambda: MobileNetSpace(
        max_stages=2, depths=(1, 2), widths=(16, 24), expansions=(1, 6), kernels=(3, 5)
    ).supernet(fixed={"stages": 2, "width_mult": 0.5}, kernel_transform=True),
}
SHAPES = {"resnet bottleneck projection": (3, 128, 128)}


def _perturbed(net: torch.nn.Module) -> None:
    """Every weight, statistic and kernel transform away from its initial value, so
    that a wrong slice cannot go unnoticed."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in [*net.parameters(), *net.buffers()]:
            if tensor.is_floating_point():
                noise = torch.rand(tensor.shape, generator=generator)
                tensor.add_(0.1 * noise if tensor.dim() > 1 else 0.5 + noise)


@pytest.mark.parametrize("kind", list(SPACES))
def test_a_subnet_copied_out_is_the_same_network(kind):
    """space.build(arch) with the supernet's slices copied in gives the supernet's
    outputs for that subnet (eval mode, within 1e-5)."""
    space = SPACES[kind]()
    shape = SHAPES.get(kind, (3, 16, 16))
    net = space.build_supernet(input_shape=shape, num_classes=7)
    _perturbed(net)
    net.eval()
    x = torch.randn(3, *shape, generator=torch.Generator().manual_seed(1))
    rng = np.random.default_rng(0)
    archs = [space.largest(), space.smallest(), *(space.sample(rng) for _ in range(6))]
    for arch in archs:
        net.activate(arch)
        subnet = net.subnet(arch).eval()
        assert type(subnet).__module__.startswith("search_spaces._")  # an ordinary network
        with torch.no_grad():
            torch.testing.assert_close(subnet(x), net(x), rtol=0, atol=1e-5)


def test_every_subnet_is_an_architecture_of_the_space():
    space = SPACES["resnet basic pad"]()
    arch = space.sample(np.random.default_rng(0))
    full = space.full(arch)
    assert full.space == "resnet" and full["block"] == "basic" and full["stages"] == 2
    assert space.project(full) == arch
    assert space.describe(arch) == space.space.describe(full)
    assert space.cost(arch) == space.space.cost(full)


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda: ResNetSpace().supernet(elastic=("block",)),
            "gene 'block' of space 'resnet' is not elastic",
        ),
        (lambda: ResNetSpace().supernet(elastic=("stage1.widht",)), "did you mean 'stage1.width'"),
        (lambda: ResNetSpace().supernet(fixed={"stags": 2}), "did you mean 'stages'"),
        (
            lambda: ResNetSpace().supernet(elastic=("stem.width",), fixed={"stem.width": 16}),
            "'stem.width' is both fixed and elastic",
        ),
        (
            lambda: ResNetSpace(max_stages=3).supernet(
                elastic=("stage3.depth",), fixed={"stages": 2}
            ),
            "'stage3.depth' has no effect",
        ),
        (
            lambda: ResNetSpace().supernet(fixed={"block": "dense"}),
            "'block' = 'dense' is not allowed",
        ),
        (
            lambda: ElasticSpace(space=autosearch.registry.spaces.get("densenet")()),
            "has no supernet",
        ),
        (lambda: ResNetSpace().supernet(kernel_transform=True), "needs an elastic kernel gene"),
    ],
)
def test_a_supernet_asked_for_what_it_cannot_share_says_which_gene(make, match):
    with pytest.raises(ConfigError, match=match) as error:
        make()
    assert "\n" not in str(error.value)


def test_a_subnet_outside_the_sub_space_is_refused_naming_the_gene():
    space = SPACES["resnet basic pad"]()
    other = space.space.make({**space.full(space.largest()), "block": "bottleneck"})
    with pytest.raises(ConfigError, match="gene 'block' = 'bottleneck' is outside"):
        space.project(other)
    with pytest.raises(InvalidArchitectureError, match="'stage1.width' = 999"):
        space.make({**space.largest(), "stage1.width": 999})


def test_the_sandwich_rule_trains_the_largest_smallest_and_random_subnets():
    space = SPACES["resnet basic pad"]()
    net = space.build_supernet(input_shape=(1, 8, 8), num_classes=10)
    sandwich = Sandwich(net, space, SupernetConfig(sandwich=2), epochs=4)
    net.activate(space.largest())
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    logits = net(x)
    torch.manual_seed(0)
    outputs = sandwich.train()(x)  # one forward holds the whole step (what DDP wraps)
    assert outputs.shape == (4, 8, 10)
    torch.testing.assert_close(outputs[0], logits)
    loss = sandwich.loss(outputs, x, y)
    # After the step the supernet runs the largest again (what training validates on).
    torch.testing.assert_close(net(x), logits)
    largest, smallest = space.largest(), space.smallest()
    assert sandwich.trained[:2] == [largest, smallest] and len(sandwich.trained) == 4
    # The loss is the largest's on the labels plus each other's on its soft predictions.
    teacher = logits.detach().softmax(1)
    expected = torch.nn.functional.cross_entropy(logits, y)
    for arch in sandwich.trained[1:]:
        net.activate(arch)
        expected = expected + torch.sum(-teacher * net(x).log_softmax(1), 1).mean()
    torch.testing.assert_close(loss, expected)
    loss.backward()
    stage2_last = net.net.stages[1][-1].convs[0].weight  # only the deepest subnets run it
    assert stage2_last.grad is not None and stage2_last.grad.abs().sum() > 0
    sandwich.eval()  # evaluation runs the largest subnet alone
    torch.testing.assert_close(sandwich(x), net(x))


def test_progressive_shrinking_unlocks_kernels_then_depths_then_widths():
    space = SPACES["mobilenet with kernel transforms"]()
    net = space.build_supernet(input_shape=(3, 16, 16), num_classes=10)
    sandwich = Sandwich(net, space, SupernetConfig(schedule="progressive"), epochs=8)
    unlocked = []
    for epoch in range(1, 9):
        sandwich.set_epoch(epoch)
        unlocked.append({g.rsplit(".", 1)[1] for g in sandwich.unlocked})
    assert unlocked[0] == set() and unlocked[1] == set()  # the largest alone first
    assert unlocked[2] == {"kernel"} and unlocked[4] == {"kernel", "depth"}
    assert unlocked[-1] == {"kernel", "depth", "width", "expansion", "se"}
    sandwich.set_epoch(1)
    assert sandwich.subnets() == []  # phase 0 trains the largest only


def test_recalibration_changes_the_statistics_and_not_the_weights(digits):
    space = SPACES["resnet basic pad"]()
    net = space.build_supernet(input_shape=(1, 8, 8), num_classes=10)
    model = net.subnet(space.smallest())
    weights = {k: v.clone() for k, v in model.named_parameters()}
    stats = {k: v.clone() for k, v in model.named_buffers() if "running" in k}
    recalibrate(model, digits.normalize(digits.train.x[:200]), batch_size=64)
    for name, value in model.named_parameters():
        assert torch.equal(value, weights[name]), name
    changed = [
        k for k, v in model.named_buffers() if "running" in k and not torch.equal(v, stats[k])
    ]
    assert len(changed) == len(stats)
    # The statistics are those of these images: the mean over the batches' means.
    first_bn = model.stem[0][1]
    conv = model.stem[0][0]
    with torch.no_grad():
        batches = digits.normalize(digits.train.x[:200]).split(64)
        means = torch.stack([conv(b).mean((0, 2, 3)) for b in batches]).mean(0)
    torch.testing.assert_close(first_bn.running_mean, means, rtol=1e-4, atol=1e-5)


def test_the_epoch_line_scores_the_largest_subnet_as_the_search_would(digits, monkeypatch):
    """Issue 45: the per-epoch "largest subnet val 0.64" evaluated with batch-norm
    statistics averaged over every subnet, when that subnet, recalibrated, scored 0.89.
    Now each epoch's figure is the largest subnet recalibrated on the same images its
    evaluation as a trial uses; the supernet's own statistics (and so its checkpoints
    and weights) are what they were without it."""
    import autosearch.weight_sharing.supernet as module

    space = SPACES["resnet basic pad"]()
    config, supernet = TrainConfig(epochs=2, batch_size=64, lr=0.05), SupernetConfig(sandwich=1)
    runs = {}
    for recalibrated in (True, False):
        if not recalibrated:  # as before: the supernet's own statistics
            monkeypatch.setattr(module, "calibration_images", lambda *args: None)
        torch.manual_seed(0)
        net = space.build_supernet(input_shape=(1, 8, 8), num_classes=10)
        result = module.train_supernet(net, space, digits, config, supernet, seed=3)
        runs[recalibrated] = (result, module.weights_digest(net.state_dict()), net)
    monkeypatch.undo()
    (result, digest, net), (plain, plain_digest, _) = runs[True], runs[False]
    assert digest == plain_digest  # evaluating a recalibrated copy changed nothing
    evaluator = module.SubnetEvaluator(net, space, digits, supernet, seed=3)
    _, scored = evaluator.evaluate(space.largest())
    assert result.val_accuracy == scored["accuracy"]
    assert result.val_accuracy != plain.val_accuracy  # what the old line showed differs


def test_the_epoch_line_names_what_it_shows(caplog):
    import logging

    from autosearch.training.train import EpochResult
    from autosearch.weight_sharing import progress as supernet_progress

    epoch = EpochResult(epoch=3, train_loss=0.5, val_accuracy=0.875, val_loss=0.4, seconds=2.0)
    with caplog.at_level(logging.INFO), supernet_progress.shown(30, False) as show:
        show(epoch)
    assert caplog.messages == [
        "supernet epoch 3/30: training loss 0.5000, largest subnet with batch norm "
        "recalibrated: val accuracy 0.8750 (2.0 s)"
    ]


# Studies on a supernet ----------------------------------------------------------------
TINY = TrainConfig(epochs=2, batch_size=64, lr=0.05)


def _space(**budget):
    return ResNetSpace(max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16)).supernet(
        fixed={"stages": 2, "block": "basic"}, **budget
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A study whose tiny supernet is trained, and that supernet's weights file."""
    root = tmp_path_factory.mktemp("supernet")
    study = autosearch.create_study(
        "ws",
        controller=RandomSearch(_space(), seed=0),
        storage=f"sqlite:///{root}/ws.db",
        train=TINY,
        supernet=SupernetConfig(sandwich=1, latency=False),
    )
    info = study.supernet.train()
    weights = study.supernet.save(root / "supernet.safetensors")
    return {"root": root, "study": study, "info": info, "weights": weights}


def test_a_supernet_is_trained_once_and_stored_with_the_study(trained):
    study, info = trained["study"], trained["info"]
    assert info["status"] == "complete" and info["epochs"] == 2 and len(info["history"]) == 2
    again = autosearch.load_study("ws", storage=study.storage_url)
    assert again.supernet.train() == info  # trained already: nothing trains again
    assert not (study._artifacts.folder / "supernet").exists() or not any(
        (study._artifacts.folder / "supernet").rglob("*.pt")
    )  # its checkpoints go once its weights are stored


@pytest.mark.parametrize("name", controllers.names())
def test_every_controller_searches_a_supernet_unchanged(name, trained, tmp_path):
    cls = controllers.get(name)
    space = _space(max_flops=6e5, budget_input=(1, 8, 8))
    options = (
        {"objectives": {"accuracy": "maximize", "flops": "minimize"}} if name == "nsga2" else {}
    )
    # The zero-cost warm-up ranks its pool by the study's own proxies of each subnet.
    if name == "zero_cost":
        options = {"pool": 24, "first": 3}
    warm = {"proxies": autosearch.ProxyConfig(names=("synflow",), batch=8)}
    study = autosearch.create_study(
        name,
        controller=cls(space, seed=0, **options),
        storage=f"sqlite:///{tmp_path}/s.db",
        train=TINY,
        supernet=SupernetConfig(sandwich=1, latency=False, weights=str(trained["weights"])),
        **(warm if name == "zero_cost" else {}),
    )
    study.supernet.train()  # imports the weights: no training
    records = study.optimize(6)
    assert [r.state for r in records] == ["complete"] * 6
    assert len({r.arch for r in records}) == 6
    assert all(r.flops <= 6e5 for r in records)  # within the space's budget
    facts = study.trials.all()[0].user_attrs["result"]
    assert facts["evaluated_by"] == "supernet" and facts["weights"] is None
    assert 0.0 < records[0].accuracy <= 1.0


class TestEveryControllerOnAnElasticSpace(ControllerContract):
    """The controller contract over an elastic sub-space (what a supernet study searches)."""

    @pytest.fixture
    def space(self):  # 4,800 subnets: large enough that no sampler runs out of new ones
        return ResNetSpace(
            max_stages=3, depths=(1, 2, 3), widths=(8, 16, 24, 32), stem_widths=(8, 16, 24)
        ).supernet(fixed={"stages": 3, "block": "basic"})

    @pytest.fixture(params=controllers.names())
    def make_controller(self, request, space):
        return lambda seed: registered_controller(request.param, space, seed)


def _int8_study(trained, tmp_path, name="v", seed=1):
    """A study of the trained supernet's weights with an int8 variant, the supernet
    loaded (nothing trains)."""
    study = autosearch.create_study(
        name,
        controller=RandomSearch(_space(), seed=seed),
        storage=f"sqlite:///{tmp_path}/{name}.db",
        train=TINY,
        variants=("base", "int8"),
        supernet=SupernetConfig(latency=False, weights=str(trained["weights"])),
    )
    study.supernet.train()
    return study


def _one_int8_subnet(trained, tmp_path):
    """A study of the trained supernet with an int8 variant, one subnet evaluated: the
    study and that subnet's base record."""
    study = _int8_study(trained, tmp_path)
    (record,) = study.optimize(1)
    return study, record


def test_variants_of_a_subnet_are_derived_from_its_inherited_weights(trained, tmp_path):
    study, record = _one_int8_subnet(trained, tmp_path)
    int8 = study.record(record.trial, "int8")
    assert int8.state == "complete" and int8.metrics["bytes"] < record.metrics["bytes"]
    assert abs(int8.accuracy - record.accuracy) < 0.1


def test_two_worker_processes_search_the_stored_supernet_with_its_int8_variants(trained, tmp_path):
    """The weight-sharing guide's way to use both cores of a CPU: ``optimize(n,
    n_workers=2)``. Each worker loads the stored supernet and scores its subnets (and
    their int8 estimates) on those weights; nothing trains the supernet again."""
    study = _int8_study(trained, tmp_path, "pair", seed=2)
    info = study.supernet.train()  # loaded already: what the study stored
    records = study.optimize(4, n_workers=2)
    assert len(records) == 4 and {r.state for r in records} == {"complete"}
    trials = {t.number: t for t in study.trials.all()}
    assert sorted(trials) == sorted(r.trial for r in records)
    for record in records:
        trial = trials[record.trial]
        assert "controller_stream" in trial.user_attrs  # a pool's worker ran it
        assert trial.user_attrs["result"]["supernet"] == info["digest"]
        int8 = study.record(record.trial, "int8")
        assert int8.state == "complete" and int8.metrics["bytes"] < record.metrics["bytes"]
    assert study.supernet.train() == info  # the same weights: nothing trained them again


def test_a_subnets_passes_run_without_cudnns_autotuner_which_is_as_it_was_after(
    trained, tmp_path, monkeypatch
):
    """Every pass of a weight-sharing trial (its costs, the int8 estimate's calibration,
    the variant's evaluation) meets the subnet's shapes once: cuDNN's autotuner is off
    for all of them, not for the supernet's evaluation alone (the H200 of 2026-11-29 ran
    them tuned), and the flag is as it was after the trial."""
    from autosearch.evaluation import runner

    seen: list[tuple[str, bool]] = []

    def spy(name, real):
        def wrapper(*args, **kwargs):
            seen.append((name, torch.backends.cudnn.benchmark))
            return real(*args, **kwargs)

        return wrapper

    for name in ("profile", "derive_variant", "evaluate"):
        monkeypatch.setattr(runner, name, spy(name, getattr(runner, name)))
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    study, record = _one_int8_subnet(trained, tmp_path)
    assert study.record(record.trial, "int8").state == "complete"
    assert {name for name, _ in seen} == {"profile", "derive_variant", "evaluate"}, seen
    assert not any(tuned for _, tuned in seen), seen
    assert torch.backends.cudnn.benchmark is True


def test_bad_input_to_a_supernet_study_changes_nothing(trained, tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/b.db"
    with pytest.raises(ConfigError, match="must be the elastic part of one"):
        autosearch.create_study(
            "b",
            controller=RandomSearch(ResNetSpace(), seed=0),
            storage=url,
            supernet=SupernetConfig(),
        )
    study = autosearch.create_study(
        "b",
        controller=RandomSearch(_space(), seed=0),
        storage=url,
        train=TINY,
        supernet=SupernetConfig(latency=False),
    )
    # Evaluating before the supernet is trained: one line, nothing run.
    with pytest.raises(StudyError, match="not trained yet: train it first"):
        study.optimize(2)
    assert study.trials.all() == []
    # Weights of another supernet (another sub-space): refused.
    other = autosearch.create_study(
        "o",
        controller=RandomSearch(
            ResNetSpace(max_stages=2, depths=(1,), widths=(8,), stem_widths=(8,)).supernet(
                fixed={"stages": 2, "block": "basic"}
            ),
            seed=0,
        ),
        storage=f"sqlite:///{tmp_path}/o.db",
        train=TINY,
        supernet=SupernetConfig(weights=str(trained["weights"])),
    )
    with pytest.raises(ConfigError, match="are of another supernet"):
        other.supernet.train()
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    junk = autosearch.create_study(
        "j",
        controller=RandomSearch(_space(), seed=0),
        storage=f"sqlite:///{tmp_path}/j.db",
        train=TINY,
        supernet=SupernetConfig(weights=str(tmp_path / "junk.safetensors")),
    )
    with pytest.raises(ConfigError, match="cannot be read"):
        junk.supernet.train()
    assert other.trials.all() == [] and junk.trials.all() == []


def test_a_subnet_over_the_budget_is_refused(trained):
    import dataclasses

    from autosearch.evaluation.runner import run_trial

    study = trained["study"]
    space = _space(max_flops=2e5, budget_input=(1, 8, 8))
    plan = dataclasses.replace(study._planner.plan(space.largest()), space=space)
    with pytest.raises(BudgetError, match="over the budget"):
        run_trial(plan, study.data)


def test_a_subnet_exports_with_its_inherited_weights_and_trains_again(trained, tmp_path, capsys):
    study = trained["study"]
    (record,) = autosearch.load_study("ws", storage=study.storage_url).optimize(1)
    out = study.export(study.record(record.trial), tmp_path / "sub", finetune_epochs=1)
    card = json.loads((out / "arch.json").read_text())
    assert card["architecture"]["space"] == "resnet"  # an ordinary architecture
    metrics = card["metrics"]
    assert metrics["accuracy_inherited"] == pytest.approx(record.accuracy, abs=1e-9)
    assert "accuracy_finetuned" in metrics and metrics["finetune_epochs"] == 1
    # Loads with torch alone, in a fresh process.
    code = textwrap.dedent(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {"autosearch", "search_spaces", "controllers", "optuna"}:
                    raise ImportError(name)
        sys.meta_path.insert(0, Block())
        import torch, model
        net = model.load()
        print(tuple(net(torch.zeros(2, *model.INPUT_SHAPE)).shape))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=out, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0 and done.stdout.strip() == "(2, 10)", done.stderr[-2000:]
    # And autosearch train trains the same architecture from scratch.
    assert main(["train", str(out), "--epochs", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epochs"] == 1


STUDY_FILE = textwrap.dedent(
    """
    from autosearch import StudySpec, SupernetConfig, TrainConfig
    from controllers import RegularizedEvolution
    from search_spaces import ResNetSpace

    space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16))
    study = StudySpec(
        name="ws-file",
        controller=RegularizedEvolution(
            space.supernet(fixed={{"stages": 2}}), population=4, sample=2, seed=0
        ),
        train=TrainConfig(epochs={epochs}, batch_size=32, lr=0.05),
        supernet=SupernetConfig(sandwich=1, latency=False),
        n_trials=4,
    )
    """
)


@pytest.mark.slow
def test_a_supernet_killed_mid_epoch_resumes_from_its_last_epoch(tmp_path, monkeypatch):
    (tmp_path / "ws.py").write_text(STUDY_FILE.format(epochs=4))
    cli = Path(sys.executable).with_name("autosearch")
    run = subprocess.Popen(
        [str(cli), "supernet", "ws.py", "--json"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    checkpoints = tmp_path / "runs" / "ws-file" / "artifacts" / "supernet"
    try:
        for _ in range(36000):  # waits on the file; the bound only keeps a hang out
            found = list(checkpoints.rglob("train.pt"))
            if found:
                break
            time.sleep(0.05)
        os.kill(run.pid, signal.SIGKILL)  # mid-epoch 2 (or later): no chance to clean up
        run.wait(timeout=1800)
    finally:
        run.kill()
    saved = torch.load(found[0], weights_only=True)
    cut_at = saved["epoch"]
    assert 1 <= cut_at < 4
    # The killed run's claim on the job is taken over at once: its process is gone (the
    # heartbeat grace, the default 60 s, plays no part).
    assert (
        main(
            [
                "supernet",
                str(tmp_path / "ws.py"),
                "--storage",
                f"sqlite:///{tmp_path}/runs/ws-file/study.db",
                "--json",
            ]
        )
        == 0
    )
    study = autosearch.load_study("ws-file", storage=f"sqlite:///{tmp_path}/runs/ws-file/study.db")
    history = study.supernet.train()["history"]
    assert [e["epoch"] for e in history] == [1, 2, 3, 4]
    # The epochs before the kill were restored, not trained again (their timings match).
    assert [e["seconds"] for e in history[:cut_at]] == [e["seconds"] for e in saved["history"]]


def test_run_trains_the_supernet_then_searches_and_exports(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws.py").write_text(STUDY_FILE.format(epochs=1))
    assert main(["run", "ws.py"]) == 0
    out = capsys.readouterr().out
    assert "supernet of study ws-file: trained 1 epochs" in out and "Pareto front" in out
    assert (tmp_path / "runs" / "ws-file" / "best" / "model.py").is_file()
    assert main(["export", "ws.py", "--best", "--finetune", "1", "--out", "x", "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert card["metrics"]["finetune_epochs"] == 1 and card["architecture"]["space"] == "resnet"
    # A subnet's rerun is its evaluation on the supernet, again: the same figures.
    assert main(["rerun", "ws.py", "--trial", "0"]) == 0
    assert "evaluated again on the supernet" in capsys.readouterr().out


def test_a_worker_on_a_supernet_study_trains_the_supernet_first(tmp_path, monkeypatch, capsys):
    """`autosearch worker` on a supernet study refused ("not trained yet") where `run`
    trains it: a worker, any machine, trains it once (or waits for the one that does)."""
    from autosearch.studyfile import load_spec

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws.py").write_text(STUDY_FILE.format(epochs=1))
    url = f"sqlite:///{tmp_path}/ws.db"
    load_spec(str(tmp_path / "ws.py")).create(storage=url)
    argv = ["worker", "--study", "ws-file", "--storage", url, "--n-trials", "2"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert first.startswith("supernet of study ws-file: trained 1 epochs")
    assert main([*argv, "--total", "3"]) == 0  # trained already: used, not trained again
    out = capsys.readouterr().out
    assert out.splitlines()[0] == first.splitlines()[0]  # the same weights, the same digest
    assert "worker finished 1 trials" in out
    assert autosearch.load_study("ws-file", storage=url).trials.count("complete") == 3


def test_the_shipped_supernet_study_file_defines_a_supernet_study():
    from autosearch.studyfile import load_spec

    spec = load_spec(Path(__file__).resolve().parents[1] / "studies" / "digits_supernet.py")
    assert spec.name == "digits-supernet" and spec.supernet is not None
    assert isinstance(spec.controller.space, ElasticSpace) and spec.data == "digits"
    assert spec.controller.space.space.size() > spec.controller.space.size() >= 3000


def test_run_confirms_the_top_of_the_front_when_the_study_file_asks(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    text = STUDY_FILE.format(epochs=1).replace(
        "    n_trials=4,\n", "    n_trials=4,\n    confirm=1,\n"
    )
    (tmp_path / "ws.py").write_text(text)
    assert main(["run", "ws.py"]) == 0
    out = capsys.readouterr().out
    assert "confirmed by training from scratch" in out and "Pareto front" in out
    study = autosearch.load_study("ws-file", storage="sqlite:///runs/ws-file/study.db")
    confirmed = [r for r in study.records() if r.confirms is not None]
    assert len(confirmed) == 1 and study.trials.count() == 4  # the budget counts search trials
    best = study.best()
    assert best.confirms is not None  # what run reported and exported is the confirmed one
    card = json.loads((tmp_path / "runs" / "ws-file" / "best" / "arch.json").read_text())
    assert card["metrics"]["accuracy"] == best.metrics["accuracy"]
    # Run again: the search budget is spent and the subnet confirmed; nothing is trained.
    assert main(["run", "ws.py"]) == 0
    again = autosearch.load_study("ws-file", storage="sqlite:///runs/ws-file/study.db")
    assert len([r for r in again.records() if r.confirms is not None]) == 1
    # Not under torchrun: said in one line, before anything starts.
    assert main(["run", "ws.py", "--nproc-per-node", "2"]) == 2
    assert "autosearch confirm ws.py -k 1" in capsys.readouterr().err


@pytest.mark.parametrize("k", [-1, True, 1.5])
def test_a_study_file_confirm_must_be_a_count(k):
    from autosearch import StudySpec

    space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(8, 16)).supernet(fixed={"stages": 2})
    with pytest.raises(autosearch.ConfigError, match="confirm must be an integer >= 0"):
        StudySpec(
            name="x",
            controller=RegularizedEvolution(space, seed=0),
            supernet=autosearch.SupernetConfig(),
            confirm=k,
        )


def test_confirm_without_a_supernet_is_refused():
    from autosearch import StudySpec

    with pytest.raises(autosearch.ConfigError, match="has no supernet"):
        StudySpec(name="x", controller=RegularizedEvolution(ResNetSpace(), seed=0), confirm=2)


def _nb201_supernet_space() -> ElasticSpace:
    from search_spaces import NB201Space

    return NB201Space(channels=4, cells=1).supernet()


@pytest.mark.parametrize("kind", [*SPACES, "nb201"])
def test_a_subnet_is_made_where_the_supernet_is_with_every_tensor_from_it(kind):
    """Issue 45: a subnet is built on the supernet's device (a supernet on a GPU gives
    subnets on that GPU; the meta device stands in for it here); every tensor is the
    supernet's, exactly what the subnet built on the CPU with the slices copied in
    holds."""
    from search_spaces._dynamic import copy_slices

    space = _nb201_supernet_space() if kind == "nb201" else SPACES[kind]()
    shape = SHAPES.get(kind, (3, 16, 16))
    net = space.build_supernet(input_shape=shape, num_classes=7)
    _perturbed(net)
    rng = np.random.default_rng(1)
    for arch in [space.largest(), space.smallest(), *(space.sample(rng) for _ in range(3))]:
        subnet = net.subnet(arch)
        fresh = space.space.build(space.full(arch), input_shape=shape, num_classes=7)
        copy_slices(list(net.pairs(fresh, net._kwargs(arch))))
        ours, expected = subnet.state_dict(), fresh.state_dict()
        assert ours.keys() == expected.keys()
        assert all(torch.equal(ours[k], expected[k]) for k in expected), arch
    on_meta = net.to("meta").subnet(space.smallest())
    assert {t.device.type for t in [*on_meta.parameters(), *on_meta.buffers()]} == {"meta"}


def test_a_supernet_that_gives_a_subnet_no_values_for_a_layer_is_named(monkeypatch):
    space = SPACES["resnet basic pad"]()
    net = space.build_supernet(input_shape=(3, 16, 16), num_classes=7)
    pairs = net.pairs
    monkeypatch.setattr(net, "pairs", lambda model, kwargs: list(pairs(model, kwargs))[:-1])
    with pytest.raises(RuntimeError, match=r"no values for .*head.*pairs\(\) must name every"):
        net.subnet(space.smallest())
