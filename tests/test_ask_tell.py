"""Ask and tell: candidates run by a loop of the user's own, beside optimize, with the
same claims, storage and resume (autosearch.study.asked)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import autosearch
from autosearch import ConfigError


def _train(model, data, steps: int = 20) -> float:
    """A user's few steps of their own, then their own validation accuracy."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data.normalize(data.train.x.float()), data.train.y
    for index in torch.arange(len(y)).split(64)[:steps]:
        optimizer.zero_grad()
        F.cross_entropy(model(x[index]), y[index]).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        predicted = model(data.normalize(data.val.x.float())).argmax(1)
    return float((predicted == data.val.y).float().mean())


def test_a_candidate_asked_trained_and_told_is_a_trial(make_study, tmp_path):
    study = make_study("asked")
    trial = study.ask()
    assert trial.number == 0 and trial.seed > 0 and trial.description
    model = trial.build()
    assert not trial.report(1, 0.2)  # no early stopping in this study
    accuracy = _train(model, study.data)
    record = study.tell(trial, {"accuracy": accuracy, "f1": 0.5}, model=model)
    assert record.state == "complete" and record.accuracy == pytest.approx(accuracy)
    assert record.metrics["f1"] == 0.5 and record.flops > 0 and record.metrics["bytes"] > 0
    assert study.trials.curves()[0] == {1: 0.2}
    assert (study.export(record, tmp_path / "best") / "model.py").is_file()
    assert len(study.controller.state_dict()) > 0


def test_without_the_model_the_costs_are_counted_from_the_architecture(make_study):
    study = make_study("counted")
    trial = study.ask()
    record = study.tell(trial, {"accuracy": 0.75})
    data = study.data
    cost = study.space.cost(trial.arch, input_shape=data.input_shape, num_classes=data.num_classes)
    assert record.flops == cost.flops and record.params == cost.params


def test_ask_tell_and_optimize_share_one_study(make_study):
    study = make_study("both")
    asked = [study.ask() for _ in range(2)]
    assert len({t.arch.arch_id for t in asked}) == 2  # two claims, two architectures
    for trial in asked:
        study.tell(trial, {"accuracy": 0.5})
    done = study.optimize(2)
    numbers = [r.trial for r in study.records(variants=False)]
    assert numbers == [0, 1, 2, 3] and [r.trial for r in done] == [2, 3]
    ids = [r.arch.arch_id for r in study.records(variants=False)]
    assert len(set(ids)) == 4  # the controller knew what was told: nothing proposed twice
    again = autosearch.load_study("both", storage=study.storage_url)
    assert len(again.records(variants=False)) == 4


def test_a_trial_told_failed_or_with_bad_figures_fails_with_its_reason(make_study):
    study = make_study("failing")
    told = study.tell(study.ask(), failed="out of memory on my GPU")
    assert told.state == "failed" and "told failed: out of memory on my GPU" in told.reason
    nan = study.tell(study.ask(), {"accuracy": float("nan")})
    assert nan.state == "failed" and "accuracy=nan" in nan.reason
    missing = study.tell(study.ask(), {"f1": 0.3})
    assert missing.state == "failed" and "returned no 'accuracy'" in missing.reason


def test_what_cannot_be_told_is_refused_in_one_line(make_study):
    study = make_study("refused")
    trial = study.ask()
    with pytest.raises(ConfigError, match="the trial's figures, or failed="):
        study.tell(trial)
    with pytest.raises(ConfigError, match="report\\(epoch=1\\) after epoch 2"):
        trial.report(2, 0.5)
        trial.report(1, 0.6)
    with pytest.raises(ConfigError, match="a validation accuracy in \\[0, 1\\]"):
        trial.report(3, 1.5)
    study.tell(trial, {"accuracy": 0.5})
    with pytest.raises(ConfigError, match="was told already"):
        study.tell(trial, {"accuracy": 0.5})
    with pytest.raises(ConfigError, match="a trial this study's ask\\(\\) returned"):
        study.tell("trial 0", {"accuracy": 0.5})


def test_a_stopped_trial_is_stored_as_stopped(make_study):
    study = make_study("stopped")
    trial = study.ask()
    trial.report(1, 0.3)
    record = study.tell(trial, {"accuracy": 0.3}, stopped=True)
    assert record.state == "stopped" and record.metrics["stopped_at_epoch"] == 1.0


def test_a_trial_asked_by_a_process_that_died_is_asked_again(make_study, tmp_path):
    study = make_study("died")
    script = textwrap.dedent(
        f"""
        import os, autosearch
        study = autosearch.load_study("died", storage={study.storage_url!r})
        trial = study.ask()
        print(trial.arch.arch_id, flush=True)
        os._exit(9)  # dies before telling
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=os.environ
    )
    assert done.returncode == 9, done.stderr
    held = done.stdout.split()[-1]
    again = study.ask()  # its process is gone: the cut trial is taken up first
    assert again.arch.arch_id == held and again.number == 1
    record = study.tell(again, {"accuracy": 0.6})
    assert record.state == "complete"
    assert [r.state for r in study.records(variants=False)] == ["complete"]


def test_a_read_only_study_asks_nothing(make_study):
    study = make_study("read")
    study.optimize(1)
    read = autosearch.load_study("read", storage=study.storage_url, read_only=True)
    with pytest.raises(autosearch.StudyError, match="opened read-only"):
        read.ask()
