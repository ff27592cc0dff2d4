"""Confirming a supernet's choice by training: ``study.supernet.confirm(k)`` and ``autosearch
confirm`` train the top subnets of the supernet's front from scratch as trials of the
study, once each across workers, resumably; ``best()`` prefers them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import autosearch
from autosearch import ConfigError, StudyError, SupernetConfig, TrainConfig
from autosearch.cli import main
from autosearch.study.records import CONFIRMS
from autosearch.training.train import evaluate
from autosearch.weight_sharing.confirm import candidates
from controllers import RandomSearch
from search_spaces import ResNetSpace

TINY = TrainConfig(epochs=2, batch_size=64, lr=0.05)


def _space():
    return ResNetSpace(max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16)).supernet(
        fixed={"stages": 2, "block": "basic"}
    )


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A tiny supernet, trained once for this module: its weights file."""
    root = tmp_path_factory.mktemp("confirm")
    study = autosearch.create_study(
        "trained",
        controller=RandomSearch(_space(), seed=0),
        storage=f"sqlite:///{root}/t.db",
        train=TINY,
        supernet=SupernetConfig(
            sandwich=1, latency=False, train=TrainConfig(epochs=1, batch_size=64)
        ),
    )
    study.supernet.train()
    return study.supernet.save(root / "supernet.safetensors")


def _searched(weights, path: Path, name: str = "ws", trials: int = 8, **options):
    study = autosearch.create_study(
        name,
        controller=RandomSearch(_space(), seed=0),
        storage=f"sqlite:///{path}/{name}.db",
        train=TINY,
        supernet=SupernetConfig(sandwich=1, latency=False, weights=str(weights)),
        **options,
    )
    study.supernet.train()  # imports the weights
    study.optimize(trials, show_progress_bar=False)
    return study


def _shown_in_mlflow(uri: str, done) -> None:
    """Each confirmation a FINISHED run of its own, its epochs and accuracy logged; no
    run for the search's trials, which ran before tracking was on."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("ws")
    runs = client.search_runs([experiment.experiment_id], "tags.`autosearch.trial` != ''")
    by_trial = {int(run.data.tags["autosearch.trial"]): run for run in runs}
    assert set(by_trial) == {r.trial for r in done}
    for record in done:
        run = by_trial[record.trial]
        assert run.info.status == "FINISHED" and run.data.tags["autosearch.key"].startswith(
            "confirm:"
        )
        assert run.data.metrics["accuracy"] == pytest.approx(record.accuracy)
        history = client.get_metric_history(run.info.run_id, "val_accuracy")
        assert sorted(m.step for m in history) == list(range(1, TINY.epochs + 1))


def _stored(study) -> list[tuple]:
    return [
        (t.number, t.state, json.dumps(t.user_attrs, sort_keys=True, default=str))
        for t in study.trials.all()
    ]


def test_confirm_trains_the_top_of_the_front_as_trials_and_best_prefers_them(weights, tmp_path):
    study = _searched(weights, tmp_path)
    front = candidates(study.records(variants=False), study.definition.objectives)
    assert len(front) >= 2
    told_before = set(study._replay.told)
    mlflow = f"sqlite:///{tmp_path}/mlflow.db"
    study.track(mlflow=mlflow)  # switched on after the search: the confirmations are shown

    done = study.supernet.confirm(2)

    assert [r.confirms for r in done] == [front[0].trial, front[1].trial]
    _shown_in_mlflow(mlflow, done)
    assert [r.arch for r in done] == [front[0].arch, front[1].arch]
    assert all(r.state == "complete" and r.trial >= 8 for r in done)
    facts = study.trials.get(done[0].trial).user_attrs["result"]
    assert facts["evaluated_by"] == "training" and facts["weights"]  # trained, weights stored
    # Trial budgets count search trials: confirmations are not among them.
    assert study.trials.count("complete") == 8
    # The controller never hears of a confirmation: it is not the supernet's figure.
    assert study._replay.told == told_before
    reopened = autosearch.load_study("ws", storage=study.storage_url)
    assert set(reopened._replay.told) == told_before
    # Each subnet's two figures, side by side.
    rows = {c.trial: c for c in study.supernet.confirmations()}
    for record in done:
        row = rows[record.confirms]
        assert row.confirmed == record.accuracy and row.confirmed_by == record.trial
        assert row.inherited == study.record(record.confirms).accuracy
        assert row.state == "complete"
    # best() prefers confirmed subnets, and their trained weights are what is loaded.
    best = study.best()
    assert best.confirms is not None and best.trial in {r.trial for r in done}
    model = study.load_model(best)
    assert evaluate(model, study.data.val, study.data)[0] == pytest.approx(best.accuracy)
    # Confirming again trains nothing: the same records, no new trial.
    count = len(study.trials.all())
    again = study.supernet.confirm(2)
    assert [r.trial for r in again] == [r.trial for r in done]
    assert len(study.trials.all()) == count
    # A larger k trains only what is new.
    more = study.supernet.confirm(3) if len(front) >= 3 else done
    assert [r.trial for r in more[:2]] == [r.trial for r in done]
    assert len(study.trials.all()) == count + (len(more) - 2)


def test_bad_confirm_is_refused_in_one_line_and_stores_nothing(weights, tmp_path):
    study = _searched(weights, tmp_path, trials=4)
    front = len(candidates(study.records(variants=False), study.definition.objectives))
    before = _stored(study)
    for k, match in (
        (0, "k must be an integer >= 1"),
        (-1, "k must be an integer >= 1"),
        ("2", "k must be an integer >= 1"),
        (True, "k must be an integer >= 1"),
        (front + 1, f"has {front} subnet"),
    ):
        with pytest.raises(ConfigError, match=match) as caught:
            study.supernet.confirm(k)
        assert "\n" not in str(caught.value)
    read_only = autosearch.load_study("ws", storage=study.storage_url, read_only=True)
    with pytest.raises(StudyError, match="read-only"):
        read_only.supernet.confirm(1)
    assert _stored(study) == before

    plain = autosearch.create_study(
        "plain",
        controller=RandomSearch(ResNetSpace(max_stages=1, depths=(1,), widths=(8,)), seed=0),
        storage=f"sqlite:///{tmp_path}/plain.db",
        train=TrainConfig(epochs=1, batch_size=64),
    )
    assert plain.supernet is None  # nothing to confirm: a study without one says so
    assert plain.trials.all() == []

    empty = autosearch.create_study(
        "empty",
        controller=RandomSearch(_space(), seed=0),
        storage=f"sqlite:///{tmp_path}/empty.db",
        train=TINY,
        supernet=SupernetConfig(sandwich=1, latency=False, weights=str(weights)),
    )
    empty.supernet.train()
    with pytest.raises(StudyError, match="no complete supernet trial"):
        empty.supernet.confirm(1)
    assert empty.trials.all() == []


def test_a_subnet_another_worker_holds_is_not_trained_twice_and_a_dead_one_is_taken_over(
    weights, tmp_path, monkeypatch
):
    """Worker B claimed the first subnet and died without a beat; worker A, confirming
    the same two subnets, trains the second, waits for B's, and takes it over once B's
    heartbeat is past the grace: each subnet is trained by exactly one complete trial."""
    monkeypatch.setenv("AUTOSEARCH_HEARTBEAT_INTERVAL", "0.2")
    monkeypatch.setenv("AUTOSEARCH_HEARTBEAT_GRACE", "3")
    study = _searched(weights, tmp_path)
    first, second = candidates(study.records(variants=False), study.definition.objectives)[:2]
    claims = study._claims.of_confirmations()
    b = claims.start(first.arch, {CONFIRMS: first.trial, "seed": 1, "worker": "b:1"})
    assert claims.holds(b, first.arch)

    done = study.supernet.confirm(2)

    assert [r.confirms for r in done] == [first.trial, second.trial]
    assert all(r.state == "complete" for r in done)
    trials = study.trials.all()
    taken = next(t for t in trials if t._trial_id == b)
    assert "superseded" in taken.user_attrs and "died" in taken.user_attrs["superseded"]
    live = [t for t in trials if CONFIRMS in t.user_attrs and "superseded" not in t.user_attrs]
    assert sorted(t.user_attrs[CONFIRMS] for t in live) == sorted([first.trial, second.trial])
    # A second claim on a held subnet is superseded as a duplicate at once.
    dup = claims.start(second.arch, {CONFIRMS: second.trial, "seed": 1})
    assert not claims.holds(dup, second.arch)
    # The search's own claims never resume a confirmation: a new search trial is new.
    (new,) = study.optimize(1, show_progress_bar=False)
    assert new.confirms is None and new.arch not in {first.arch, second.arch}


def test_a_ranked_confirmation_trains_where_the_ranker_chooses_and_another_worker_continues_it(
    weights, tmp_path
):
    """``confirm(k, ranker=True)``: the first subnet trained is the prior's top (the
    mean rank of its estimates), each next one the ranker's choice fitted on those
    trained before it, each trial storing the estimate it was chosen with. Two
    confirmations here, then a second worker's ``confirm(3)``, choose what one
    uninterrupted ``confirm(3)`` of the same study chooses."""
    straight = _searched(weights, tmp_path / "a")
    prior = straight.supernet.ranking()
    assert len(prior) == 8 and all(e.confirmed is None for e in prior)
    assert [e.estimate for e in prior] == sorted((e.estimate for e in prior), reverse=True)

    done = straight.supernet.confirm(3, ranker=True)

    sequence = [r.confirms for r in done]
    assert len(set(sequence)) == 3 and all(r.state == "complete" for r in done)
    assert sequence[0] == prior[0].trial
    chosen = [straight.trials.get(r.trial).user_attrs["ranked"] for r in done]
    assert [c["fitted_on"] for c in chosen] == [[], sorted(sequence[:1]), sorted(sequence[:2])]
    assert chosen[0]["estimates"][:1] == ["accuracy"] and "flops" in chosen[0]["estimates"]
    assert straight.trials.count("complete") == 8  # confirmations are not search trials
    after = {e.trial: e for e in straight.supernet.ranking()}
    assert {t for t, e in after.items() if e.confirmed is not None} == set(sequence)
    assert after[sequence[0]].confirmed == done[0].accuracy

    cut = _searched(weights, tmp_path / "b")
    assert [r.confirms for r in cut.supernet.confirm(2, ranker=True)] == sequence[:2]
    other = autosearch.load_study("ws", storage=cut.storage_url)  # another worker
    assert [r.confirms for r in other.supernet.confirm(3, ranker=True)] == sequence
    # k counts the subnets held in all: asking again trains nothing new.
    count = len(other.trials.all())
    assert [r.confirms for r in other.supernet.confirm(3, ranker=True)] == sequence
    assert len(other.trials.all()) == count
    for k in (0, 9, "3", True):
        with pytest.raises(ConfigError, match="k must be an integer from 1 to 8") as caught:
            other.supernet.confirm(k, ranker=True)
        assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="expected True or a RankerConfig"):
        other.supernet.confirm(1, ranker="yes")
    assert len(other.trials.all()) == count


def test_a_confirmation_cut_by_sigterm_resumes_from_its_checkpoint(weights, tmp_path, monkeypatch):
    study = _searched(weights, tmp_path)
    from autosearch.study import loop

    real = loop.StudyContext.epoch_done

    def stop_after_first_epoch(self, epoch):
        real(self, epoch)
        if epoch.epoch == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler asks the trial to stop

    monkeypatch.setattr(loop.StudyContext, "epoch_done", stop_after_first_epoch)
    assert study.supernet.confirm(1) == []
    assert study.interrupted == "SIGTERM"
    cut = [t for t in study.trials.all() if CONFIRMS in t.user_attrs]
    assert len(cut) == 1 and cut[0].user_attrs.get("resume") is True
    monkeypatch.setattr(loop.StudyContext, "epoch_done", real)

    (done,) = study.supernet.confirm(1)

    assert done.state == "complete" and done.confirms == cut[0].user_attrs[CONFIRMS]
    facts = study.trials.get(done.trial).user_attrs
    assert facts["resumes"] == cut[0].number
    assert facts["result"]["resumed_from_epoch"] == 1
    assert study.interrupted is None


def _population_record(study, record):
    """What a confirmation's population did, stored with its trial."""
    return study.trials.get(record.trial).user_attrs["result"]["population"]


def test_a_confirmation_trained_as_a_population_resumes_to_the_same_winner(
    weights, tmp_path, monkeypatch
):
    """Each confirmed subnet trained as a small population: its winner is the trial's
    network (accuracy, weights), the population is stored with the trial, and a trial
    cut by SIGTERM after a member's epoch resumes the population from the trial's
    folder to the same rounds, winner and accuracy as an uninterrupted one."""
    from autosearch.weight_sharing import confirm

    population = autosearch.PopulationBasedTraining(size=2, interval=1, seed=0)
    straight = _searched(weights, tmp_path, name="straight", trials=6)
    (whole,) = straight.supernet.confirm(1, population=population)
    assert whole.state == "complete" and whole.metrics["population_size"] == 2
    assert straight.trials.get(whole.trial).user_attrs["population"] == (population.definition())
    state = _population_record(straight, whole)
    assert state["size"] == 2 and state["winner"] == whole.metrics["population_winner"]
    assert state["final"][str(state["winner"])] == pytest.approx(whole.accuracy)
    assert [r["epoch"] for r in state["rounds"]] == [1]  # a round after epoch 1 of 2
    assert len(state["schedule"]) >= 1  # the winner's settings, epoch by epoch
    model = straight.load_model(whole)  # the winner's weights are the trial's
    assert evaluate(model, straight.data.val, straight.data)[0] == pytest.approx(whole.accuracy)

    cut_study = _searched(weights, tmp_path, name="cut", trials=6)
    real = confirm._ConfirmLoop._member_epoch
    calls = []

    def stop_after_the_first(self, member, epoch):
        calls.append((member, epoch.epoch))
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler asks the trial to stop
        real(self, member, epoch)

    monkeypatch.setattr(confirm._ConfirmLoop, "_member_epoch", stop_after_the_first)
    assert cut_study.supernet.confirm(1, population=population) == []
    assert cut_study.interrupted == "SIGTERM" and len(calls) == 1
    (resumed,) = cut_study.supernet.confirm(1, population=population)
    assert cut_study.trials.get(resumed.trial).user_attrs["resumes"] < resumed.trial
    assert len(calls) == 2 * TINY.epochs  # the cut epoch is not trained again
    again = _population_record(cut_study, resumed)
    assert again["rounds"] == state["rounds"]
    assert resumed.accuracy == pytest.approx(whole.accuracy)
    assert resumed.metrics["population_winner"] == whole.metrics["population_winner"]
    with pytest.raises(ConfigError, match="expected an autosearch.PopulationBasedTraining"):
        cut_study.supernet.confirm(1, population={"size": 2})


@pytest.mark.slow
@pytest.mark.service
def test_a_confirmation_population_cut_short_resumes_from_the_bucket(
    weights, bucket, tmp_path, monkeypatch
):
    """With the study's artifacts in a bucket, the confirmation's folder (its population
    with it) is pushed after each member's epoch: a trial cut after the first goes on,
    on a disk that never saw it, to the winner of an uninterrupted one."""
    from autosearch.weight_sharing import confirm

    name, client = bucket
    population = autosearch.PopulationBasedTraining(size=2, interval=1, seed=0)
    straight = _searched(weights, tmp_path, name="straight", trials=6)
    (whole,) = straight.supernet.confirm(1, population=population)

    cut = _searched(weights, tmp_path, name="cut", trials=6, artifacts=f"s3://{name}/cf")
    real, calls = confirm._ConfirmLoop._member_epoch, []

    def stop_after_the_first(self, member, epoch):
        calls.append((member, epoch.epoch))
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        real(self, member, epoch)  # the push, then the interrupt

    monkeypatch.setattr(confirm._ConfirmLoop, "_member_epoch", stop_after_the_first)
    assert cut.supernet.confirm(1, population=population) == [] and cut.interrupted == "SIGTERM"
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=name).get("Contents", [])]
    assert any(k.endswith("/population/population.json") for k in keys), keys
    assert any(k.endswith("/population/members/0/train.pt") for k in keys), keys
    shutil.rmtree(cut._artifacts.folder)  # another machine: this disk's copy is gone
    again = autosearch.load_study("cut", storage=f"sqlite:///{tmp_path}/cut.db")
    (resumed,) = again.supernet.confirm(1, population=population)
    assert len(calls) == 2 * TINY.epochs  # the cut member-epoch came from the bucket
    assert resumed.accuracy == pytest.approx(whole.accuracy)
    assert resumed.metrics["population_winner"] == whole.metrics["population_winner"]


STUDY_FILE = """
from autosearch import StudySpec, SupernetConfig, TrainConfig
from controllers import RandomSearch
from search_spaces import ResNetSpace

space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16)).supernet(
    fixed={{"stages": 2, "block": "basic"}}
)
study = StudySpec(
    name="cf",
    controller=RandomSearch(space, seed=0),
    data="digits",
    train=TrainConfig(epochs=2, batch_size=64, lr=0.05),
    supernet=SupernetConfig(sandwich=1, latency=False, weights={weights!r}),
    n_trials=6,
)
"""


@pytest.mark.slow
def test_two_confirm_commands_at_once_train_each_subnet_once(weights, tmp_path):
    """Two real `autosearch confirm --ranker` processes on one study, started together:
    each of the ranker's choices trained once."""
    (tmp_path / "cf.py").write_text(STUDY_FILE.format(weights=str(weights)))
    url = f"sqlite:///{tmp_path}/cf.db"
    cli = Path(sys.executable).with_name("autosearch")
    from autosearch.studyfile import load_spec

    searched = load_spec(tmp_path / "cf.py").create(storage=url)
    searched.supernet.train()  # imports the weights
    searched.optimize(6, show_progress_bar=False)
    workers = [
        subprocess.Popen(
            [str(cli), "confirm", "cf.py", "-k", "2", "--ranker", "--storage", url, "--json"],
            cwd=tmp_path,
            env={**os.environ, "AUTOSEARCH_HEARTBEAT_INTERVAL": "1"},  # the waiter looks often
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [w.communicate(timeout=600) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [err for _, err in outs]
    said = [json.loads(out)["confirmations"] for out, _ in outs]
    assert said[0] == said[1]  # both report the same two confirmations
    study = autosearch.load_study("cf", storage=url, read_only=True)
    trained = [
        t for t in study.trials.all() if CONFIRMS in t.user_attrs and t.state.name == "COMPLETE"
    ]
    assert len(trained) == 2  # each subnet trained once, by one of the two
    # the ranker chose: the first from its prior (fitted on nothing yet), each with its
    # estimate (the other's may be fitted on the first, or chosen beside it)
    ranked = sorted((t.user_attrs["ranked"] for t in trained), key=lambda r: r["fitted_on"])
    assert ranked[0]["fitted_on"] == [] and all(len(r["fitted_on"]) <= 1 for r in ranked)
    assert sorted(t.user_attrs[CONFIRMS] for t in trained) == sorted(c["trial"] for c in said[0])
    assert {t.user_attrs["worker"] for t in trained} <= {
        t.user_attrs["worker"] for t in study.trials.all() if CONFIRMS in t.user_attrs
    }
    # The status command shows both figures of each.
    assert main(["status", str(tmp_path / "cf.py"), "--storage", url]) == 0


def test_the_cli_refuses_bad_confirm_input_in_one_line(weights, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cf.py").write_text(STUDY_FILE.format(weights=str(weights)))
    with pytest.raises(SystemExit) as stopped:
        main(["confirm", "cf.py", "-k", "0"])
    assert stopped.value.code == 2 and "-k: expected an integer >= 1" in capsys.readouterr().err
    assert main(["confirm", "cf.py", "-k", "2"]) == 2  # no study stored yet
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "study.db does not exist" in err
    (tmp_path / "plain.py").write_text(
        textwrap.dedent(
            """
            from autosearch import StudySpec, TrainConfig
            from controllers import RandomSearch
            from search_spaces import ResNetSpace
            study = StudySpec(name="plain", controller=RandomSearch(ResNetSpace(), seed=0),
                              data="digits", train=TrainConfig(epochs=1), n_trials=1)
            """
        )
    )
    assert main(["confirm", "plain.py"]) == 2
    assert "defines no supernet" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "plain").exists()
