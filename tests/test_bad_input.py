"""Bad input, kind by kind: each gets a clear error that says what was wrong and how to
fix it, and leaves everything stored exactly as it was."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import numpy as np
import optuna
import pytest

import autosearch
import autosearch.export.retrain
import autosearch.report
import autosearch.studyfile
from autosearch import (
    AutosearchError,
    ConfigError,
    DataError,
    ExportError,
    StorageError,
    StudyError,
    StudyFileError,
    TrainConfig,
    UnknownNameError,
)
from autosearch.errors import InvalidArchitectureError
from controllers import RandomSearch
from search_spaces import DenseNetSpace, ResNetSpace


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A study with one trial, made once for the module (each test gets a copy)."""
    import sqlite3

    folder = tmp_path_factory.mktemp("kept")
    space = ResNetSpace(
        min_stages=2, max_stages=2, depths=(1, 2), widths=(4, 8), stem_widths=(4, 8),
        blocks=("basic",),
    )  # fmt: skip  # the suite's tiny_space
    study = autosearch.create_study(
        "kept",
        controller=RandomSearch(space, seed=0),
        storage=f"sqlite:///{folder}/made.db",
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
    )
    study.optimize(1)
    with sqlite3.connect(folder / "made.db") as db:  # its last commits out of the WAL
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    # Its stored folder gone, a copy moved with its artifacts uses the ones beside it.
    (folder / "artifacts").rename(folder / "artifacts.made")
    return folder


@pytest.fixture
def stored(made, tmp_path, monkeypatch):
    """A copy of the module's one-trial study (its database and artifacts folder, moved
    as a user would move them), and a fingerprint of everything stored on disk."""
    import shutil

    monkeypatch.chdir(tmp_path)
    shutil.copyfile(made / "made.db", tmp_path / "kept.db")
    shutil.copytree(made / "artifacts.made", tmp_path / "artifacts")
    study = autosearch.load_study("kept", storage=f"sqlite:///{tmp_path}/kept.db")
    assert study._artifacts.folder == tmp_path / "artifacts"  # the copy's own, not the module's

    def fingerprint() -> dict[str, str]:
        return {
            str(p.relative_to(tmp_path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tmp_path.rglob("*"))
            if p.is_file()
        }

    return study, fingerprint


def _create(study, **changes):
    options = {
        "controller": RandomSearch(study.space, seed=0),
        "storage": study.storage_url,
        "train": study.definition.train,
    }
    return autosearch.create_study("other", **{**options, **changes})


def _idx_folder(folder: Path, body: bytes) -> str:
    folder.mkdir(exist_ok=True)
    for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        (folder / f"{stem}.gz").write_bytes(gzip.compress(body))
    for stem in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (folder / f"{stem}.gz").write_bytes(gzip.compress(body))
    return f"mnist:{folder}"


def _study_file(tmp: Path, text: str) -> Path:
    path = tmp / "bad_study.py"
    path.write_text(text)
    return path


# An IDX header promising 10 images of 10 x 10, followed by five bytes.
_TRUNCATED = b"\x00\x00\x08\x03" + (10).to_bytes(4, "big") * 3 + b"short"

CASES = {
    # names, with suggestions
    "unknown space": (
        lambda s, t: _create(s, controller="random", space="resnt"),
        UnknownNameError,
        "Did you mean 'resnet'",
    ),
    "unknown controller": (
        lambda s, t: _create(s, controller="randm", space=s.space),
        UnknownNameError,
        "Did you mean 'random'",
    ),
    "unknown variant": (
        lambda s, t: _create(s, variants=("base", "int9")),
        UnknownNameError,
        "int8",
    ),
    "unknown objective": (
        lambda s, t: _create(s, objectives=("acuracy", "flops")),
        UnknownNameError,
        "Did you mean 'accuracy'",
    ),
    "unknown reward": (lambda s, t: _create(s, reward="mnaz"), UnknownNameError, "mnas"),
    "malformed reward": (
        lambda s, t: _create(s, reward="mnas@flops=lots"),
        AutosearchError,
        "mnas@flops=lots': target and w must be numbers",
    ),
    "unknown dataset": (
        lambda s, t: _create(s, data="digit"),
        UnknownNameError,
        "Did you mean 'digits'",
    ),
    "duplicate objectives": (
        lambda s, t: _create(s, objectives=("accuracy", "accuracy")),
        ConfigError,
        "distinct",
    ),
    # study files
    "study file with a syntax error": (
        lambda s, t: autosearch.studyfile.load_spec(_study_file(t, "study = (\n")),
        StudyFileError,
        "bad_study.py",
    ),
    "study file defining no study": (
        lambda s, t: autosearch.studyfile.load_spec(_study_file(t, "x = 1\n")),
        StudyFileError,
        "defines no study",
    ),
    # architectures
    "architecture from another space": (
        lambda s, t: ResNetSpace().validate(DenseNetSpace().sample(np.random.default_rng(0))),
        InvalidArchitectureError,
        "belongs to space 'densenet', not 'resnet'",
    ),
    "architecture with a foreign gene": (
        lambda s, t: ResNetSpace().make({"block1.layers": 2}),
        InvalidArchitectureError,
        "has no gene 'block1.layers'",
    ),
    # data
    "missing dataset folder": (
        lambda s, t: _create(s, data=f"folder:{t}/nowhere"),
        DataError,
        "needs one sub-folder of images per class",
    ),
    "corrupt dataset file": (
        lambda s, t: _create(s, data=_idx_folder(t / "idx", _TRUNCATED)),
        DataError,
        "truncated or corrupt",
    ),
    "wrong image shapes": (
        lambda s, t: _create(s, data=(np.zeros((30, 5)), np.zeros(30, int))),
        DataError,
        r"images must be \(N, H, W\)",
    ),
    "labels that are not integers": (
        lambda s, t: _create(s, data=(np.zeros((30, 8, 8)), np.full(30, 0.5))),
        DataError,
        "labels must be integers",
    ),
    "labels out of range for every sample": (
        lambda s, t: autosearch.data.load_data(
            (np.random.default_rng(0).random((30, 8, 8)), np.full(30, 7)), num_classes=3
        ),
        DataError,
        "no usable samples.*30 have labels outside 0..2",
    ),
    # storage and files
    "malformed storage URL": (
        lambda s, t: _create(s, storage="mongodb://localhost/db"),
        StorageError,
        "unknown storage scheme 'mongodb'.*sqlite:///path/study.db",
    ),
    "storage URL without a scheme": (
        lambda s, t: _create(s, storage="runs/x.db"),
        StorageError,
        "has no scheme",
    ),
    "unreachable PostgreSQL": (
        lambda s, t: _create(s, storage="postgresql://postgres@127.0.0.1:1/nowhere"),
        StorageError,
        "cannot open storage",
    ),
    "unwritable export folder": (
        lambda s, t: s.export(s.record(0), "/proc/autosearch-export"),
        ExportError,
        "cannot create export folder",
    ),
    "unwritable report path": (
        lambda s, t: autosearch.report.write_report(s, "/proc/autosearch/report.html"),
        ExportError,
        "cannot write the report",
    ),
    # continuing a stored study
    "resuming with another space": (
        lambda s, t: autosearch.create_study(
            "kept",
            controller=RandomSearch(ResNetSpace(max_stages=2), seed=0),
            storage=s.storage_url,
            train=s.definition.train,
            load_if_exists=True,
        ),
        StudyError,
        "stored with a different definition",
    ),
    "resuming with other objectives": (
        lambda s, t: autosearch.create_study(
            "kept",
            controller=RandomSearch(s.space, seed=0),
            storage=s.storage_url,
            train=s.definition.train,
            objectives=("accuracy", "params"),
            load_if_exists=True,
        ),
        StudyError,
        "objectives: stored",
    ),
    "creating a study that exists": (
        lambda s, t: autosearch.create_study(
            "kept", controller=RandomSearch(s.space, seed=0), storage=s.storage_url
        ),
        StudyError,
        "already exists",
    ),
    "a trial that does not exist": (lambda s, t: s.rerun(99), StudyError, "no trial number 99"),
    "negative trial budget": (
        lambda s, t: s.optimize(-1),
        ConfigError,
        "n_trials must be an integer >= 0, got -1",
    ),
    "no workers": (lambda s, t: s.optimize(1, n_workers=0), ConfigError, "n_workers must be"),
    "a negative total": (
        lambda s, t: s.optimize(1, total=-1),
        ConfigError,
        "total must be None or an integer >= 0, got -1",
    ),
    "a study name of only spaces": (
        lambda s, t: autosearch.create_study("  ", controller=RandomSearch(s.space, seed=0)),
        ConfigError,
        "must not start or end with spaces .*got '  ': it is only spaces",
    ),
    "a study name past the file system's 255 bytes": (
        lambda s, t: autosearch.create_study("é" * 200, controller=RandomSearch(s.space, seed=0)),
        StorageError,
        r"no default storage: its name is 400 bytes long, and a folder's name holds at most 255",
    ),
    "a variant never measured": (
        lambda s, t: s.best(variant="int8"),
        StudyError,
        "no complete 'int8' record",
    ),
    "training an export folder that is not one": (
        lambda s, t: autosearch.export.retrain.train_export(t, s.data, s.definition.train),
        ExportError,
        "has no model.py",
    ),
    "a training config that cannot train": (
        lambda s, t: TrainConfig(epochs=0),
        ConfigError,
        "TrainConfig epochs=0 cannot be used: expected an integer >= 1",
    ),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_bad_input_is_refused_clearly_and_changes_nothing_stored(kind, stored, tmp_path):
    study, fingerprint = stored
    action, error, message = CASES[kind]
    before = fingerprint()
    with pytest.raises(error, match=message):
        action(study, tmp_path)
    after = fingerprint()
    # New files may appear only outside the stored study (a test's own inputs).
    assert {k: v for k, v in after.items() if k in before} == before
    assert not any(k.endswith((".db", ".safetensors", ".pt")) for k in set(after) - set(before))
    # The study, and its companion of job claims (measuring the front is one job a point).
    assert optuna.get_all_study_names(study.storage_url) == ["kept", "kept.autosearch-jobs"]
    assert [r.trial for r in study.records()] == [0]


def test_there_are_at_least_twenty_kinds():
    assert len(CASES) >= 20


def test_bad_environment_settings_are_named(monkeypatch, tiny_space, tmp_path):
    from autosearch.data import memory_budget

    monkeypatch.setenv("AUTOSEARCH_HEARTBEAT_INTERVAL", "soon")
    with pytest.raises(ConfigError, match="AUTOSEARCH_HEARTBEAT_INTERVAL='soon'"):
        autosearch.create_study(
            "env", controller=RandomSearch(tiny_space, seed=0), storage=f"sqlite:///{tmp_path}/e.db"
        )
    monkeypatch.setenv("AUTOSEARCH_DATA_MEMORY", "plenty")
    with pytest.raises(DataError, match="is not a size"):
        memory_budget()
