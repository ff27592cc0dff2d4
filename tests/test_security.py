"""Every load path reads data, never code: safetensors, JSON, torch.load with
weights_only=True, and a restricted unpickler for CIFAR's python batches. (Study files
and an export's model.py are Python the user wrote or exported, run on purpose.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    p
    for folder in ("autosearch", "search_spaces", "controllers")
    for p in (ROOT / folder).rglob("*.py")
)


def _calls(path: Path) -> list[tuple[str, ast.Call]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            found.append((ast.unparse(node.func), node))
    return found


def test_no_load_path_can_run_code():
    offenders = []
    for path in SOURCES:
        for name, call in _calls(path):
            keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
            where = f"{path.relative_to(ROOT)}:{call.lineno} {name}"
            if name in {"pickle.load", "pickle.loads", "marshal.loads", "yaml.load", "eval"}:
                offenders.append(where)
            if name == "torch.load" and keywords.get("weights_only") != "True":
                offenders.append(where + " without weights_only=True")
            if name.endswith("np.load") and keywords.get("allow_pickle") == "True":
                offenders.append(where + " with allow_pickle=True")
    assert not offenders, offenders


def test_the_only_unpickler_is_the_restricted_one():
    users = [p.relative_to(ROOT).as_posix() for p in SOURCES if "Unpickler" in p.read_text()]
    assert users == ["autosearch/data/_readers.py"]


class _Payload:
    def __reduce__(self):
        return (print, ("pwned",))


@pytest.mark.parametrize("kind", ["smuggled code", "random bytes"])
def test_an_unreadable_checkpoint_is_set_aside_never_run(kind, tmp_path, digits, capfd, caplog):
    from autosearch import TrainConfig
    from autosearch.train import train

    checkpoint = tmp_path / "run.pt"
    if kind == "smuggled code":
        torch.save({"epoch": 1, "model": _Payload()}, checkpoint)
    else:
        checkpoint.write_bytes(bytes(range(256)) * 40)
    before = checkpoint.read_bytes()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    result = train(model, digits, TrainConfig(epochs=2), seed=0, checkpoint=checkpoint)
    assert [e.epoch for e in result.history] == [1, 2]  # trained from scratch
    assert "pwned" not in capfd.readouterr().out
    aside = tmp_path / "run.pt.unreadable"
    assert aside.read_bytes() == before  # kept for a look, out of the way
    assert "cannot be read" in caplog.text and "weights_only" not in caplog.text
    assert torch.load(checkpoint, weights_only=True)["epoch"] == 2  # a new, good one


# A stored study names code (a sampler class, an NNI model space) by a dotted path:
# opening it must never import a module that path names.
EVIL = "from pathlib import Path\nPath('imported').write_text('yes')\nclass X: pass\n"


def _edit_definition(study, change) -> None:
    stored = study.storage.get_study_user_attrs(study._study_id)["autosearch"]
    change(stored)
    study.storage.set_study_user_attr(study._study_id, "autosearch", stored)


def _open_elsewhere(folder: Path, url: str, name: str):
    """Open the study in a fresh process whose working folder holds evilmod.py (so the
    module is importable, as a file beside a study someone sent would be)."""
    import subprocess
    import sys

    (folder / "evilmod.py").write_text(EVIL)
    code = f"import autosearch; autosearch.load_study({name!r}, storage={url!r})"
    cli = Path(sys.executable).with_name("autosearch")
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=1800
    )
    status = subprocess.run(
        [str(cli), "status", "--study", name, "--storage", url],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return loaded, status


def test_a_stored_sampler_path_is_never_imported(make_study, tiny_space, tmp_path):
    from controllers import OptunaController

    study = make_study("s", controller=OptunaController(tiny_space, sampler="tpe", seed=0))
    _edit_definition(study, lambda d: d["controller"]["config"].update(sampler="evilmod.X"))
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    loaded, status = _open_elsewhere(folder, study.storage_url, "s")
    assert not (folder / "imported").exists()
    assert loaded.returncode != 0 and "never imports code named by a stored study" in loaded.stderr
    assert status.returncode == 2 and "Traceback" not in status.stderr
    assert "register_sampler" in status.stderr and len(status.stderr.strip().splitlines()) == 1


def test_a_stored_nni_factory_is_never_imported(make_study, tmp_path):
    pytest.importorskip("nni", reason="the NNI adapter is an optional extra ('autosearch[nni]')")
    from controllers import RandomSearch
    from search_spaces import from_nni

    space = from_nni("search_spaces.nni_examples:SmallCNN")
    study = make_study("n", controller=RandomSearch(space, seed=0))
    _edit_definition(study, lambda d: d["space"]["config"].update(factory="evilmod:X"))
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    loaded, status = _open_elsewhere(folder, study.storage_url, "n")
    assert not (folder / "imported").exists()
    assert loaded.returncode != 0 and "never imports code named by a stored study" in loaded.stderr
    assert status.returncode == 2 and "Traceback" not in status.stderr


def test_code_the_caller_imported_or_registered_is_used(make_study, tiny_space):
    import optuna

    from controllers import OptunaController, register_sampler

    register_sampler("qmc-test", optuna.samplers.QMCSampler)
    study = make_study("r", controller=OptunaController(tiny_space, sampler="qmc-test", seed=0))
    assert study.controller.ask().space == tiny_space.name
    sobol = OptunaController(tiny_space, sampler="optuna.samplers.QMCSampler", seed=0)
    assert sobol.ask().space == tiny_space.name
