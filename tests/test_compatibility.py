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
    assert read.trials.unreadable == {}
    earlier = {r.arch for r in read.records()}
    study = autosearch.load_study(name, storage=stored)
    if name == "shared":  # its supernet, stored before digests: used as it is, not retrained
        state = study.supernet.train()
        assert state["epochs"] == 1 and "digest" in state and state["round"] == 0
    best = study.best()
    out = study.export(best, tmp_path / "export")
    assert (out / "model.py").is_file() and (out / "model.safetensors").is_file()
    reloaded = study.load_model(best)
    assert sum(p.numel() for p in reloaded.parameters()) == best.params
    (more,) = study.optimize(1)  # the controller replayed the stored trials, and goes on
    assert more.trial == 2 and more.state == "complete"
    assert more.arch not in earlier


def test_import_autosearch_leaves_the_interpreter_as_it_found_it():
    """A library leaves the collector and the import machinery to the program that
    owns the process (the command line settles its own: autosearch/cli)."""
    state = "(gc.isenabled(), gc.get_freeze_count(), gc.get_threshold(), list(sys.meta_path))"
    code = (
        "import gc, sys\n"
        "gc.set_threshold(1234, 5, 6)\n"
        f"before = {state}\n"
        "import autosearch\n"
        "autosearch.create_study, autosearch.TrainConfig, autosearch.report.plots.pareto\n"
        f"after = {state}\n"
        "assert before == after, (before, after)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=1800)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_version_is_one_and_the_changelog_names_it():
    import tomllib

    root = Path(__file__).resolve().parents[1]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    changelog = (root / "CHANGELOG.md").read_text()
    first = next(line for line in changelog.splitlines() if line.startswith("## "))
    assert autosearch.__version__ == declared and first.startswith(f"## {declared} (")
