"""A study's architecture trained as a population, as a trial of the study: its winner is
the trial's network, the population is trained once across workers and calls, a trial
cut short resumes it to the same rounds and winner, and the controller never hears it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from optuna.distributions import FloatDistribution

import autosearch
from autosearch import ConfigError, TrainConfig
from autosearch.population import trial as population_study
from autosearch.population.trial import population_key
from autosearch.report import write_report
from autosearch.training.train import evaluate

TRAIN = TrainConfig(epochs=2, batch_size=128, lr=0.1)


def _population(**changes) -> autosearch.PopulationBasedTraining:
    options = {
        "size": 2,
        "interval": 1,
        "seed": 0,
        "mutations": {"lr": FloatDistribution(0.02, 0.5, log=True)},
    }
    return autosearch.PopulationBasedTraining(**{**options, **changes})


def _stored(study, record):
    return study.trials.get(record.trial).user_attrs["result"]["population"]


def test_the_best_architecture_trained_as_a_population_is_a_trial_of_its_own(make_study):
    study = make_study(train=TRAIN)
    study.optimize(2)
    best = study.best()

    record = study.train_population(_population())
    assert record is not None and record.state == "complete"
    assert record.arch == best.arch and record.trial == 2
    assert record.kind == f"population:{population_key(_population())}"
    assert record.metrics["population_size"] == 2
    stored = _stored(study, record)
    assert stored["winner"] == record.metrics["population_winner"]
    assert stored["final"][str(stored["winner"])] == pytest.approx(record.accuracy)
    assert [r["epoch"] for r in stored["rounds"]] == [1]
    model = study.load_model(record)  # the winner's weights are the trial's
    assert evaluate(model, study.data.val, study.data)[0] == pytest.approx(record.accuracy)
    (folder,) = (study._artifacts.folder / "populations").iterdir()  # this study's
    kept = folder / f"{population_key(_population())}-{best.arch.arch_id}"
    assert (kept / "population.json").is_file()  # its record stays;
    assert not (kept / "members").exists()  # its members' checkpoints went with the trial
    rerun = study.rerun(record.trial)  # the winner's schedule, replayed from scratch
    assert rerun["identical"], rerun
    page = write_report(study, study._artifacts.folder.parent / "report.html").read_text()
    assert "Trained as populations" in page and f"Trial {record.trial}: " in page
    assert "population of 2: 1 exploits in 1 rounds" in page  # every member, every round

    assert study.trials.count() == 2  # not a search trial: the budget and the controller skip it
    again = study.train_population(_population())  # trained once: the same trial
    assert again is not None and again.trial == record.trial
    other = study.train_population(_population(seed=1))  # another population: a new trial
    assert other is not None and other.trial == 3 and other.kind != record.kind
    assert [r.trial for r in study.records(variants=False)] == [0, 1, 2, 3]
    study.optimize(1)
    assert study._replay.told == {0, 1, 4}  # the search's trials only


def test_a_population_trial_cut_by_sigterm_resumes_to_the_same_winner(make_study, monkeypatch):
    straight = make_study("straight", train=TRAIN)
    straight.optimize(1)
    whole = straight.train_population(_population())
    assert whole is not None

    cut = make_study("cut", train=TRAIN)
    cut.optimize(1)
    real = population_study.PopulationLoop._member_epoch
    calls = []

    def stop_after_the_first(self, member, epoch):
        calls.append((member, epoch.epoch))
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler asks the trial to stop
        real(self, member, epoch)

    monkeypatch.setattr(population_study.PopulationLoop, "_member_epoch", stop_after_the_first)
    assert cut.train_population(_population()) is None
    assert cut.interrupted == "SIGTERM" and len(calls) == 1
    resumed = cut.train_population(_population())
    assert resumed is not None and resumed.state == "complete"
    assert cut.trials.get(resumed.trial).user_attrs["resumes"] < resumed.trial
    assert len(calls) == 2 * TRAIN.epochs  # the cut member-epoch is not trained again
    assert _stored(cut, resumed)["rounds"] == _stored(straight, whole)["rounds"]
    assert resumed.accuracy == pytest.approx(whole.accuracy)
    assert resumed.metrics["population_winner"] == whole.metrics["population_winner"]


def test_bad_populations_are_refused_before_any_trial(make_study):
    study = make_study(train=TRAIN)
    with pytest.raises(autosearch.StudyError, match="no complete trial yet"):
        study.train_population(_population())  # nothing searched yet: no best to train
    study.optimize(1)
    with pytest.raises(ConfigError, match="expected an autosearch.PopulationBasedTraining"):
        study.train_population({"size": 2})
    wide = _population(mutations={"label_smoothing": FloatDistribution(0.5, 2.0)})
    with pytest.raises(ConfigError, match="label_smoothing"):
        study.train_population(wide)
    assert len(study.trials.all()) == 1  # nothing was started


_HOLDER = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {tests!r})
    from test_population_study import _population
    import autosearch
    from autosearch.population import trial as population_study

    real = population_study.PopulationLoop._member_epoch

    def wait_for_the_other_worker(self, member, epoch):
        # After its first member-epoch, this worker waits until the other worker has
        # trained a member of its own: the population is then trained by both.
        real(self, member, epoch)
        for _ in range(6000):
            state = json.loads((self.folder / "population.json").read_text())
            if any(m["epoch"] >= 1 for m in state["members"] if m["id"] != member):
                return
            time.sleep(0.1)

    population_study.PopulationLoop._member_epoch = wait_for_the_other_worker
    study = autosearch.load_study("shared", storage={url!r})
    record = study.train_population(_population(), study.record(0).arch)
    print("TRIAL", record.trial, record.accuracy)
    """
)


@pytest.mark.slow
def test_a_second_worker_helps_the_trial_that_holds_the_population(
    make_study, tmp_path, monkeypatch
):
    """A worker asking for a population another worker's trial holds trains members
    beside it: one trial, the same result as one worker alone."""
    alone = make_study("alone", train=TRAIN)
    alone.optimize(1)
    by_one = alone.train_population(_population(), alone.record(0).arch)

    shared = make_study("shared", train=TRAIN)
    shared.optimize(1)
    url = f"sqlite:///{tmp_path}/shared.db"
    code = _HOLDER.format(tests=os.path.dirname(__file__), url=url)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    holder = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    for _ in range(6000):  # until the other worker's trial holds the population
        if len(shared.trials.all()) == 2 or holder.poll() is not None:
            break
        time.sleep(0.1)
    real, mine_trained = population_study.PopulationLoop._helper_epoch, []

    def count(self, member, epoch):  # a helper's member-epoch
        mine_trained.append((member, epoch.epoch))
        real(self, member, epoch)

    monkeypatch.setattr(population_study.PopulationLoop, "_helper_epoch", count)
    mine = shared.train_population(_population(), shared.record(0).arch)
    out, _ = holder.communicate(timeout=1800)
    assert holder.returncode == 0
    assert mine is not None and f"TRIAL {mine.trial} " in out.decode()
    assert mine.trial == 1 and mine_trained  # held there, helped here
    assert len(mine_trained) < 2 * TRAIN.epochs  # and not trained here alone
    assert _stored(shared, mine)["rounds"] == _stored(alone, by_one)["rounds"]
    assert mine.accuracy == pytest.approx(by_one.accuracy)


STUDY_FILE = textwrap.dedent(
    """
    from autosearch import StudySpec, TrainConfig
    from controllers import RandomSearch
    from search_spaces import ResNetSpace

    study = StudySpec(
        name="pop",
        controller=RandomSearch(
            ResNetSpace(max_stages=2, depths=(1,), widths=(4, 8), stem_widths=(4,)), seed=0
        ),
        train=TrainConfig(epochs=2, batch_size=128, lr=0.1),
        n_trials=2,
    )
    """
)


def test_autosearch_population_trains_the_best_as_a_trial(tmp_path, monkeypatch, capsys):
    import json

    from autosearch.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pop.py").write_text(STUDY_FILE)
    assert main(["run", "pop.py", "--no-export"]) == 0
    capsys.readouterr()
    study = autosearch.load_study("pop", storage=f"sqlite:///{tmp_path}/runs/pop/study.db")
    best = study.best()
    argv = ["population", "pop.py", "--size", "3", "--interval", "1"]
    assert main([*argv, "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    record = study.record(said["trial"])
    assert said["trial"] == 2 and record.arch == best.arch  # the search's best
    assert record.kind is not None and record.metrics["population_size"] == 3
    assert said["accuracy"] == pytest.approx(record.accuracy) and said["rounds"] == 1
    assert said["final"][str(said["winner"])] == pytest.approx(record.accuracy)
    lr = study.definition.train.lr
    for part in said["schedule"]:  # the learning rate adapted within 1/10 to 10 times
        assert lr / 10 <= part["settings"]["lr"] <= lr * 10
    assert main(argv) == 0  # trained once: the same trial, told again
    assert f"trial {said['trial']} trained" in capsys.readouterr().out
    assert len(study.trials.all()) == 3
