"""Stored studies of an earlier version open and resume as before: a study database
made by autosearch at 8b3b3c6 (tests/fixtures/study-8b3b3c6, made by its make.py) with a
trained study and a supernet study, two trials each, read, exported and continued by
today's code."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import autosearch

FIXTURE = Path(__file__).parent / "fixtures" / "study-8b3b3c6"
STORED = {  # what 8b3b3c6 recorded: trial -> validation accuracy (4 places)
    "trained": {0: 0.2083, 1: 0.1111},
    "shared": {0: 0.1806, 1: 0.1306},
}


@pytest.fixture
def stored(tmp_path) -> str:
    """A copy of the fixture (a study is opened for writing; the repository's copy is
    never changed), moved to another folder as a user would move it."""
    folder = tmp_path / "moved"
    shutil.copytree(FIXTURE, folder, ignore=shutil.ignore_patterns("*.py"))
    return f"sqlite:///{folder}/study.db"


@pytest.mark.parametrize("name", sorted(STORED))
def test_a_study_of_the_earlier_version_reads_exports_and_resumes(name, stored, tmp_path):
    read = autosearch.load_study(name, storage=stored, read_only=True)
    assert {r.trial: round(r.accuracy, 4) for r in read.records()} == STORED[name]
    assert read.unreadable == {}
    earlier = {r.arch for r in read.records()}
    study = autosearch.load_study(name, storage=stored)
    if name == "shared":  # its supernet, stored before digests: used as it is, not retrained
        state = study.train_supernet()
        assert state["epochs"] == 1 and "digest" in state and state["round"] == 0
    best = study.best()
    out = study.export(best, tmp_path / "export")
    assert (out / "model.py").is_file() and (out / "model.safetensors").is_file()
    reloaded = study.load_model(best)
    assert sum(p.numel() for p in reloaded.parameters()) == best.params
    (more,) = study.optimize(1)  # the controller replayed the stored trials, and goes on
    assert more.trial == 2 and more.state == "complete"
    assert more.arch not in earlier


# Module paths of 0.1.0 (issue 53): importable for a release, with a warning -------------
def _import_in_a_fresh_process(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        capture_output=True,
        text=True,
        timeout=1800,
    )


def test_every_moved_module_imports_as_its_new_path_with_one_warning():
    from autosearch._moved import MOVED

    checks = "\n".join(
        f"import {old}\nimport {new}\nassert sys.modules[{old!r}] is {new} and {old} is {new}"
        for old, new in MOVED.items()
    )
    done = _import_in_a_fresh_process(f"import sys\nimport autosearch\n{checks}\n")
    assert done.returncode == 0, done.stderr[-3000:]
    warned = [line for line in done.stderr.splitlines() if "FutureWarning" in line]
    assert len(warned) == len(MOVED), done.stderr
    for old, new in MOVED.items():
        assert any(f"{old} moved to {new}; import it from there" in w for w in warned), old
    assert all(w.startswith("<string>:") for w in warned)  # the warning points at the import


def test_the_old_paths_are_the_renamed_modules_and_their_names_still_work():
    """From 0.1.0's documentation: `from autosearch.train import TrainConfig`, ..."""
    code = (
        "import autosearch\nfrom autosearch.train import TrainConfig\n"
        "from autosearch.cost import measure\nfrom autosearch.pareto import pareto_mask\n"
        "import autosearch.plots as plots\nimport autosearch.report.plots as new\n"
        "assert TrainConfig is autosearch.TrainConfig and plots is new\n"
        "assert measure.__module__ == 'autosearch.scoring.cost'\n"
    )
    done = _import_in_a_fresh_process(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "autosearch.plots" not in done.stderr  # the documented name: no warning


def test_the_version_is_one_and_the_changelog_names_it():
    import tomllib

    root = Path(__file__).resolve().parents[1]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    changelog = (root / "CHANGELOG.md").read_text()
    first = next(line for line in changelog.splitlines() if line.startswith("## "))
    assert autosearch.__version__ == declared and first.startswith(f"## {declared} (")
