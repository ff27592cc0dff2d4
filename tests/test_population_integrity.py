"""A population never adopts a state its record cannot reproduce: a member whose
checkpoint is lost or not its record's is rebuilt from its schedule (and says so), a
round's donor that lost its checkpoint gives way to another or is rebuilt first, and
members that diverge score 0 and copy a donor; when every member has diverged the
population ends with that failure, the same on every rerun."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution

from autosearch import ConfigError, TrainConfig
from autosearch.errors import TrialFailed
from autosearch.population import replay, train_population
from autosearch.population.rules import PopulationBasedTraining

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_training_stack import _net  # noqa: E402

CONFIG = TrainConfig(epochs=3, batch_size=64, lr=0.05, crop_padding=1, device="cpu")


def _population(size: int = 4, low: float = 0.01, high: float = 0.2, **changes):
    mutations = {"lr": FloatDistribution(low, high, log=True)}
    settings = {"size": size, "interval": 1, "mutations": mutations, "seed": 3, **changes}
    return PopulationBasedTraining(**settings)


def _stopped(epoch: int, member: int):
    def on_epoch(m, e):
        if (m, e.epoch) == (member, epoch):
            raise KeyboardInterrupt

    return on_epoch


def _run(digits, folder: Path, population, **options):
    return train_population(_net, digits, CONFIG, population, folder, seed=7, **options)


@pytest.fixture(scope="module")
def straight(digits, tmp_path_factory):
    """The population trained without a stop, for each size used below."""
    root = tmp_path_factory.mktemp("straight")
    return {size: _run(digits, root / str(size), _population(size)) for size in (4, 8)}


def _same(result, expected) -> None:
    assert result.rounds == expected.rounds and result.winner == expected.winner
    assert [m["scores"] for m in result.members] == [m["scores"] for m in expected.members]


def test_a_member_whose_exploited_checkpoint_is_lost_is_rebuilt_from_its_schedule(
    digits, straight, tmp_path, caplog
):
    """P23: an exploited member's checkpoint deleted between rounds. It was trained
    again from scratch with its current settings, silently, and won; now it is rebuilt
    along its record's schedule (one line), and the population is the one never cut."""
    expected = straight[4]
    folder = tmp_path / "pop"
    with pytest.raises(KeyboardInterrupt):  # after round 1, before anyone trains epoch 3
        _run(digits, folder, _population(), on_epoch=_stopped(3, 0))
    record = json.loads((folder / "population.json").read_text())
    (exploit,) = record["rounds"][0]["exploits"]
    exploited = exploit["member"]
    (folder / "members" / str(exploited) / "train.pt").unlink()
    with caplog.at_level(logging.WARNING):
        result = _run(digits, folder, _population())
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == [
        f"population member {exploited}: its checkpoint is missing; rebuilt from its "
        f"schedule to epoch {record['members'][exploited]['epoch']}"
    ]
    _same(result, expected)
    # The winner's schedule still replays to its result.
    _, history = replay(_net, digits, CONFIG, result.schedule, seed=7)
    assert history[-1].val_accuracy == result.val_accuracy


def test_a_member_trained_again_in_its_place_is_not_adopted(digits, straight, tmp_path, caplog):
    """A checkpoint of the right epoch but another history (trained from scratch with
    its settings, as the silent fallback did) is set aside, never adopted."""
    folder = tmp_path / "pop"
    with pytest.raises(KeyboardInterrupt):
        _run(digits, folder, _population(), on_epoch=_stopped(3, 0))
    record = json.loads((folder / "population.json").read_text())
    member = record["rounds"][0]["exploits"][0]["member"]
    impostor = folder / "members" / str(member) / "train.pt"
    impostor.unlink()
    settings = record["members"][member]["settings"]
    from autosearch.training.train import train

    train(_net(), digits, CONFIG.__class__(**{**vars(CONFIG), **settings}), seed=7,
          checkpoint=impostor, until=2, adaptive=["lr"])  # fmt: skip
    with caplog.at_level(logging.WARNING):
        result = _run(digits, folder, _population())
    assert "its checkpoint's history is not its record's" in caplog.text
    _same(result, straight[4])
    assert (impostor.with_name("train.pt.lost")).is_file()  # kept for a look


def test_a_donor_that_lost_its_checkpoint_is_rebuilt_when_it_is_the_only_one(
    digits, straight, tmp_path, caplog
):
    """P25 with one donor a round (4 members): the donor's state is rebuilt first, and
    the round is the one of the population never cut."""
    expected = straight[4]
    folder = tmp_path / "pop"
    with pytest.raises(KeyboardInterrupt):  # every member at epoch 2 but the last
        _run(digits, folder, _population(), on_epoch=_stopped(2, 3))
    donor = expected.rounds[1]["ranking"][0]
    (folder / "members" / str(donor) / "train.pt").unlink()
    with caplog.at_level(logging.WARNING):
        result = _run(digits, folder, _population())
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == [
        f"population member {donor}: its checkpoint is missing; rebuilt from its schedule "
        "to epoch 2"
    ]
    _same(result, expected)


def test_a_donor_that_lost_its_checkpoint_gives_way_to_another(digits, straight, tmp_path, caplog):
    """P25 with two donors a round (8 members): the other top member gives to every
    recipient, said in one line."""
    expected = straight[8]
    folder = tmp_path / "pop"
    with pytest.raises(KeyboardInterrupt):
        _run(digits, folder, _population(8), on_epoch=_stopped(2, 7))
    lost, other = expected.rounds[1]["ranking"][:2]
    (folder / "members" / str(lost) / "train.pt").unlink()
    with caplog.at_level(logging.WARNING):
        result = _run(digits, folder, _population(8))
    assert f"population member {lost} is not a donor at epoch 2: its checkpoint is missing" in (
        caplog.text
    )
    assert {e["from"] for e in result.rounds[1]["exploits"]} == {other}
    assert result.rounds[0] == expected.rounds[0]


def test_members_that_diverge_score_zero_and_copy_a_donor(digits, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        result = _run(digits, tmp_path / "pop", _population(low=0.01, high=1e3))
    failed = {m["id"]: [f["epoch"] for f in m.get("failures", [])] for m in result.members}
    assert any(failed.values())  # some diverged (lr up to 1e3), so the run tests something
    for round_ in result.rounds:
        epoch = round_["epoch"]
        diverged = {i for i, epochs in failed.items() if epoch in epochs}
        copied = {e["member"] for e in round_["exploits"]}
        donors = {e["from"] for e in round_["exploits"]}
        assert diverged <= copied and not diverged & donors
    assert result.winner not in {i for i, epochs in failed.items() if 3 in epochs}


def test_a_population_whose_members_all_diverge_fails_the_same_on_every_rerun(digits, tmp_path):
    """P15: lr 1e3-1e5. It crashed with FileNotFoundError in the first round's copy,
    and again on every rerun."""
    for _ in range(2):
        with pytest.raises(TrialFailed, match=r"every member of the population failed by epoch 1"):
            _run(digits, tmp_path / "pop", _population(low=1e3, high=1e5))
    assert not list((tmp_path / "pop").rglob("*.copy"))


def test_a_copy_left_by_a_killed_round_goes_at_the_next_copy(digits, straight, tmp_path):
    folder = tmp_path / "pop"
    with pytest.raises(KeyboardInterrupt):
        _run(digits, folder, _population(), on_epoch=_stopped(1, 3))
    recipient = straight[4].rounds[0]["exploits"][0]["member"]
    stale = folder / "members" / str(recipient) / "train.pt.99999.copy"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"half a checkpoint")
    _same(_run(digits, folder, _population()), straight[4])
    assert not stale.exists()


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"mutations": None}, "mutations=None: expected a mapping"),
        ({"seed": -1}, r"seed=-1: expected a whole number >= 0"),
        ({"seed": "0"}, r"seed='0': expected a whole number >= 0"),
        (
            {"mutations": {"lr": FloatDistribution(0.01, float("inf"))}},
            "its bounds must be finite numbers",
        ),
        (
            {"mutations": {"lr": FloatDistribution(float("nan"), 0.1)}},
            "its bounds must be finite numbers",
        ),
        ({"factors": None}, "factors=None: expected two numbers"),
    ],
)
def test_bad_mutations_and_seeds_are_refused_in_one_line(changes, match):
    settings = {"size": 4, "mutations": {"lr": CategoricalDistribution([0.1, 0.2])}, **changes}
    with pytest.raises(ConfigError, match=match) as refused:
        PopulationBasedTraining(**settings)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(("interval", "burn_in"), [(3, 0), (1, 3), (5, 0)])
def test_a_population_that_could_never_exploit_is_refused(digits, tmp_path, interval, burn_in):
    population = _population(interval=interval, burn_in=burn_in)
    with pytest.raises(ConfigError, match="no round before the last epoch"):
        train_population(_net, digits, CONFIG, population, tmp_path / "pop", seed=7)
    assert not (tmp_path / "pop" / "members").exists()


def test_a_schedule_with_a_setting_that_cannot_adapt_is_refused(digits):
    schedule = [{"from": 0, "to": 3, "settings": {"momentum": 0.5}}]
    with pytest.raises(ConfigError, match="the schedule sets 'momentum': only lr"):
        replay(_net, digits, CONFIG, schedule, seed=7)


def test_the_population_plot_of_an_empty_record_says_so():
    from autosearch.report.population import population

    for empty in ({}, {"members": [], "rounds": []}, {"members": None}):
        with pytest.raises(ConfigError, match="holds no members to draw"):
            population(empty)


def test_a_population_trial_whose_members_all_diverge_is_a_failed_trial(make_study):
    """P15 in a study: the trial is stored failed with its reason, and the study goes
    on (a rerun asks for the same population again and gets the same failure)."""
    study = make_study(train=TrainConfig(epochs=3, batch_size=128, lr=0.05))
    study.optimize(1)
    diverging = _population(low=1e20, high=1e30)
    for _ in range(2):
        record = study.train_population(diverging)
        assert record.state == "failed"
        assert "every member of the population failed by epoch 1" in record.reason
    assert [t.state.name for t in study.trials.all()].count("FAIL") >= 1
    assert study.optimize(1)[0].state == "complete"  # the search goes on
