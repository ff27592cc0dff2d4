"""A time budget: ``optimize(timeout=)`` and ``--timeout``. No trial starts after it,
one running then finishes, and the trial count holds beside it. Time is a fake clock
here (the loop's), so nothing waits on a deadline and no wall time is asserted."""

from __future__ import annotations

import itertools
import json
import time

import pytest

import autosearch
from autosearch import ConfigError, Table
from autosearch.study import loop
from controllers import RandomSearch
from search_spaces import NB201Space
from search_spaces.nb201 import OPERATIONS


@pytest.fixture
def table_study(tmp_path):
    """A study answered from a table: trials in milliseconds, nothing trained."""
    space = NB201Space()
    cells = itertools.product(OPERATIONS, repeat=len(space.domains()))
    rows = [
        {
            "arch": space.to_string(space.make(dict(zip(space.domains(), ops, strict=True)))),
            "val_accuracy": 50 + i % 40,
        }
        for i, ops in enumerate(cells)
    ]
    path = tmp_path / "nb201.json"
    path.write_text(json.dumps(rows))

    def make(name: str = "budget") -> autosearch.Study:
        return autosearch.create_study(
            name,
            controller=RandomSearch(space, seed=0),
            table=Table(path=str(path), test_accuracy=None, train_time=None),
            storage=f"sqlite:///{tmp_path}/study.db",
            load_if_exists=True,
        )

    return make


class FakeClock:
    """The loop's clock: it moves only when a trial ends."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now

    def tick(self, seconds: float):
        def after_a_trial(study, record) -> None:
            self.now += seconds

        return after_a_trial


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(loop.time, "time", fake.time)
    return fake


def test_no_trial_starts_after_the_budget(table_study, clock):
    study = table_study()
    # Trials start at 0, 10 and 20 s; at 30 s the 25-second budget is spent.
    done = study.optimize(timeout=25, callbacks=[clock.tick(10)])
    assert [r.trial for r in done] == [0, 1, 2]
    assert study.trials.count("complete", "failed") == 3


def test_the_trial_count_and_the_budget_both_hold(table_study, clock):
    study = table_study()
    assert len(study.optimize(2, timeout=1_000, callbacks=[clock.tick(10)])) == 2  # the count
    assert len(study.optimize(50, timeout=15, callbacks=[clock.tick(10)])) == 2  # the budget
    assert study.trials.count("complete", "failed") == 4


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), True, "60"])
def test_a_budget_that_is_not_a_positive_number_of_seconds_is_refused(table_study, timeout):
    study = table_study()
    with pytest.raises(ConfigError, match="timeout must be None or a number of seconds > 0"):
        study.optimize(3, timeout=timeout)
    assert study.trials.count("complete", "failed", "running") == 0


def test_without_a_count_or_a_budget_optimize_says_what_it_needs(table_study):
    with pytest.raises(ConfigError, match="n_trials, a timeout in seconds, or both"):
        table_study().optimize()


def test_a_pool_worker_started_after_the_budget_runs_nothing(table_study):
    from autosearch.study.study import _worker_main

    study = table_study()
    ran = _worker_main(
        name=study.name,
        storage=study.storage_url,
        data=None,
        n_trials=5,
        worker=0,
        run="r",
        max_failures_in_a_row=3,
        deadline=time.time() - 1,
    )
    assert ran == [] and study.trials.count("complete", "failed", "running") == 0


@pytest.mark.slow
def test_a_pools_workers_share_the_budget_and_the_count(table_study):
    study = table_study()
    records = study.optimize(4, n_workers=2, timeout=3_600)  # the count ends it
    assert len(records) == 4 and {r.state for r in records} == {"complete"}


def test_the_command_line_takes_a_budget(table_study, capsys):
    from autosearch.cli import main

    study = table_study()
    argv = ["worker", "--study", study.name, "--storage", study.storage_url]
    assert main([*argv, "--n-trials", "3", "--timeout", "3600"]) == 0
    assert "worker finished 3 trials" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*argv, "--timeout", "0"])
    assert "expected a number > 0" in capsys.readouterr().err
