"""Bring your own training: a user's evaluator trains each candidate through the study's
seam (autosearch.evaluation.user), and the study does everything else as for its own
trainer: storage, workers, early stopping, resume after a kill, variants, export."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import _evaluators
import pytest

import autosearch
from autosearch import ConfigError, StudyError, TrainConfig
from autosearch.training.early_stopping import SuccessiveHalving


@pytest.fixture
def two_epochs() -> TrainConfig:
    return TrainConfig(epochs=2, batch_size=128, lr=0.1)


def test_a_users_loop_trains_every_candidate(make_study, two_epochs, monkeypatch, tmp_path):
    from autosearch.evaluation import runner

    monkeypatch.setattr(
        runner, "train_candidate", lambda *a, **k: pytest.fail("trained by autosearch")
    )
    study = make_study("own", evaluator=_evaluators.plain_loop, train=two_epochs)
    records = study.optimize(3)
    assert [r.state for r in records] == ["complete"] * 3
    for record in records:
        assert record.metrics["my_figure"] == 42.0  # whatever the evaluator measures is kept
        assert 0.0 <= record.accuracy <= 1.0 and record.test_accuracy is not None
        assert record.flops > 0 and record.params > 0  # costs counted by the study
    assert all(list(curve) == [1, 2] for curve in study.trials.curves().values())
    best = study.best()
    folder = study.export(best, tmp_path / "best")
    assert (folder / "model.py").is_file()
    model = study.load_model(best)  # the trained weights the evaluator left in the model
    assert sum(p.numel() for p in model.parameters()) == best.params
    assert study.definition.evaluator == "_evaluators:plain_loop"


def test_reading_needs_no_evaluator_but_running_needs_the_same_one(make_study, two_epochs):
    study = make_study("stored", evaluator=_evaluators.fixed, train=two_epochs)
    study.optimize(2)
    url = study.storage_url
    read = autosearch.load_study("stored", storage=url)
    assert len(read.records()) == 2 and len(read.records_dataframe()) == 2
    with pytest.raises(ConfigError, match="trains its candidates with evaluator _evaluators:fixed"):
        read.optimize(1)
    with pytest.raises(ConfigError, match="not _evaluators:raises"):
        autosearch.load_study("stored", storage=url, evaluator=_evaluators.raises)
    again = autosearch.load_study("stored", storage=url, evaluator=_evaluators.fixed)
    assert len(again.optimize(1)) == 1
    with pytest.raises(StudyError, match="evaluator"):  # another definition, another study
        make_study("stored", evaluator=_evaluators.raises, train=two_epochs, load_if_exists=True)
    plain = make_study("plain")
    with pytest.raises(ConfigError, match="trains its candidates with autosearch's trainer"):
        autosearch.load_study("plain", storage=plain.storage_url, evaluator=_evaluators.fixed)


@pytest.mark.parametrize(
    ("evaluator", "reason"),
    [
        (_evaluators.raises, "RuntimeError: my loader broke"),
        (_evaluators.nan_accuracy, "accuracy=nan: figures are finite numbers"),
        (_evaluators.no_accuracy, "returned no 'accuracy'"),
        (_evaluators.text_accuracy, "accuracy='high': figures are numbers"),
        (_evaluators.out_of_order, "report(epoch=1) after epoch 2"),
        (_evaluators.returns([0.9]), "returned list; return a dict of figures"),
        (_evaluators.returns({"accuracy": 7.0}), "accuracy=7.0: a validation accuracy in [0, 1]"),
    ],
)
def test_a_failing_evaluator_fails_its_trial_with_the_reason(make_study, evaluator, reason):
    study = make_study("fails", evaluator=evaluator)
    records = study.optimize(2)
    assert [r.state for r in records] == ["failed", "failed"]
    assert all(reason in r.reason for r in records), records[0].reason


def test_what_is_not_an_evaluator_is_refused_before_anything_is_stored(make_study, tmp_path):
    with pytest.raises(ConfigError, match="evaluator must be a function or an object"):
        make_study("bad", evaluator="my_module:evaluate")
    with pytest.raises(ConfigError, match="trains none: give one of them"):
        make_study(
            "table",
            evaluator=_evaluators.fixed,
            table=autosearch.Table(path=str(tmp_path / "t.csv")),
        )
    assert not list(tmp_path.glob("*.db"))


def test_early_stopping_reads_the_epochs_an_evaluator_reports(make_study):
    study = make_study(
        "halving",
        evaluator=_evaluators.plain_loop,
        train=TrainConfig(epochs=3, batch_size=128),
        early_stopping=SuccessiveHalving(min_epochs=1, reduction=3),
    )
    records = study.optimize(6)
    assert "stopped" in {r.state for r in records} and "complete" in {r.state for r in records}
    for record in records:
        if record.state == "stopped":
            assert record.metrics["stopped_at_epoch"] < 3


def test_an_evaluator_that_scores_a_network_scores_the_variants(make_study, two_epochs):
    study = make_study(
        "variants", evaluator=_evaluators.Scoring(), variants=("base", "int8"), train=two_epochs
    )
    study.optimize(2)
    int8 = [r for r in study.records() if r.variant == "int8"]
    assert len(int8) == 2 and all(r.state == "complete" and 0 <= r.accuracy <= 1 for r in int8)
    assert all("estimated" not in r.metrics for r in int8)  # real variants, scored


def test_an_evaluator_that_cannot_score_a_network_skips_the_variants_and_says_so(
    make_study, two_epochs, caplog
):
    with caplog.at_level(logging.WARNING):
        study = make_study(
            "skips", evaluator=_evaluators.fixed, variants=("base", "int8"), train=two_epochs
        )
    assert "variants int8 will be skipped: evaluator _evaluators:fixed" in caplog.text
    study.optimize(2)
    assert {r.variant for r in study.records()} == {"base"}
    note = study.optuna_study.get_trials()[0].user_attrs["result"].get("note", "")
    assert "variants int8 skipped" in note


@pytest.mark.slow
def test_pool_workers_receive_the_evaluator(make_study, two_epochs, tmp_path):
    study = make_study(
        "pool",
        evaluator=_evaluators.plain_loop,
        train=two_epochs,
        storage=f"journal:{tmp_path}/study.log",
    )
    records = study.optimize(4, n_workers=2)
    assert len(records) == 4 and {r.state for r in records} == {"complete"}


def test_an_evaluator_workers_cannot_receive_is_refused_before_they_start(make_study):
    study = make_study("lambda", evaluator=lambda candidate: {"accuracy": 0.5})
    with pytest.raises(ConfigError, match="cannot be sent to worker processes"):
        study.optimize(2, n_workers=2)
    assert study.trials.count() == 0


@pytest.mark.service
def test_on_postgresql(make_study, two_epochs, postgres_url):
    study = make_study(
        "pg", evaluator=_evaluators.plain_loop, train=two_epochs, storage=postgres_url
    )
    assert [r.state for r in study.optimize(2)] == ["complete", "complete"]


def _worker(
    url: str, *options: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    cli = Path(sys.executable).with_name("autosearch")
    tests = str(Path(__file__).parent)
    return subprocess.run(
        [str(cli), "worker", "--study", "killed", "--storage", url, *options],
        env={**os.environ, "PYTHONPATH": tests, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tests,
    )


@pytest.mark.slow
def test_a_worker_killed_mid_trial_resumes_from_the_evaluators_checkpoint(make_study, tmp_path):
    study = make_study("killed", evaluator=_evaluators.plain_loop, train=TrainConfig(epochs=3))
    url, marker = study.storage_url, tmp_path / "died"
    die = {"AUTOSEARCH_TEST_DIE_AT": f"0:1:{marker}"}
    first = _worker(url, "--n-trials", "1", "--evaluator", "_evaluators:plain_loop", env=die)
    assert first.returncode == -9 or first.returncode == 9, first.stdout + first.stderr
    assert marker.is_file()  # it died after epoch 1, its checkpoint saved
    second = _worker(url, "--n-trials", "1", "--evaluator", "_evaluators:plain_loop", env=die)
    assert second.returncode == 0, second.stdout + second.stderr
    done = autosearch.load_study("killed", storage=url)
    (record,) = done.records(variants=False)  # the cut trial, resumed as a new one
    assert record.state == "complete"
    # The first attempt died after saving epoch 1 and before reporting it: the second
    # resumed from that checkpoint and reported epochs 2 and 3 only.
    assert list(done.trials.curves()[record.trial]) == [2, 3]


def test_the_worker_says_in_one_line_what_it_cannot_import(make_study):
    study = make_study("killed", evaluator=_evaluators.fixed)
    for given, said in [
        ("no_such_module:evaluate", "cannot import no_such_module (ModuleNotFoundError"),
        ("_evaluators:absent", "_evaluators has no absent"),
        ("just_a_name", "expected MODULE:NAME"),
    ]:
        done = _worker(study.storage_url, "--evaluator", given)
        assert done.returncode == 2, done.stderr
        assert said in done.stderr and "Traceback" not in done.stderr
    missing = _worker(study.storage_url, "--n-trials", "1")
    assert missing.returncode == 2 and "--evaluator _evaluators:fixed" in missing.stderr


def test_a_figure_of_the_evaluator_declared_an_objective_shapes_the_front(make_study):
    study = make_study(
        "f1",
        evaluator=_evaluators.with_f1,
        objectives=("f1", "flops"),
        metrics={"f1": "maximize"},
    )
    study.optimize(4)
    assert study.definition.directions == ["maximize", "minimize"]
    front = study.pareto()
    assert front and all("f1" in r.metrics for r in front)
    trial = study.optuna_study.get_trials()[front[0].trial]
    assert trial.values[0] == front[0].metrics["f1"]  # Optuna's tools see the objective
    # A fresh process learns the declared metric from the stored definition.
    probe = (
        "import autosearch; "
        f"s = autosearch.load_study('f1', storage={study.storage_url!r}, read_only=True); "
        "print(sorted(r.trial for r in s.pareto()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=600
    )
    assert done.stdout.split("\n")[-2] == str(sorted(r.trial for r in front)), done.stderr


def test_an_evaluator_that_does_not_return_a_declared_objective_fails_its_trial(make_study):
    study = make_study(
        "nof1", evaluator=_evaluators.fixed, objectives=("f1", "flops"), metrics={"f1": "maximize"}
    )
    (record,) = study.optimize(1)
    assert record.state == "failed" and "returned no 'f1'" in record.reason


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"metrics": {"f1": "maximize"}}, "has no evaluator="),
        (
            {"evaluator": _evaluators.fixed, "metrics": {"accuracy": "minimize"}},
            "'accuracy' is autosearch's own",
        ),
        ({"evaluator": _evaluators.fixed, "metrics": {"f1": "upwards"}}, "'maximize' or"),
        ({"evaluator": _evaluators.fixed, "objectives": ("f2", "flops")}, "f2"),
    ],
)
def test_declared_metrics_are_checked_before_anything_is_stored(
    make_study, tmp_path, options, said
):
    with pytest.raises(autosearch.AutosearchError, match=said):
        make_study("declared", **options)
    assert not list(tmp_path.glob("*.db"))
