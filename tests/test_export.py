from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from autosearch import ExportError

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


def test_export_round_trip_in_a_process_without_autosearch(make_study, digits, tmp_path):
    study = make_study()
    study.optimize(2)
    record = study.best()
    out = study.export(record, tmp_path / "best")
    assert sorted(p.name for p in out.iterdir()) == ["arch.json", "model.py", "model.safetensors"]
    card = json.loads((out / "arch.json").read_text())
    assert card["arch_id"] == record.arch.arch_id
    assert card["metrics"]["accuracy"] == record.accuracy and "2 x MACs" in card["conventions"]

    images = digits.test.x[:32]
    torch.save(images, out / "images.pt")
    subprocess.run([sys.executable, "-c", _ONLY_TORCH], cwd=out, check=True, timeout=120)
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
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "blocked for the test: autosearch" in result.stderr


def test_export_of_a_failed_trial_is_refused(make_study, monkeypatch, tmp_path):
    from autosearch import study as study_module

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(study_module, "run_trial", broken)
    study = make_study()
    (record,) = study.optimize(1)
    with pytest.raises(ExportError, match="trial 0 is failed"):
        study.export(record, tmp_path / "x")


def test_missing_weights_say_where_they_were_looked_for(make_study, tmp_path):
    import shutil

    study = make_study()
    study.optimize(1)
    shutil.rmtree(study.artifacts_dir)
    with pytest.raises(ExportError, match="missing from .*artifacts"):
        study.export(study.best(), tmp_path / "x")
