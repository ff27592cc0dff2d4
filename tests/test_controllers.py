"""Controllers: resumable, parallel-safe, multi-objective, and better than random."""

from __future__ import annotations

import functools
import itertools
import logging

import numpy as np
import pytest
import torch
from scipy.stats import mannwhitneyu

import autosearch
from autosearch import ConfigError, Outcome, Table
from autosearch.registry import controllers
from controllers import NSGA2, TPE, LocalSearch, RegularizedEvolution, Reinforce
from search_spaces import MobileNetSpace, NB201Space
from search_spaces.nb201 import EDGES, OPERATIONS

SINGLE = ["random", "evolution", "reinforce", "tpe", "gp", "optuna", "local"]


def _accuracy(ops: tuple[str, ...]) -> float:
    """A synthetic NB201 landscape with a known optimum (all 3×3 convolutions): each edge
    adds its operation's quality, and the 0→3 edge interacts with the others."""
    quality = {
        "none": 0.0,
        "skip_connect": 0.3,
        "nor_conv_1x1": 0.6,
        "nor_conv_3x3": 1.0,
        "avg_pool_3x3": 0.1,
    }
    score = sum(quality[o] for o in ops) + 0.5 * quality[ops[3]] * quality[ops[5]]
    return 0.5 + 0.45 * score / 6.5


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    space = NB201Space()
    path = tmp_path_factory.mktemp("nb201") / "synthetic.csv"
    lines = ["arch,val_accuracy,test_accuracy,train_time"]
    for ops in itertools.product(OPERATIONS, repeat=len(EDGES)):
        genes = {f"node{j}.in{i}": op for (j, i), op in zip(EDGES, ops, strict=True)}
        acc = _accuracy(ops)
        convs = sum(o.startswith("nor_conv") for o in ops)
        lines.append(f"{space.to_string(space.make(genes))},{acc:.6f},{acc:.6f},{60 + 20 * convs}")
    path.write_text("\n".join(lines) + "\n")
    return Table(path=str(path))


def _best_found(name: str, table: Table, seed: int, budget: int) -> float:
    space = NB201Space()
    controller = controllers.get(name)(space, seed=seed)
    best = 0.0
    for _ in range(budget):
        arch = controller.ask()
        accuracy = table.evaluate(space, arch)["accuracy"]
        controller.tell(arch, Outcome(reward=accuracy, objectives={"accuracy": accuracy}))
        best = max(best, accuracy)
    return best


@functools.cache
def _random_baseline(table: Table, seeds: range, budget: int) -> list[float]:
    """Random search's best over ``seeds``: the same for every controller compared with
    it (seeded, the module's table), so searched once."""
    return [_best_found("random", table, s, budget) for s in seeds]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["evolution", "reinforce", "tpe", "local"])
def test_beats_random_search_over_seeds(name, table):
    """A one-sided Mann-Whitney U test over 10 seeds, not one lucky run."""
    seeds, budget = range(10), 60
    found = [_best_found(name, table, s, budget) for s in seeds]
    baseline = _random_baseline(table, seeds, budget)
    result = mannwhitneyu(found, baseline, alternative="greater")
    assert result.pvalue < 0.05, (np.mean(found), np.mean(baseline), result.pvalue)
    assert np.mean(found) > np.mean(baseline)


def test_local_search_walks_to_the_optimum_of_a_smooth_landscape(table):
    """The test landscape has one optimum (all 3x3 convolutions) and no other local
    optimum: a walk over one-gene neighbourhoods ranked by the predictor reaches it."""
    space = NB201Space()
    top = max(table.rows().values(), key=lambda r: r["val_accuracy"])["val_accuracy"]
    reached = []
    for seed in range(10):
        local = LocalSearch(space, seed=seed)
        for n in range(1, 151):
            arch = local.ask()
            accuracy = table.evaluate(space, arch)["accuracy"]
            local.tell(arch, Outcome(reward=accuracy))
            if accuracy == top:
                reached.append(n)
                break
    assert len(reached) == 10, reached  # in every seed, within 150 evaluations
    assert np.median(reached) < 60, reached


def test_evolution_walks_the_best_results_unseen_neighbourhood():
    space = NB201Space(operations=("none", "skip_connect", "nor_conv_3x3"))
    evolution = RegularizedEvolution(space, seed=0, population=3, sample=2, walk=1.0)
    told = []
    for reward in (0.3, 0.9, 0.5):  # the warm-up: uniform samples
        arch = evolution.ask()
        evolution.tell(arch, Outcome(reward=reward))
        told.append(arch)
    best = told[1]
    steps = [evolution.ask() for _ in range(len(space.neighbours(best)))]
    neighbours = {a.arch_id for a in space.neighbours(best)} - {a.arch_id for a in told}
    assert {a.arch_id for a in steps[: len(neighbours)]} == neighbours  # each once
    assert RegularizedEvolution(space, walk=0).config()["walk"] == 0
    assert RegularizedEvolution(space).config()["walk"] == 0.9  # the measured defaults
    both = {"accuracy": "maximize", "flops": "minimize"}
    assert RegularizedEvolution(space, objectives=both).config()["walk"] == 0.8
    with pytest.raises(ConfigError, match="walk is a probability"):
        RegularizedEvolution(space, walk=1.5)


def test_local_search_steps_to_the_predicted_best_neighbour_and_skips_seen_ones():
    space = NB201Space(operations=("none", "skip_connect", "nor_conv_3x3"))
    local = LocalSearch(space, seed=0, warmup=1)
    first = local.ask()
    local.tell(first, Outcome(reward=0.5))
    step = local.ask()  # one gene away from the only result
    assert sum(a != b for a, b in zip(first.values(), step.values(), strict=True)) == 1
    assert step in space.neighbours(first) and step.arch_id != first.arch_id
    pending = [local.ask() for _ in range(len(space.neighbours(first)) - 1)]
    assert len({a.arch_id for a in [step, *pending]}) == len(space.neighbours(first))
    nxt = local.ask()  # the neighbourhood is exhausted: elsewhere, and never a repeat
    assert nxt.arch_id not in {a.arch_id for a in [first, step, *pending]}


@pytest.mark.parametrize("name", SINGLE)
def test_parallel_asks_never_repeat(name):
    space = NB201Space()
    controller = controllers.get(name)(space, seed=0)
    pending = [controller.ask() for _ in range(25)]  # 25 workers ask before anyone tells
    assert len({a.arch_id for a in pending}) == 25
    for arch in pending[:10]:
        controller.tell(arch, Outcome(reward=0.5, objectives={"accuracy": 0.5}))
    later = [controller.ask() for _ in range(10)]
    assert not {a.arch_id for a in later} & {a.arch_id for a in pending}


@pytest.mark.parametrize("name", [*SINGLE, "nsga2"])
def test_a_resumed_study_makes_the_same_decisions(name, table, tmp_path):
    def study(db: str):
        space = NB201Space()
        options = {"seed": 3}
        controller = controllers.get(name)(space, **options)
        return autosearch.create_study(
            "s",
            controller=controller,
            table=table,
            storage=f"sqlite:///{tmp_path}/{db}",
            objectives=("accuracy", "flops"),
            load_if_exists=True,
        )

    straight = study("straight.db")
    straight.optimize(12)
    first = study("resumed.db")
    first.optimize(7)
    resumed = autosearch.load_study("s", storage=f"sqlite:///{tmp_path}/resumed.db")
    assert type(resumed.controller) is type(first.controller)
    resumed.optimize(5)
    assert [r.arch for r in resumed.records()] == [r.arch for r in straight.records()]


def test_replay_alone_rebuilds_a_controller_that_lost_its_state(table, tmp_path):
    study = autosearch.create_study(
        "r",
        controller=RegularizedEvolution(NB201Space(), seed=1),
        table=table,
        storage=f"sqlite:///{tmp_path}/r.db",
    )
    study.optimize(25)
    # Forget the saved controller state: every stored result is replayed instead.
    study._storage.set_study_system_attr(study._study_id, "autosearch:controller", None)
    again = autosearch.load_study("r", storage=f"sqlite:///{tmp_path}/r.db")
    members = again.controller.state_dict()["population"]
    assert len(members) == 20  # the last 20 told, after aging
    assert {m[0] for m in members} <= {r.arch.to_json() for r in study.records()}
    assert len(again.optimize(3)) == 3


def test_failed_and_foreign_outcomes_are_learned_sensibly():
    space = NB201Space()
    evolution = RegularizedEvolution(space, seed=0, population=4, sample=2)
    rng = np.random.default_rng(0)
    archs = [space.sample(rng) for _ in range(6)]
    evolution.tell(archs[0], Outcome.failed("out of memory"))
    for i, arch in enumerate(archs[1:]):
        evolution.tell(arch, Outcome(reward=i / 10))
    population = evolution.state_dict()["population"]
    assert [m[0] for m in population] == [a.to_json() for a in archs[2:]]  # aged, no failure
    assert archs[0].arch_id not in {evolution.ask().arch_id for _ in range(20)}
    rl = Reinforce(space, seed=0, batch_size=2)
    rl.tell(archs[1], Outcome(reward=0.9))
    rl.tell(archs[2], Outcome(reward=0.1))
    assert rl.state_dict()["updates"] == 1  # foreign results train the policy too


def test_multi_objective_evolution_prefers_the_front():
    space = NB201Space()
    evolution = RegularizedEvolution(
        space,
        seed=0,
        population=5,
        sample=5,
        objectives={"accuracy": "maximize", "flops": "minimize"},
    )
    rng = np.random.default_rng(1)
    archs = [space.sample(rng) for _ in range(5)]
    points = [(0.9, 9.0), (0.8, 5.0), (0.7, 9.5), (0.6, 9.9), (0.95, 1.0)]  # last dominates
    for arch, (acc, flops) in zip(archs, points, strict=True):
        evolution.tell(arch, Outcome(reward=acc, objectives={"accuracy": acc, "flops": flops}))
    assert evolution._tournament() == archs[4]
    with pytest.raises(autosearch.AutosearchError, match="lacks \\['flops'\\]"):
        evolution.tell(archs[0], Outcome(reward=0.5, objectives={"accuracy": 0.5}))


def test_nsga2_searches_a_two_objective_study(table, tmp_path):
    url = f"sqlite:///{tmp_path}/mo.db"
    with pytest.raises(ConfigError, match="optimises \\['accuracy', 'flops'\\]"):
        autosearch.create_study(
            "bad",
            controller=NSGA2(NB201Space(), seed=0),
            table=table,
            objectives=("accuracy", "train_seconds"),
            storage=url,
        )
    controller = NSGA2(
        NB201Space(), seed=0, objectives={"accuracy": "maximize", "train_seconds": "minimize"}
    )
    study = autosearch.create_study(
        "mo",
        controller=controller,
        table=table,
        objectives=("accuracy", "train_seconds"),
        storage=url,
    )
    records = study.optimize(20)
    assert len({r.arch for r in records}) == 20 and study.pareto()
    assert autosearch.load_study("mo", storage=url).controller.objectives == controller.objectives


def test_optuna_controller_rejects_unknown_samplers_and_tpe_handles_big_spaces():
    with pytest.raises(autosearch.UnknownNameError, match="Did you mean 'tpe'"):
        controllers.get("optuna")(NB201Space(), sampler="tpee")
    space = MobileNetSpace(max_params=3e6)  # 55 genes, budget-constrained
    tpe = TPE(space, seed=0)
    for _ in range(12):
        arch = tpe.ask()
        assert space.within_budget(arch)
        tpe.tell(arch, Outcome(reward=float(np.mean(space.encode(arch)))))


@pytest.mark.parametrize("name", ["random", "evolution", "reinforce"])
def test_controllers_propose_every_architecture_once_then_say_the_space_is_exhausted(name):
    space = NB201Space(operations=("none", "skip_connect"))  # 64 cells
    controller = controllers.get(name)(space, seed=0, max_tries=1)  # fall back at once
    seen = set()
    for _ in range(64):
        arch = controller.ask()
        seen.add(arch.arch_id)
        controller.tell(arch, Outcome(reward=float(np.mean(space.encode(arch)))))
    assert len(seen) == 64
    with pytest.raises(autosearch.SpaceExhausted, match="every architecture .* search is complete"):
        controller.ask()


def test_a_collapsed_policy_falls_back_to_unseen_architectures_and_says_so(caplog):
    space = NB201Space()
    rl = Reinforce(space, seed=0)
    with torch.no_grad():  # the policy puts all its mass on the first value of each gene
        for head in rl._policy.heads:
            head.weight.zero_()
            head.bias.copy_(torch.tensor([50.0] + [-50.0] * (head.out_features - 1)))
    collapsed = rl.ask()
    rl.tell(collapsed, Outcome(reward=0.9))
    with caplog.at_level(logging.INFO, logger="autosearch.controller"):
        asked = [rl.ask() for _ in range(40)]
    assert len({a.arch_id for a in asked} | {collapsed.arch_id}) == 41  # no repeat, no raise
    assert "REINFORCE policy sampled only seen architectures" in caplog.text
    # the fallback explores next to where the policy points: one gene away first
    assert sum(a != b for a, b in zip(asked[0].values(), collapsed.values(), strict=True)) == 1


@pytest.mark.parametrize("name", ["tpe", "reinforce"])
def test_a_study_runs_until_the_space_is_exhausted_and_ends_with_that_message(
    name, table, tmp_path, caplog
):
    small = NB201Space(operations=("none", "skip_connect"))  # 64 cells
    study = autosearch.create_study(
        f"exhaust-{name}",
        controller=controllers.get(name)(small, seed=0),
        table=table,
        storage=f"sqlite:///{tmp_path}/s.db",
    )
    with caplog.at_level(logging.INFO):
        records = study.optimize(70)
    assert len(records) == 64 and len({r.arch for r in records}) == 64
    assert "search is complete" in caplog.text and "ends here" in caplog.text


@pytest.mark.parametrize("name", ["evolution", "reinforce", "tpe", "random", "nsga2"])
def test_every_controller_runs_from_the_cli(name, table, tmp_path, monkeypatch, capsys):
    from autosearch.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "search",
            f"cli-{name}",
            "--space",
            "nb201",
            "--controller",
            name,
            "--table",
            table.path,
            "--n-trials",
            "8",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "8 of 8" not in out and "Pareto front" in out
    study = autosearch.load_study(f"cli-{name}", storage=f"sqlite:///runs/cli-{name}/study.db")
    assert study.controller.name == name and study.trials.count("complete") == 8


def test_any_optuna_sampler_class_by_its_path(tmp_path, table):
    controller = controllers.get("optuna")(
        NB201Space(), sampler="optuna.samplers.QMCSampler", seed=0
    )
    study = autosearch.create_study(
        "q", controller=controller, table=table, storage=f"sqlite:///{tmp_path}/q.db"
    )
    study.optimize(4)
    again = autosearch.load_study("q", storage=f"sqlite:///{tmp_path}/q.db")
    assert again.controller.sampler == "optuna.samplers.QMCSampler"
    assert len(again.optimize(2)) == 2
    with pytest.raises(autosearch.UnknownNameError, match="'optuna.samplers.NoSuchSampler'"):
        controllers.get("optuna")(NB201Space(), sampler="optuna.samplers.NoSuchSampler")
    with pytest.raises(autosearch.UnknownNameError, match="unknown Optuna sampler 'tpee'"):
        controllers.get("optuna")(NB201Space(), sampler="tpee")


def test_multi_objective_tpe_moves_the_front(table, tmp_path):
    objectives = {"accuracy": "maximize", "train_seconds": "minimize"}
    study = autosearch.create_study(
        "motpe",
        controller=TPE(NB201Space(), seed=0, objectives=objectives),
        table=table,
        objectives=tuple(objectives),
        storage=f"sqlite:///{tmp_path}/motpe.db",
    )
    records = study.optimize(30)
    assert len({r.arch for r in records}) == 30
    front = study.pareto()
    assert len(front) >= 2  # a real trade-off: fast cells and accurate cells
    assert min(r.metrics["train_seconds"] for r in front) < max(
        r.metrics["train_seconds"] for r in front
    )
