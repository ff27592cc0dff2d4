from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import optuna
import pytest

import autosearch
from autosearch import (
    ConfigError,
    Controller,
    Outcome,
    StorageError,
    StudyError,
    UnknownNameError,
)
from autosearch.evaluation import runner
from controllers import RandomSearch
from search_spaces import ResNetSpace


def test_end_to_end_two_trials(make_study, tmp_path):
    study = make_study()
    records = study.optimize(2)
    assert [r.trial for r in records] == [0, 1]
    assert all(r.state == "complete" for r in records)
    for r in records:
        assert 0 <= r.metrics["accuracy"] <= 1 and 0 <= r.metrics["test_accuracy"] <= 1
        assert r.metrics["flops"] == 2 * r.metrics["macs"] > 0 and r.metrics["params"] > 0
        # The default reward: MnasNet's soft constraint around the space's median FLOPs.
        target = study.definition.reward.target
        assert str(study.definition.reward).startswith("mnas@flops=") and target
        expected = r.metrics["accuracy"] * (r.metrics["flops"] / target) ** -0.07
        assert r.metrics["reward"] == pytest.approx(expected)
        assert r.metrics["latency"] > 0 and r.metrics["bytes"] > 4 * r.metrics["params"]
        assert r.description.startswith("resnet basic")
    assert records[0].arch != records[1].arch
    # Optuna sees an ordinary multi-objective study: params are the genes.
    trials = optuna.load_study(study_name="t", storage=f"sqlite:///{tmp_path}/t.db").trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    assert trials[0].params == dict(records[0].arch)
    assert trials[0].values == [records[0].accuracy, records[0].flops]
    assert sorted(trials[0].intermediate_values) == [1]  # one epoch reported
    assert study.best() in records and set(study.pareto()) <= set(records)


def test_pareto_and_best_follow_the_metrics(make_study):
    study = make_study()
    study.optimize(4)
    done = study.records()
    front = study.pareto()
    for r in done:
        dominated = any(
            o.accuracy >= r.accuracy
            and o.flops <= r.flops
            and (o.accuracy > r.accuracy or o.flops < r.flops)
            for o in done
        )
        assert (r in front) == (not dominated)
    assert study.best() == max(done, key=lambda r: (r.accuracy, -r.flops))
    cheapest = min(done, key=lambda r: r.flops)
    assert study.best(max_flops=cheapest.flops).flops == cheapest.flops
    with pytest.raises(StudyError, match="smallest has"):
        study.best(max_flops=cheapest.flops - 1)


def test_resume_continues_without_retraining_and_matches_an_uninterrupted_run(
    make_study, tmp_path, monkeypatch
):
    trained = []
    real = runner.train_candidate

    def counting(plan, *args, **kwargs):
        trained.append(plan.arch)
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(runner, "train_candidate", counting)
    first = make_study("resume")
    first.optimize(2)
    url = f"sqlite:///{tmp_path}/resume.db"
    again = autosearch.load_study("resume", storage=url)
    again.optimize(2)
    assert len(trained) == 4 and len(set(trained)) == 4
    assert [r.trial for r in again.records()] == [0, 1, 2, 3]
    # Same seed, no interruption: the same four architectures in the same order.
    straight = make_study("straight")
    straight.optimize(4)
    assert [r.arch for r in straight.records()] == [r.arch for r in again.records()]
    # create_study(load_if_exists=True) with the same definition continues too.
    third = make_study("resume", load_if_exists=True)
    third.optimize(1)
    assert len(trained) == 9 and len(set(trained[:4] + trained[-1:])) == 5


class Repeating(Controller):
    """Proposes one fixed architecture first and again every other ask."""

    name = "repeating"

    def __init__(self, space, *, seed=0):
        super().__init__(space)
        self.inner = RandomSearch(space, seed=seed)
        self.fixed = space.default()
        self.asks = 0
        self.told: list[Any] = []

    def ask(self):
        self.asks += 1
        return self.fixed if self.asks % 2 else self.inner.ask()

    def tell(self, arch, outcome):
        self.told.append((arch, outcome))
        self.inner.tell(arch, outcome)

    def state_dict(self):
        return {"asks": self.asks}

    def load_state_dict(self, state):
        self.asks = state["asks"]

    def config(self):
        return {}


def test_an_evaluated_architecture_is_never_trained_twice(make_study, tiny_space):
    controller = Repeating(tiny_space)
    study = make_study(controller=controller)
    study.optimize(3)
    archs = [r.arch for r in study.records()]
    assert len(archs) == 3 and len(set(archs)) == 3 and archs[0] == tiny_space.default()
    # The repeated proposal was answered from storage, not retrained.
    repeats = [o for a, o in controller.told if a == tiny_space.default()]
    assert len(repeats) >= 2 and len({o.reward for o in repeats}) == 1


@pytest.mark.parametrize(
    ("storage", "error"),
    [
        ("sqlite", RuntimeError("CUDA out of memory (simulated)")),
        ("sqlite", KeyError("stage3")),  # as Optuna's "Record does not exist." is
        ("journal", KeyError("stage3")),  # J2: crashed with an AttributeError, left RUNNING
    ],
)
def test_a_failing_trial_is_stored_with_its_reason_and_the_study_goes_on(
    make_study, monkeypatch, tmp_path, storage, error
):
    real = runner.train_candidate
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "train_candidate", flaky)
    url = {"sqlite": f"sqlite:///{tmp_path}/f.db", "journal": f"journal:{tmp_path}/f.log"}
    study = make_study(storage=url[storage])
    records = study.optimize(2)
    assert [r.state for r in records] == ["failed", "complete"]
    assert records[0].reason == f"{type(error).__name__}: {error}"
    assert study.trials.count("failed") == 1 and study.best() == records[1]
    trial = study.optuna_study.trials[0]
    assert trial.state == optuna.trial.TrialState.FAIL
    assert trial.user_attrs["fail_reason"] == records[0].reason


def test_failures_in_a_row_stop_the_study_with_the_last_reason(make_study, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("labels out of range")

    monkeypatch.setattr(runner, "train_candidate", broken)
    study = make_study()
    with pytest.raises(StudyError, match="3 trials failed in a row.*labels out of range"):
        study.optimize(10, max_failures_in_a_row=3)
    assert study.trials.count("failed") == 3


def test_callbacks_see_every_record(make_study):
    seen = []
    make_study().optimize(2, callbacks=[lambda s, r: seen.append(r.trial)])
    assert seen == [0, 1]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_bad_input_changes_nothing_stored(make_study, tmp_path, tiny_space):
    study = make_study("kept")
    study.optimize(1)
    db = tmp_path / "kept.db"
    before = _digest(db)
    url = f"sqlite:///{db}"
    with pytest.raises(StudyError, match="already exists.*load_if_exists=True"):
        make_study("kept")
    with pytest.raises(StudyError, match="different definition.*space"):
        make_study(
            "kept", load_if_exists=True, controller=RandomSearch(ResNetSpace(max_stages=3), seed=0)
        )
    with pytest.raises(StudyError, match="different definition.*objectives"):
        make_study("kept", load_if_exists=True, objectives=("accuracy", "params"))
    with pytest.raises(UnknownNameError, match="Did you mean 'random'"):
        autosearch.create_study("kept", controller="randm", space=tiny_space, storage=url)
    with pytest.raises(UnknownNameError, match="Did you mean 'flops'"):
        make_study("kept", load_if_exists=True, objectives=("accuracy", "flop"))
    with pytest.raises(UnknownNameError, match="Did you mean 'digits'"):
        make_study("kept", load_if_exists=True, data="digit")
    with pytest.raises(StorageError, match="Did you mean 'kept'"):
        autosearch.load_study("kep", storage=url)
    assert _digest(db) == before
    assert len(autosearch.load_study("kept", storage=url).records()) == 1


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("runs/x.db", "has no scheme"),
        ("sqlite://relative.db", "three slashes"),
        ("mongodb://localhost/x", "unknown storage scheme 'mongodb'"),
        ("journal:", "names no file"),
        ("sqlite:////proc/autosearch/x.db", "cannot create the folder"),
        ("sqlite:////proc/no/autosearch/x.db", "/proc/no does not exist"),
        ("postgresql://nobody@127.0.0.1:1/none", "cannot open storage|driver"),
    ],
)
def test_unusable_storage_urls_say_what_works(url, match, tiny_space):
    with pytest.raises(StorageError, match=match):
        autosearch.create_study("x", controller=RandomSearch(tiny_space), storage=url)


@pytest.mark.parametrize("scheme", ["sqlite:///", "journal:"])
def test_an_absolute_path_creates_only_the_files_own_folder(tmp_path, tiny_space, scheme):
    typo = tmp_path / "studeis" / "x" / "study.db"  # a typo two folders up is refused
    with pytest.raises(StorageError, match=r"studeis does not exist; check the path"):
        autosearch.create_study("x", controller=RandomSearch(tiny_space), storage=f"{scheme}{typo}")
    assert not (tmp_path / "studeis").exists()
    own = tmp_path / "x" / "study.db"  # the study's own folder is made
    autosearch.create_study("x", controller=RandomSearch(tiny_space), storage=f"{scheme}{own}")
    assert own.is_file()


def test_sqlite_file_that_is_not_a_database(tmp_path, tiny_space):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StorageError, match="junk.db is damaged or not a SQLite database"):
        autosearch.create_study(
            "x", controller=RandomSearch(tiny_space), storage=f"sqlite:///{junk}"
        )
    assert junk.read_bytes() == b"this is not sqlite" * 100


def test_controller_by_name_needs_a_space(tmp_path, tiny_space):
    with pytest.raises(ConfigError, match="needs space="):
        autosearch.create_study("x", controller="random", storage=f"sqlite:///{tmp_path}/x.db")
    study = autosearch.create_study(
        "x", controller="random", space=tiny_space, seed=3, storage=f"sqlite:///{tmp_path}/x.db"
    )
    assert isinstance(study.controller, RandomSearch) and study.controller.seed == 3


def test_journal_storage_works_too(make_study, tmp_path):
    study = make_study("j", storage=f"journal:{tmp_path}/j.log")
    study.optimize(1)
    again = autosearch.load_study("j", storage=f"journal:{tmp_path}/j.log")
    assert [r.state for r in again.records()] == ["complete"]
    assert again.load_model(again.best()) is not None


def test_outcome_rules():
    with pytest.raises(ValueError, match="finite reward"):
        Outcome(reward=float("nan"))
    assert not Outcome.failed("x").ok and Outcome(reward=1.0).ok


def test_continuing_with_another_controller_is_recorded(make_study, tmp_path, tiny_space):
    from controllers import RegularizedEvolution

    make_study("switch").optimize(2)
    evolution = RegularizedEvolution(tiny_space, seed=0)
    make_study("switch", controller=evolution, load_if_exists=True).optimize(1)
    again = autosearch.load_study("switch", storage=f"sqlite:///{tmp_path}/switch.db")
    assert isinstance(again.controller, RegularizedEvolution)
    assert len(again.controller.state_dict()["population"]) == 3  # all results replayed


def test_every_process_scores_with_the_stored_reward(make_study, tmp_path, monkeypatch):
    import autosearch.study.definition

    # A default target with more digits than the stored form keeps (6 significant).
    monkeypatch.setattr(autosearch.study.definition, "_default_target", lambda *a: 1234567.891)
    study = make_study("same-reward")
    (record,) = study.optimize(1)
    again = autosearch.load_study("same-reward", storage=f"sqlite:///{tmp_path}/same-reward.db")
    assert str(study.definition.reward) == "mnas@flops=1.23457e+06,w=-0.07"
    assert again.definition.reward == study.definition.reward
    assert again.definition.reward(record.metrics) == record.metrics["reward"]


def _script(tmp_path, body: str) -> str:
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        f"""
        import autosearch
        from autosearch import TrainConfig
        from controllers import RandomSearch
        from search_spaces import ResNetSpace
        space = ResNetSpace(min_stages=2, max_stages=2, depths=(1,), widths=(4,),
                            stem_widths=(4, 8), blocks=("basic",))
        study = autosearch.create_study(
            "p", controller=RandomSearch(space, seed=0), storage="sqlite:///{tmp_path}/p.db",
            train=TrainConfig(epochs=2, batch_size=128, lr=0.1))
        {body}
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def test_a_python_study_logs_each_trial_where_no_bar_is_shown(tmp_path):
    err = _script(tmp_path, "study.optimize(2)")  # standard error is not a terminal here
    assert "trial 0 complete:" in err and "trial 1 complete:" in err and "val acc" in err
    assert "epoch/s" not in err


def test_a_python_study_draws_trial_and_epoch_bars_when_asked(tmp_path):
    err = _script(tmp_path, "study.optimize(2, show_progress_bar=True)")
    assert "2/2" in err and ("trial/s" in err or "s/trial" in err)
    assert "epoch" in err


def test_a_pool_logs_each_trial_once(tmp_path):
    """The parent logs every finished trial; its workers do not say it again."""
    err = _script(tmp_path, "study.optimize(2, n_workers=2)")
    for n in (0, 1):
        assert err.count(f"trial {n} complete:") == 1, err[-3000:]


def test_ctrl_c_ends_the_call_once_the_epoch_is_checkpointed(make_study):
    """Ctrl-C lets the epoch's checkpoint finish and marks the trial to resume, then
    interrupts the caller (a test run, a notebook cell), as Ctrl-C does in Python."""
    import os
    import signal

    study = make_study(train=autosearch.TrainConfig(epochs=3, batch_size=128, lr=0.1))
    after = []

    def ctrl_c(trial: int, epoch) -> None:
        if epoch.epoch == 1:
            os.kill(os.getpid(), signal.SIGINT)
        after.append(epoch.epoch)

    with pytest.raises(KeyboardInterrupt):
        study.optimize(2, epoch_callbacks=[ctrl_c])
    assert after == [1]  # stopped at the first epoch's end, not after the trial
    (cut,) = study.optuna_study.get_trials()
    assert "interrupted by the user" in cut.user_attrs["superseded"] and cut.user_attrs["resume"]
    (done,) = study.optimize(1)
    assert (
        study.optuna_study.get_trials()[done.trial].user_attrs["result"]["resumed_from_epoch"] == 1
    )


def test_a_space_without_a_budget_says_how_large_its_candidates_get(make_study, caplog):
    from search_spaces import ResNetSpace

    wide = ResNetSpace(widths=(256, 512), stem_widths=(256,), min_stages=3, max_stages=3)
    with caplog.at_level("DEBUG", logger="autosearch"):
        make_study("wide", controller=RandomSearch(wide, seed=0))
    (said,) = [r for r in caplog.records if "has no budget" in r.getMessage()]
    assert said.levelname == "WARNING" and "takes long to train" in said.getMessage()
    assert "on 1x8x8 images" in said.getMessage() and "max_flops=" in said.getMessage()
    caplog.clear()
    with caplog.at_level("DEBUG", logger="autosearch"):
        make_study("bounded", controller=RandomSearch(ResNetSpace(max_flops=2e6), seed=0))
    assert "has no budget" not in caplog.text


def test_a_damaged_controller_state_is_left_out_and_the_controller_learns_again(make_study, caplog):
    from autosearch.cli import main

    study = make_study("c")
    study.optimize(2)
    state = study._storage.get_study_system_attrs(study._study_id)["autosearch:controller"]
    state["state"] = {"rng": "not a state", "seen": 7}
    state["told"] = [["x", None]]
    study._storage.set_study_system_attr(study._study_id, "autosearch:controller", state)
    with caplog.at_level("WARNING", logger="autosearch"):
        again = autosearch.load_study("c", storage=study.storage_url, read_only=True)
    assert "cannot be read" in caplog.text and again._replay.told == {0, 1}  # told again
    assert main(["status", "--study", "c", "--storage", study.storage_url]) == 0
    with pytest.raises(autosearch.StudyError, match="opened read-only"):
        again.optimize(1)
    assert len(autosearch.load_study("c", storage=study.storage_url).optimize(1)) == 1


def test_the_heartbeat_names_a_trial_id_as_an_id():
    """Storages number trials within a study and id them across studies: a log line
    about a heartbeat (which has only the id) says "trial id"."""
    import logging
    import threading

    from autosearch.workers._heartbeat import beating

    class Failing:
        def set_trial_system_attr(self, trial_id, key, value):
            raise RuntimeError("storage gone")

    said = threading.Event()
    lines: list[str] = []

    class Seen(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
            said.set()

    logger = logging.getLogger("autosearch.workers._heartbeat")
    handler, level = Seen(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with beating(Failing(), 42, 0.01, stamped=True):
            assert said.wait(timeout=1800)  # the first beat, a hundredth of a second in
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert lines[0].startswith("heartbeat of trial id 42 not written")
