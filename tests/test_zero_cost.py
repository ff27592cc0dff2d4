"""The zero-cost warm-up: a controller's first proposals are the best-scored of an
untrained pool, and everything after is the wrapped controller's, resumable exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import autosearch
from autosearch import ConfigError, Outcome
from controllers import RandomSearch, RegularizedEvolution, ZeroCostWarmup
from search_spaces import NB201Space


def _convs(arch) -> float:
    return float(sum(v == "nor_conv_3x3" for v in arch.genes.values()))


def _params(arch) -> float:
    return float(sum(v in ("nor_conv_3x3", "nor_conv_1x1") for v in arch.genes.values()))


def _scores(archs):
    return {"convs": [_convs(a) for a in archs], "params": [_params(a) for a in archs]}


def _reward(arch) -> float:
    return _convs(arch) + 0.1 * _params(arch)


def _warmup(seed=0, first=8, pool=64, inner=None, **kw):
    space = NB201Space()
    inner = inner or RegularizedEvolution(space, seed=seed, population=8, sample=3)
    return ZeroCostWarmup(
        space, controller=inner, scores=_scores, pool=pool, first=first, seed=seed, **kw
    )


@pytest.mark.parametrize("aggregate", ["log_rank", "mean_rank"])
def test_the_first_proposals_are_the_pools_best_by_their_combined_ranks(aggregate):
    controller = _warmup(proxies=("convs", "params"), aggregate=aggregate)
    asked = [controller.ask() for _ in range(8)]
    ranked = controller.ranked  # the pool of 64 uniform draws, best first
    assert len(ranked) == 64 and len({i for i, _ in ranked}) == 64
    assert [a.arch_id for a in asked] == [i for i, _ in ranked[:8]]
    # The order is the definition's, recomputed here: each proxy ranked over the pool
    # (ties share their mean rank), the ranks' logarithms summed (AZ-NAS) or the ranks
    # averaged, the highest first.
    pool = NB201Space().sample  # the same seeded draw as the controller's
    rng, drawn = np.random.default_rng(0), {}
    while len(drawn) < 64:
        arch = pool(rng)
        drawn.setdefault(arch.arch_id, arch)
    archs = list(drawn.values())
    ranks = [stats.rankdata([f(a) for a in archs]) for f in (_convs, _params)]
    if aggregate == "log_rank":
        mean = np.log(ranks[0] / 64) + np.log(ranks[1] / 64)
    else:
        mean = (ranks[0] + ranks[1]) / 2
    expected = sorted(zip(mean, range(64), strict=True), key=lambda m: -m[0])
    assert [r for _, r in ranked] == pytest.approx([m for m, _ in expected])
    assert [a.arch_id for a in asked] == [archs[i].arch_id for _, i in expected[:8]]


def test_after_the_warm_up_the_wrapped_controller_proposes_and_learns_from_everything():
    space = NB201Space()
    inner = RegularizedEvolution(space, seed=1, population=8, sample=3)
    controller = ZeroCostWarmup(space, controller=inner, scores=_scores, pool=32, first=8, seed=1)
    seen = []

    def step():
        arch = controller.ask()
        seen.append(arch.arch_id)
        controller.tell(arch, Outcome(reward=_reward(arch)))

    for _ in range(8):
        step()
    assert seen == [i for i, _ in controller.ranked[:8]]
    # The evolution's population is exactly the warm-up's proposals, told to it.
    members = [arch for arch, _, _ in inner.state_dict()["population"]]
    assert [autosearch.Architecture.from_json(m).arch_id for m in members] == seen
    # From there, exactly the wrapped controller's own search: a twin told the same
    # outcomes proposes the same architectures.
    twin = RegularizedEvolution(space, seed=1, population=8, sample=3)
    for m in members:
        arch = autosearch.Architecture.from_json(m)
        twin.tell(arch, Outcome(reward=_reward(arch)))
    for _ in range(32):
        step()
        arch = twin.ask()
        assert arch.arch_id == seen[-1]
        twin.tell(arch, Outcome(reward=_reward(arch)))
    assert len(set(seen)) == 40  # never the same architecture twice


def test_a_pool_given_replaces_the_draw_and_its_proxies_must_cover_it():
    space = NB201Space()
    rng = np.random.default_rng(3)
    given_pool = [space.sample(rng) for _ in range(20)]
    controller = ZeroCostWarmup(
        space, controller=RandomSearch(space, seed=0), scores=_scores, first=5,
        candidates=given_pool, proxies=("convs",),
    )  # fmt: skip
    best = sorted(given_pool, key=lambda a: -_convs(a))
    first = [controller.ask() for _ in range(5)]
    assert {a.arch_id for a in first} <= {a.arch_id for a in given_pool}
    assert sorted(_convs(a) for a in first) == sorted(_convs(a) for a in best[:5])
    bad = ZeroCostWarmup(
        space, controller=RandomSearch(space, seed=0), scores=_scores, first=2, pool=4,
        proxies=("synflow",),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="synflow"):
        bad.ask()
    with pytest.raises(ConfigError, match="first <= pool"):
        ZeroCostWarmup(space, controller=RandomSearch(space), scores=_scores, first=9, pool=8)
    with pytest.raises(ConfigError, match="same space"):
        ZeroCostWarmup(space, controller=RandomSearch(NB201Space()), scores=_scores)
    with pytest.raises(autosearch.UnknownNameError, match="unknown aggregation .log.. Did you"):
        ZeroCostWarmup(space, controller=RandomSearch(space), scores=_scores, aggregate="log")


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(stop=st.integers(0, 20), seed=st.integers(0, 3), first=st.integers(1, 10))
def test_a_resumed_warm_up_continues_the_same_sequence(stop, seed, first):
    """Stopped after any number of asks and tells (inside the warm-up or after it), a
    new instance loaded with the state proposes what the original proposes next."""

    def step(c):
        arch = c.ask()
        c.tell(arch, Outcome(reward=_reward(arch)))
        return arch.arch_id

    original = _warmup(seed=seed, first=first, pool=24)
    for _ in range(stop):
        step(original)
    state = original.state_dict()
    resumed = _warmup(seed=seed, first=first, pool=24)
    resumed.load_state_dict(state)
    assert [step(original) for _ in range(8)] == [step(resumed) for _ in range(8)]


def test_the_controller_benchmark_runs_each_controller_with_the_warm_up_too(tmp_path):
    """`benchmarks/search_quality.py --warmup` on the published NAS-Bench-201 table, with
    proxy files as nb201_proxies.py writes them (here a stand-in proxy that is the
    published accuracy itself): the warm-up's first proposal is the pool's best."""
    import csv
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    table = root.parent / "shared" / "benchdata" / "nb201_cifar10_valid.csv"
    if not table.exists():
        pytest.skip(f"the published table is not at {table}")
    with table.open() as f:
        rows = list(csv.DictReader(f))[:40]
    accuracy = [float(r["val_accuracy"]) for r in rows]
    scored = [[r["arch"], a, a] for r, a in zip(rows, accuracy, strict=True)]
    run = {"cells": 40, "seconds": {"synflow": 4.0, "naswot": 9.0, "build": 2.0},
           "scored_columns": ["cell", "published", "synflow"], "scored": scored}  # fmt: skip
    (tmp_path / "proxies.json").write_text(json.dumps({"seeds": [run]}))
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "search_quality.py"), "--table", str(table),
         "--warmup", str(tmp_path / "proxies.json"), "--warmup-pool", "30",
         "--warmup-first", "3", "--warmup-proxies", "synflow", "--seeds", "2",
         "--mo-seeds", "0", "--controllers", "random", "--budgets", "1,5"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["warmup"]["warmup_proxy_seconds"] == pytest.approx(30 * (4.0 + 2.0) / 40)
    warm, plain = result["single"]["random+zc"], result["single"]["random"]
    # A pool of 30 of the 40 cells holds at least the 11th best: proposed first.
    assert warm["best_val"]["1"] >= sorted(accuracy)[-11] / 100
    assert len(warm["evals_to_best"]) == len(plain["evals_to_best"]) == 2


def test_a_study_refuses_a_warm_up_it_cannot_store_in_one_line_and_stores_nothing(tmp_path):
    """The warm-up's scorer is code, not JSON: a study, which keeps its controller's
    settings for every worker and a resume, says so before anything is stored."""
    import optuna

    space = NB201Space()
    warm = ZeroCostWarmup(space, controller=RandomSearch(space, seed=0), scores=_scores)
    url = f"sqlite:///{tmp_path}/s.db"
    with pytest.raises(ConfigError, match="cannot store ZeroCostWarmup") as caught:
        autosearch.create_study("zc", space=space, controller=warm, data="digits", storage=url)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "s.db").exists() or optuna.get_all_study_names(url) == []


def test_asked_in_parallel_no_architecture_is_proposed_twice():
    """Workers ask again before any result is told: the warm-up's proposals are marked
    for the wrapped controller, which never proposes them too (here one that walks the
    same 12 candidates in order, skipping what it is told is seen)."""
    from autosearch import Controller

    space = NB201Space()
    rng = np.random.default_rng(5)
    pool = list({a.arch_id: a for a in (space.sample(rng) for _ in range(12))}.values())

    class Listed(Controller):
        def __init__(self, space):
            super().__init__(space)
            self.seen = set()

        def ask(self):
            arch = next(a for a in pool if a.arch_id not in self.seen)
            self.seen.add(arch.arch_id)
            return arch

        def tell(self, arch, outcome):
            self.seen.add(arch.arch_id)

        def mark_seen(self, arch_ids):
            self.seen.update(arch_ids)

        def state_dict(self):
            return {"seen": sorted(self.seen)}

        def load_state_dict(self, state):
            self.seen = set(state["seen"])

        def config(self):
            return {}

    controller = ZeroCostWarmup(
        space, controller=Listed(space), scores=_scores, first=5, candidates=pool
    )
    asked = [controller.ask().arch_id for _ in range(len(pool))]  # nothing told
    assert sorted(asked) == sorted(a.arch_id for a in pool)


# In a study: the study scores the pool on its own images --------------------------------

PAIR = ("synflow", "naswot")


def _pool(study):
    attrs = study._storage.get_study_system_attrs(study._study_id)
    return attrs["autosearch:pool-proxies"]


def _top(pool, k):
    ids = sorted(pool)
    ranks = [stats.rankdata([pool[i][n] for i in ids]) for n in PAIR]
    mean = np.mean(ranks, axis=0)
    return {ids[j] for j in np.argsort(-mean, kind="stable")[:k]}


def test_a_study_scores_its_pool_as_its_trials_and_starts_from_the_best(
    make_study, tiny_space, monkeypatch
):
    """The pool is scored by the study's own proxies, each candidate at the
    initialization its trial trains from on the study's batch: the warm-up's trials
    store exactly the scores they were chosen by. The scores are kept in the storage,
    and a second worker starts from them without scoring anything again."""
    from autosearch.study import replay

    warm = ZeroCostWarmup(tiny_space, pool=12, first=3, seed=0)
    study = make_study("zc", controller=warm, proxies=autosearch.ProxyConfig(names=PAIR, batch=16))
    records = study.optimize(4)
    pool = _pool(study)
    assert len(pool) == 12 and all(set(PAIR) <= set(s) for s in pool.values())
    first = [r.arch.arch_id for r in records[:3]]
    assert set(first) == _top(pool, 3)
    for r in records[:3]:
        for name in PAIR:
            assert r.metrics[name] == pytest.approx(pool[r.arch.arch_id][name], rel=1e-6)
    stored = study.definition.controller
    assert stored.name == "zero_cost" and stored.config["controller"]["name"] == "evolution"

    scored = []
    real = replay.initial_proxies
    monkeypatch.setattr(
        replay, "initial_proxies", lambda *a, **k: scored.append(a[2]) or real(*a, **k)
    )
    again = autosearch.load_study("zc", storage=study.storage_url)
    more = again.optimize(2)
    assert scored == []  # the pool was stored: nothing scored again
    assert len({r.arch.arch_id for r in [*records, *more]}) == 6


def test_a_warm_up_study_resumed_makes_the_same_decisions(make_study, tiny_space):
    config = autosearch.ProxyConfig(names=PAIR, batch=16)

    def warm():
        inner = {"name": "evolution", "config": {"seed": 1, "population": 4, "sample": 2}}
        return ZeroCostWarmup(tiny_space, controller=inner, pool=10, first=3, seed=2)

    straight = make_study("a", controller=warm(), proxies=config)
    straight.optimize(6)
    halves = make_study("b", controller=warm(), proxies=config)
    halves.optimize(4)
    resumed = autosearch.load_study("b", storage=halves.storage_url)
    resumed.optimize(2)
    assert [r.arch.arch_id for r in resumed.records()] == [
        r.arch.arch_id for r in straight.records()
    ]


def test_a_study_refuses_a_warm_up_without_the_proxies_it_ranks_by(
    make_study, tiny_space, tmp_path
):
    import optuna

    for proxies, match in (
        (None, r"add proxies=autosearch\.ProxyConfig"),
        (autosearch.ProxyConfig(names=("naswot",)), r"ranks by \['synflow'\]"),
    ):
        warm = ZeroCostWarmup(tiny_space, proxies=("synflow",))
        with pytest.raises(ConfigError, match=match) as caught:
            make_study("r", controller=warm, proxies=proxies)
        assert "\n" not in str(caught.value)
    assert optuna.get_all_study_names(f"sqlite:///{tmp_path}/r.db") == []
    with pytest.raises(ConfigError, match="give a function, 'cost'"):
        ZeroCostWarmup(tiny_space, scores="flops")
    with pytest.raises(ConfigError, match="no scorer"):
        ZeroCostWarmup(tiny_space).ask()  # outside a study, nothing to score with


def test_cost_scores_rank_the_pool_by_flops_and_parameters_with_no_data():
    space = NB201Space()
    warm = ZeroCostWarmup(space, scores="cost", pool=40, first=5, seed=3)
    asked = [warm.ask() for _ in range(5)]
    flops = {a.arch_id: space.cost(a).flops for a in warm._draw()}
    assert min(flops[a.arch_id] for a in asked) >= sorted(flops.values())[-10]
    assert warm.config()["scores"] == "cost"  # JSON: a study can store it


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(lost=st.sets(st.integers(0, 7), max_size=5), damaged=st.sets(st.integers(0, 7)))
def test_pool_scores_survive_lost_writes_and_damaged_entries(lost, damaged):
    """Workers scoring one pool write the whole record, read just before: a write lost
    to another worker's (simulated: dropped), or an entry damaged, is scored again, and
    every reader ends with each candidate's own values, computed at most once more."""
    import optuna

    from autosearch.study.replay import PoolScores

    storage = optuna.storages.InMemoryStorage()
    study_id = storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "p")
    space = NB201Space()
    rng = np.random.default_rng(0)
    archs = list({a.arch_id: a for a in (space.sample(rng) for _ in range(8))}.values())[:8]
    calls = []

    def score(arch):
        calls.append(arch.arch_id)
        return {"convs": _convs(arch), "params": _params(arch), "other": 1.0}

    writes = iter(range(1000))
    real_set = storage.set_study_system_attr

    def set_attr(sid, key, value):
        if next(writes) not in lost:
            real_set(sid, key, value)

    storage.set_study_system_attr = set_attr
    scores = PoolScores(storage, study_id, ("convs", "params"), score)
    damage = {archs[i].arch_id: "damaged" for i in damaged}
    real_set(study_id, "autosearch:pool-proxies", damage)
    found = scores(archs)
    assert found == {
        "convs": [_convs(a) for a in archs],
        "params": [_params(a) for a in archs],
    }
    assert len(calls) == len(archs) + len(lost)
    assert PoolScores(storage, study_id, ("convs", "params"), score)(archs) == found
    assert len(calls) == len(archs) + len(lost)  # a second reader scores nothing
