"""Population-based training: explore stays in its ranges, a restored run takes its new
settings, a population exploits and explores through its record, its winner replays to
the same weights, and a killed worker or two workers at once change nothing of it."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from autosearch import ConfigError, TrainConfig
from autosearch.population import replay, train_population
from autosearch.population.rules import PopulationBasedTraining, draw, explore, perturb
from autosearch.training._optim import make_optimizer, make_schedule, retune
from autosearch.training.precise_bn import precise_bn
from autosearch.training.train import evaluate, train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_training_stack import _net  # noqa: E402

MUTATIONS = {
    "lr": FloatDistribution(0.01, 0.2, log=True),
    "weight_decay": FloatDistribution(0.0, 1e-3),
    "label_smoothing": CategoricalDistribution([0.0, 0.05, 0.1]),
}


def _inside(distribution, value) -> bool:
    if isinstance(distribution, CategoricalDistribution):
        return value in distribution.choices
    return distribution.low <= value <= distribution.high


distributions = st.one_of(
    st.tuples(st.floats(1e-4, 1.0), st.floats(1.01, 100.0), st.booleans()).map(
        lambda t: FloatDistribution(t[0], t[0] * t[1], log=t[2])
    ),
    st.tuples(st.integers(1, 50), st.integers(0, 40), st.integers(1, 4)).map(
        lambda t: IntDistribution(t[0], t[0] + t[1] * t[2], step=t[2])
    ),
    st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=True).map(CategoricalDistribution),
)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(distribution=distributions, seed=st.integers(0, 2**32 - 1), factor=st.floats(0.01, 100))
def test_drawn_perturbed_and_explored_settings_stay_inside_their_ranges(distribution, seed, factor):
    rng = np.random.default_rng(seed)
    value = draw(distribution, rng)
    assert _inside(distribution, value)
    assert _inside(distribution, perturb(distribution, value, factor))
    config = PopulationBasedTraining(mutations={"lr": distribution}, resample=0.5)
    assert _inside(distribution, explore({"lr": value}, config, rng)["lr"])


@pytest.mark.parametrize(
    "changes",
    [{}, {"warmup_epochs": 1.0}, {"schedule": "onecycle"}],
    ids=["cosine", "warmup", "onecycle"],
)
def test_a_restored_schedule_takes_the_new_peak_where_it_is_in_its_course(changes):
    def stepped(lr: float, steps: int):
        config = TrainConfig(epochs=4, lr=lr, **changes)
        optimizer = make_optimizer([torch.nn.Parameter(torch.zeros(1))], config, False)
        schedule = make_schedule(optimizer, config, 10, config.epochs)
        for _ in range(steps):
            optimizer.step()
            schedule.step()
        return optimizer, schedule

    optimizer, schedule = stepped(0.05, 17)
    retune(optimizer, schedule, lr=0.2, weight_decay=1e-3)
    expected, expected_schedule = stepped(0.2, 17)
    for _ in range(9):  # and it goes on as the schedule of the new peak would
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected.param_groups[0]["lr"])
        assert optimizer.param_groups[0]["weight_decay"] == 1e-3
        optimizer.step(), schedule.step(), expected.step(), expected_schedule.step()


def test_a_run_in_parts_is_the_run_straight_and_new_settings_win_over_restored_ones(
    digits, tmp_path
):
    config = TrainConfig(epochs=3, lr=0.05, crop_padding=1, device="cpu")
    straight = _net()
    train(straight, digits, config, seed=1)
    parts, checkpoint = _net(), tmp_path / "train.pt"
    first = train(parts, digits, config, seed=1, checkpoint=checkpoint, until=2)
    assert [e.epoch for e in first.history] == [1, 2]
    train(parts, digits, config, seed=1, checkpoint=checkpoint)
    for name, value in straight.state_dict().items():
        assert torch.equal(parts.state_dict()[name], value), name

    faster = TrainConfig(epochs=3, lr=0.1, weight_decay=1e-4, crop_padding=1, device="cpu")
    resumed = tmp_path / "resumed.pt"
    train(_net(), digits, config, seed=1, checkpoint=resumed, until=2, adaptive=["lr"])
    train(_net(), digits, faster, seed=1, checkpoint=resumed, adaptive=["lr", "weight_decay"])
    group = torch.load(resumed, weights_only=True)["optimizer"]["param_groups"][0]
    assert group["initial_lr"] == pytest.approx(0.1) and group["weight_decay"] == 1e-4
    with pytest.raises(ConfigError, match=r"\['batch_size'\] cannot change while a run trains"):
        train(_net(), digits, config, seed=1, adaptive=["batch_size"])


def _population(**changes) -> PopulationBasedTraining:
    return PopulationBasedTraining(
        **{"size": 4, "interval": 1, "quantile": 0.25, "mutations": MUTATIONS, **changes}
    )


CONFIG = TrainConfig(epochs=3, batch_size=64, lr=0.05, crop_padding=1, device="cpu")


def _bn_net(seed: int = 0) -> torch.nn.Module:
    """A small conv net with batch norm, whose running statistics trail its weights."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )


def test_precise_bn_gives_the_statistics_of_the_weights_as_they_are(digits):
    model = _bn_net()
    train(model, digits, TrainConfig(epochs=2, batch_size=64, lr=0.05, device="cpu"), seed=0)
    trained = evaluate(model, digits.val, digits)[0]
    norm = model[1]
    norm.running_mean += 3.0  # statistics of weights the network no longer has
    norm.running_var *= 9.0
    lagging = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    stale = evaluate(model, digits.val, digits)[0]

    images = 200
    scored = precise_bn(model, digits.train, digits, images=images, batch_size=images)
    assert scored is not model and not scored.training and model.training
    for name, value in model.state_dict().items():
        assert torch.equal(value, lagging[name]), name  # the model itself as it was
    x = digits.normalize(digits.train.x[:images])
    inputs = model[0](x).detach()  # what the batch norm sees, over the images
    torch.testing.assert_close(scored[1].running_mean, inputs.mean((0, 2, 3)))
    torch.testing.assert_close(scored[1].running_var, inputs.var((0, 2, 3), unbiased=True))
    fresh = evaluate(scored, digits.val, digits)[0]
    assert stale < trained - 0.3 and fresh > trained - 0.05, (stale, trained, fresh)

    plain = _net()
    assert precise_bn(plain, digits.train, digits, images=images) is plain  # nothing to do
    with pytest.raises(ValueError, match="images=0"):
        precise_bn(model, digits.train, digits, images=0)


def test_a_population_exploits_explores_and_its_winner_replays_to_the_same_weights(
    digits, tmp_path
):
    population = _population(seed=3)
    result = train_population(_bn_net, digits, CONFIG, population, tmp_path / "pop", seed=7)
    assert [r["epoch"] for r in result.rounds] == [1, 2]  # a round a boundary, none at the end
    for round_ in result.rounds:
        (exploit,) = round_["exploits"]  # the bottom quarter of 4
        assert exploit["member"] == round_["ranking"][-1]
        assert exploit["from"] == round_["ranking"][0]
        assert all(_inside(MUTATIONS[k], v) for k, v in exploit["after"].items())
        # Ranked by the accuracy with batch-norm statistics recomputed, best first.
        epoch = str(round_["epoch"])
        precise = {m["id"]: m["precise_bn"][epoch] for m in result.members}
        assert round_["scores"] == [precise[i] for i in round_["ranking"]]
        assert round_["scores"] == sorted(round_["scores"], reverse=True)
    for member in result.members:
        assert member["epoch"] == 3 and set(member["scores"]) == {"1", "2", "3"}
        assert set(member["precise_bn"]) == {"1", "2"}  # at each round, not at the end
        assert [s["to"] for s in member["schedule"]][-1] == 3
        assert member["schedule"][0]["from"] == 0
    scores = {m["id"]: m["scores"]["3"] for m in result.members}
    assert result.val_accuracy == max(scores.values()) == scores[result.winner]
    record = json.loads((tmp_path / "pop" / "population.json").read_text())
    assert record["rounds"] == result.rounds  # what it did is stored

    replayed, history = replay(_bn_net, digits, CONFIG, result.schedule, seed=7)
    winner = result.load(_bn_net())  # its statistics as trained: the same, bit for bit
    for name, value in winner.state_dict().items():
        assert torch.equal(replayed.state_dict()[name], value), name
    assert history[-1].val_accuracy == result.val_accuracy

    burnt = train_population(_bn_net, digits, CONFIG, _population(seed=3, burn_in=2,
                             precise_bn=0), tmp_path / "burn", seed=7)  # fmt: skip
    assert [r["epoch"] for r in burnt.rounds] == [2]  # no round before the burn-in's end
    assert all(link["epoch"] >= 2 for m in burnt.members for link in m["lineage"])
    assert sum(len(m["lineage"]) for m in burnt.members) == 1
    assert not any("precise_bn" in m for m in burnt.members)  # ranked as trained
    (round_,) = burnt.rounds
    assert round_["scores"] == [burnt.members[i]["scores"]["2"] for i in round_["ranking"]]

    # The same folder, asked again: nothing trains, the same result.
    again = train_population(_bn_net, digits, CONFIG, population, tmp_path / "pop", seed=7)
    assert again.rounds == result.rounds and again.winner == result.winner
    with pytest.raises(ConfigError, match="holds another population .*seed"):
        train_population(_bn_net, digits, CONFIG, population, tmp_path / "pop", seed=8)


_WORKER = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from test_population import CONFIG, _population
    from test_training_stack import _net
    from autosearch.data import load_data
    from autosearch.population import train_population

    KILL = {kill!r}  # (member, epoch): die there, mid-interval, like a lost machine

    def on_epoch(member, epoch):
        if KILL and (member, epoch.epoch) == tuple(KILL):
            os.kill(os.getpid(), signal.SIGKILL)

    train_population(_net, load_data("digits"), CONFIG, _population(seed=3), {folder!r},
                     seed=7, on_epoch=on_epoch, poll=0.05)
    """
)


def _worker(folder: Path, kill: tuple[int, int] | None = None) -> subprocess.Popen:
    code = _WORKER.format(tests=str(ROOT / "tests"), folder=str(folder), kill=kill)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_a_killed_worker_and_two_workers_at_once_give_the_population_of_one(digits, tmp_path):
    alone = train_population(_net, digits, CONFIG, _population(seed=3), tmp_path / "a", seed=7)

    killed = _worker(tmp_path / "b", kill=(2, 2))  # member 2, in the middle of its round
    _, err = killed.communicate(timeout=1800)
    assert killed.returncode == -signal.SIGKILL, err.decode()[-2000:]
    record = json.loads((tmp_path / "b" / "population.json").read_text())
    assert "2" in record["claims"]  # held by a process that is gone
    resumed = train_population(_net, digits, CONFIG, _population(seed=3), tmp_path / "b", seed=7)

    workers = [_worker(tmp_path / "c") for _ in range(2)]
    for worker in workers:
        _, err = worker.communicate(timeout=1800)
        assert worker.returncode == 0, err.decode()[-2000:]
    shared = train_population(_net, digits, CONFIG, _population(seed=3), tmp_path / "c", seed=7)

    for other in (resumed, shared):
        assert other.rounds == alone.rounds  # the same choices, in the same rounds
        assert [m["scores"] for m in other.members] == [m["scores"] for m in alone.members]
        assert other.winner == alone.winner and other.schedule == alone.schedule
        assert other.members == alone.members
    assert all(math.isfinite(m["scores"]["3"]) for m in alone.members)


def test_bad_population_settings_are_refused_in_one_line():
    for changes, match in [
        ({"size": 1}, "size=1: a population needs 2 or more members"),
        ({"quantile": 0.7}, r"quantile=0.7: expected a share in \(0, 0.5\]"),
        ({"mutations": {"batch_size": IntDistribution(16, 64)}}, "only lr, weight_decay"),
        ({"mutations": {}}, "name at least one setting"),
        ({"factors": (0.8, -1)}, "factors="),
        ({"precise_bn": -1}, "precise_bn=-1: expected a number of training images >= 0"),
        ({"precise_bn": True}, "precise_bn=True"),
    ]:
        with pytest.raises(ConfigError, match=match):
            PopulationBasedTraining(**changes)
    population = PopulationBasedTraining(mutations={"label_smoothing": FloatDistribution(0.5, 2.0)})
    with pytest.raises(ConfigError, match="label_smoothing"):
        population.check(CONFIG)


def test_autosearch_train_runs_a_population_and_replays_its_schedule(make_study, tmp_path, capsys):
    from safetensors.torch import load_file

    from autosearch.cli import main

    study = make_study()
    study.optimize(1)
    out = study.export(study.best(), tmp_path / "best")
    population = ["--population", "3", "--population-interval", "1"]
    assert main(["train", str(out), "--epochs", "2", *population]) == 0
    said = capsys.readouterr().out
    assert "population of 3: member" in said and "schedule.json" in said
    page = (out / "full" / "population.html").read_text()
    assert "population of 3: 1 exploits in 1 rounds" in page and "member 2" in page
    metrics = json.loads((out / "full" / "metrics.json").read_text())
    assert metrics["population"]["size"] == 3 and len(metrics["population"]["rounds"]) == 1
    assert metrics["epochs"] == 2 and metrics["val_accuracy"] == pytest.approx(
        max(metrics["population"]["final"].values())
    )
    schedule = out / "full" / "schedule.json"
    trained = load_file(out / "full" / "model.safetensors")
    again = tmp_path / "again"
    again.mkdir()
    for name in ("model.py", "arch.json"):
        (again / name).write_bytes((out / name).read_bytes())
    assert main(["train", str(again), "--epochs", "2", "--schedule", str(schedule)]) == 0
    replayed = load_file(again / "full" / "model.safetensors")
    assert trained.keys() == replayed.keys()
    for name, value in trained.items():  # the same network, from the schedule alone
        assert torch.equal(replayed[name], value), name
    assert main(["train", str(again), "--epochs", "3", "--schedule", str(schedule)]) == 2
    assert "schedules 2 epochs but the run trains 3" in capsys.readouterr().err


def test_a_worker_stopped_by_ctrl_c_frees_its_member_and_goes_on_later(digits, tmp_path):
    def stop(member, epoch):
        if (member, epoch.epoch) == (1, 2):
            raise KeyboardInterrupt

    folder = tmp_path / "pop"
    with pytest.raises(KeyboardInterrupt):
        train_population(_net, digits, CONFIG, _population(seed=3), folder, seed=7, on_epoch=stop)
    record = json.loads((folder / "population.json").read_text())
    assert record["claims"] == {}  # free at once, not after the grace of a lost worker
    resumed = train_population(_net, digits, CONFIG, _population(seed=3), folder, seed=7)
    alone = train_population(_net, digits, CONFIG, _population(seed=3), tmp_path / "a", seed=7)
    assert resumed.rounds == alone.rounds and resumed.members == alone.members
