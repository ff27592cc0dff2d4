from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import autosearch
from autosearch import ExportError
from autosearch.registry import spaces

# Run in a fresh interpreter where autosearch, its plugins and its libraries cannot be
# imported: model.py must need nothing but torch.
_ONLY_TORCH = textwrap.dedent(
    """
    import sys
    BLOCKED = {"autosearch", "search_spaces", "controllers", "safetensors", "optuna", "sklearn"}

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError("blocked for the test: " + name)

    sys.meta_path.insert(0, Block())
    import torch
    import model

    images = torch.load("images.pt", weights_only=True)
    net = model.load()
    with torch.no_grad():
        torch.save(net(model.preprocess(images)), "logits.pt")
    """
)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_space):
    """One study of two trials and its best's export, shared by the tests that read it
    (each copies the folder before writing into it: ``fresh_export``). Trained with a
    recipe of its own, which ``autosearch train`` must start from."""
    from controllers import RandomSearch

    root = tmp_path_factory.mktemp("exported")
    study = autosearch.create_study(
        "exported",
        controller=RandomSearch(tiny_space, seed=0),
        train=autosearch.TrainConfig(epochs=2, batch_size=96, lr=0.07),
        storage=f"sqlite:///{root}/exported.db",
    )
    study.optimize(2)
    return study, study.best(), study.export(study.best(), root / "best")


@pytest.fixture
def fresh_export(exported, tmp_path):
    """A copy of the shared export, to write into."""
    import shutil

    return shutil.copytree(exported[2], tmp_path / "best")


def test_export_round_trip_in_a_process_without_autosearch(exported, fresh_export, digits):
    study, record, out = *exported[:2], fresh_export
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "arch.json",
        "model.onnx",
        "model.py",
        "model.safetensors",
    ]
    # Every exported file has the mode any new file of this user gets (the weights
    # were 0600, written by safetensors' own writer).
    assert len({p.stat().st_mode & 0o777 for p in out.iterdir()}) == 1
    card = json.loads((out / "arch.json").read_text())
    assert card["arch_id"] == record.arch.arch_id and card["variant"] == "base"
    assert card["metrics"]["accuracy"] == record.accuracy and "2 x MACs" in card["conventions"]
    assert card["onnx"]["max_abs_diff"] < 1e-4 and card["onnx"]["checked_images"] > 0
    readme = (out / "README.md").read_text()
    assert "model.load()" in readme and f"{record.accuracy:.6g}" in readme
    assert "autosearch train <this folder>" in readme and "{this" not in readme

    images = digits.test.x[:32]
    torch.save(images, out / "images.pt")
    subprocess.run([sys.executable, "-c", _ONLY_TORCH], cwd=out, check=True, timeout=1800)
    exported = torch.load(out / "logits.pt", weights_only=True)

    model = study.load_model(record)
    with torch.no_grad():
        expected = model(digits.normalize(images))
    torch.testing.assert_close(exported, expected, rtol=0, atol=1e-6)
    # and the stored weights are the trained ones: accuracy as recorded
    correct = (model(digits.normalize(digits.val.x)).argmax(1) == digits.val.y).float().mean()
    assert float(correct) == pytest.approx(record.accuracy)


def test_the_blocker_really_blocks(tmp_path):
    probe = "import sys\n" + _ONLY_TORCH.split("import torch")[0] + "import autosearch\n"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=1800
    )
    assert result.returncode != 0 and "blocked for the test: autosearch" in result.stderr


def test_export_of_a_failed_trial_is_refused(make_study, monkeypatch, tmp_path):
    from autosearch.evaluation import runner

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(runner, "train_candidate", broken)
    study = make_study()
    (record,) = study.optimize(1)
    with pytest.raises(ExportError, match="trial 0 is failed"):
        study.export(record, tmp_path / "x")


def test_missing_weights_say_where_they_were_looked_for(make_study, tmp_path):
    import shutil

    study = make_study()
    study.optimize(1)
    shutil.rmtree(study._artifacts.folder)
    with pytest.raises(ExportError, match="missing: .*artifacts"):
        study.export(study.best(), tmp_path / "x")


def test_the_onnx_file_runs_in_onnxruntime_like_torch(exported, digits):
    import onnxruntime

    study, record, out = exported
    session = onnxruntime.InferenceSession(str(out / "model.onnx"))
    model = study.load_model(record)
    for n in (1, 7, 100):  # any batch size
        x = digits.normalize(digits.test.x[:n])
        got = session.run(None, {"images": x.numpy()})[0]
        with torch.no_grad():
            expected = model(x).numpy()
        assert got.shape == (n, 10)
        assert abs(got - expected).max() < 1e-4


def test_an_onnx_file_that_disagrees_with_torch_is_refused(digits, tmp_path, monkeypatch):
    import autosearch.export.onnx as export

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    monkeypatch.setattr(export, "onnx_parity", lambda *a: 0.25)
    with pytest.raises(ExportError, match="differ from torch's by 0.25"):
        export.write_onnx(net, digits.normalize(digits.val.x[:8]), tmp_path / "m.onnx")


_VARIANTS = textwrap.dedent(
    """
    import sys
    BLOCKED = {"autosearch", "search_spaces", "controllers", "safetensors", "optuna", "sklearn",
               "torchao", "torch_pruning"}

    import importlib.machinery

    class Block:  # found (torch probes for some of them), but importing fails
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                return importlib.machinery.ModuleSpec(name, self)

        def create_module(self, spec):
            raise ImportError("blocked for the test: " + spec.name)

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Block())
    import torch
    import model

    images = torch.load("images.pt", weights_only=True)
    net = model.load_int8() if model.INT8_PROGRAM else model.load()
    with torch.no_grad():
        torch.save(net(model.preprocess(images)), "logits.pt")
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["int8", "prune-channels@0.5"])
def test_a_variant_exports_and_runs_with_torch_alone(make_study, digits, tmp_path, variant):
    from autosearch import Compression, TrainConfig

    study = make_study(
        variants=("base", variant),
        compression=Compression(finetune_epochs=1),
        train=TrainConfig(epochs=3, batch_size=32, lr=0.1),
    )
    study.optimize(1)
    record = study.best(variant=variant)
    out = study.export(record, tmp_path / "v")
    card = json.loads((out / "arch.json").read_text())
    assert card["variant"] == variant
    # Derived again with the trial's seed: as accurate as when it was measured.
    assert card["metrics"]["accuracy_exported"] == pytest.approx(record.accuracy, abs=0.02)
    program = "model_int8.pt2" if variant == "int8" else "model.pt2"
    assert (out / program).is_file() and (out / "model.onnx").is_file()

    torch.save(digits.val.x, out / "images.pt")
    subprocess.run([sys.executable, "-c", _VARIANTS], cwd=out, check=True, timeout=1800)
    logits = torch.load(out / "logits.pt", weights_only=True)
    accuracy = float((logits.argmax(1) == digits.val.y).float().mean())
    # The files alone classify as the variant did when measured (the int8 program is the
    # portable reference form of the measured int8 kernels: within a point or two).
    assert accuracy == pytest.approx(card["metrics"]["accuracy_exported"], abs=0.02)


def test_autosearch_train_trains_an_export_in_full(fresh_export, digits, capsys):
    from autosearch.cli import main
    from autosearch.export.retrain import load_export

    out = fresh_export
    argv = ["train", str(out), "--epochs", "3", "--batch-size", "32", "--lr", "0.1", "--json"]
    assert main(argv) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["epochs"] == 3 and len(metrics["history"]) == 3
    assert metrics["val_accuracy"] > 0.3 and metrics["world_size"] == 1
    assert json.loads((out / "full" / "metrics.json").read_text()) == metrics
    # The weights drop into the export's model.py: as accurate as measured.
    model = load_export(out).load(str(out / "full" / "model.safetensors"))
    with torch.no_grad():
        predicted = model(digits.normalize(digits.val.x)).argmax(1)
    assert float((predicted == digits.val.y).float().mean()) == pytest.approx(
        metrics["val_accuracy"]
    )
    # Run again: the checkpoint says it is done, so nothing is retrained.
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["val_accuracy"] == metrics["val_accuracy"]


def test_autosearch_train_starts_from_the_trials_own_recipe(fresh_export, capsys):
    from autosearch.cli import main

    out = fresh_export  # its study trained with epochs=2, batch_size=96, lr=0.07
    card = json.loads((out / "arch.json").read_text())
    assert card["training"]["data"] == "digits" and card["training"]["train"]["batch_size"] == 96
    assert main(["train", str(out), "--json"]) == 0  # no --data, no recipe given
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["data"] == "digits" and metrics["epochs"] == 2
    recipe = metrics["train_config"]
    assert (recipe["batch_size"], recipe["lr"]) == (96, 0.07)
    assert main(["train", str(out), "--lr", "0.01", "--json"]) == 0  # told otherwise
    assert json.loads(capsys.readouterr().out)["train_config"]["lr"] == 0.01


def test_autosearch_train_refuses_data_of_another_shape(fresh_export, tmp_path, capsys):
    import numpy as np

    from autosearch.cli import main

    out = fresh_export
    rng = np.random.default_rng(0)
    folder = tmp_path / "images"
    from PIL import Image

    for label in range(3):
        (folder / str(label)).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 256, (12, 12), dtype=np.uint8)).save(
                folder / str(label) / f"{i}.png"
            )
    assert main(["train", str(out), "--data", f"folder:{folder}", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "takes images of shape (1, 8, 8)" in err and "pass --data digits" in err
    assert main(["train", str(tmp_path), "--epochs", "1"]) == 2
    assert "has no model.py" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "nowhere"), "--epochs", "1"]) == 2
    assert "nowhere does not exist" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_autosearch_train_runs_two_processes(fresh_export, parallel):
    import os
    from pathlib import Path

    out = fresh_export
    cli = Path(sys.executable).with_name("autosearch")
    command = [str(cli), "train", str(out), "--epochs", "2", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*command, "--parallel", parallel],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("trained ") == 1  # rank 0 alone reports
    metrics = json.loads((out / "full" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["epochs"] == 2
    assert metrics["train_config"]["parallel"] == parallel
    from autosearch.export.retrain import load_export

    model = load_export(out).build()
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    held = metrics["held_bytes"]["parameters"]  # rank 0's: half the model's under FSDP
    assert held == pytest.approx(whole / 2, rel=0.1) if parallel == "fsdp" else held == whole


_LOAD_AND_RUN = textwrap.dedent(
    """
    import sys
    BLOCKED = set(sys.argv[1].split(","))

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError("blocked for the test: " + name)

    sys.meta_path.insert(0, Block())
    import torch
    import model

    images = torch.load("images.pt", weights_only=True)
    with torch.no_grad():
        torch.save(model.load()(model.preprocess(images)), "logits.pt")
    """
)
_NOT_NEEDED = "autosearch,controllers,safetensors,optuna,sklearn"


@pytest.mark.parametrize("kind", sorted(spaces.names()))
def test_every_space_kinds_export_loads_and_runs_in_a_fresh_process(kind, tmp_path):
    from autosearch.export import write_export

    if reason := spaces.get(kind).unavailable():
        pytest.skip(reason)
    space = spaces.get(kind).example()
    shape, classes = (3, 32, 32), 10
    arch = space.default()
    torch.manual_seed(0)
    net = space.build(arch, input_shape=shape, num_classes=classes).eval()
    images = torch.randint(0, 256, (4, *shape), dtype=torch.uint8)
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    normalized = (images.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / 0.25
    out = write_export(
        tmp_path / kind,
        arch=arch,
        spec=space.network(arch, input_shape=shape, num_classes=classes),
        model=net,
        description=space.describe(arch),
        input_shape=shape,
        mean=mean,
        std=std,
        metrics={},
        provenance={"test": kind},
        samples=normalized,
    )
    torch.save(images, out / "images.pt")
    # An NNI space's network is NNI's, rebuilt by its factory's module (here one of
    # search_spaces, which needs autosearch), so it needs those; every other export
    # needs torch alone.
    blocked = "-" if kind == "nni" else _NOT_NEEDED + ",search_spaces"
    run = [sys.executable, "-c", _LOAD_AND_RUN, blocked]
    subprocess.run(run, cwd=out, check=True, timeout=1800)
    with torch.no_grad():
        expected = net(normalized)
    torch.testing.assert_close(torch.load(out / "logits.pt"), expected, rtol=0, atol=1e-5)
    if kind == "nni":  # without NNI the export says what it needs, in one line
        missing = subprocess.run(
            [*run[:-1], blocked + ",nni"], cwd=out, capture_output=True, text=True, timeout=1800
        )
        last = missing.stderr.strip().splitlines()[-1]
        assert missing.returncode != 0 and "needs NNI: pip install nni" in last


def test_the_onnx_exporters_registry_is_built_once_and_the_file_is_torchs(tmp_path):
    """torch.onnx.export builds its ATen-to-ONNX registry at every call (a third of a
    small export); autosearch's export builds it once a process, and writes the bytes
    torch.onnx.export writes."""
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    from autosearch._compat import _REGISTRIES
    from autosearch.export.onnx import _onnx_export, _quiet
    from autosearch.export.programs import dynamic_batch

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 10),
    ).eval()  # fmt: skip
    example = torch.zeros(2, 1, 8, 8)
    torchs = ONNXRegistry.__dict__["from_torchlib"]
    with _quiet():
        torch.onnx.export(
            net, (example,), str(tmp_path / "torch.onnx"), input_names=["images"],
            output_names=["logits"], dynamic_shapes=dynamic_batch(), external_data=False,
            dynamo=True,
        )  # fmt: skip
        _onnx_export(net, example, tmp_path / "first.onnx")
        (built,) = _REGISTRIES.values()  # the one opset torch.onnx.export asks for
        _onnx_export(net, example, tmp_path / "second.onnx")
    assert list(_REGISTRIES.values()) == [built]  # not built again
    assert ONNXRegistry.__dict__["from_torchlib"] is torchs  # torch's own again after
    files = [(tmp_path / f"{n}.onnx").read_bytes() for n in ("torch", "first", "second")]
    assert files[0] == files[1] == files[2]
