"""Predictor-guided neighbourhood walks: the hypervolume gain they rank by, the walker's
steps and bounded state, and the controllers that take them (evolution, TPE, NSGA-II)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from optuna._hypervolume import compute_hypervolume

from autosearch import ConfigError, Outcome
from autosearch.architecture import Architecture
from autosearch.scoring.pareto import hypervolume_gains
from controllers import NSGA2, TPE, LocalSearch, RegularizedEvolution
from controllers._walk import Walker
from search_spaces import NB201Space

OBJECTIVES = {"accuracy": "maximize", "flops": "minimize"}


def _exact_gains(front, candidates, reference):
    inside = front[(front < reference).all(axis=1)]
    base = compute_hypervolume(inside, reference) if len(inside) else 0.0
    return [
        compute_hypervolume(np.vstack([inside, c[None]]), reference) - base
        if (c < reference).all()
        else 0.0
        for c in candidates
    ]


@pytest.mark.parametrize("dims", [2, 3])
def test_hypervolume_gains_match_the_exact_hypervolume(dims):
    rng = np.random.default_rng(dims)
    reference = np.ones(dims)
    for _ in range(50):
        front = rng.random((int(rng.integers(0, 8)), dims))  # dominated points too
        candidates = rng.random((6, dims)) * 1.2  # some beyond the reference
        gains = hypervolume_gains(front, candidates, reference)
        assert np.allclose(gains, _exact_gains(front, candidates, reference))
    # a point the front dominates adds nothing; one that dominates it all adds the rest
    front = np.array([[0.2, 0.6], [0.5, 0.3]])
    gains = hypervolume_gains(front, np.array([[0.6, 0.7], [0.0, 0.0]]), np.ones(2))
    assert gains[0] == 0.0
    assert gains[1] == pytest.approx(1.0 - (0.8 * 0.4 + 0.5 * 0.3))


def _nb201(ops=("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3")):
    return NB201Space(operations=ops)


def _accuracy(space, arch):
    """More convolutions, higher accuracy (and higher FLOPs): a front along the count."""
    return 0.5 + 0.1 * sum(str(v).startswith("nor_conv") for v in arch.values())


def test_the_walker_steps_to_an_unseen_neighbour_and_keeps_a_bounded_state():
    space = _nb201()
    rng = np.random.default_rng(0)
    walker = Walker(space, size=5)
    seen = set()
    for _ in range(40):
        arch = space.sample(rng)
        seen.add(arch.arch_id)
        walker.add(arch, _accuracy(space, arch))
    step = walker.step(seen)
    assert step is not None and step.arch_id not in seen
    parents = [m[0] for m in walker.elite.members]
    assert any(
        step.arch_id in {n.arch_id for n in space.neighbours(Architecture.from_json(p))}
        for p in parents
    )
    state = walker.state()
    assert len(state["elite"]) == 5 and len(state["recent"]) == 5  # not 40
    again = Walker(space, size=5)
    again.load(json.loads(json.dumps(state)))
    assert again.step(seen) == step  # a restored walker steps alike


def test_a_multi_objective_walk_steps_from_the_front_to_the_largest_predicted_gain():
    space = _nb201()
    rng = np.random.default_rng(1)
    walker = Walker(space, size=10, directions=["maximize", "minimize"], front_size=3)
    seen = set()
    for _ in range(60):
        arch = space.sample(rng)
        seen.add(arch.arch_id)
        flops = float(space.cost(arch).flops)
        walker.add(arch, _accuracy(space, arch), [_accuracy(space, arch), flops])
    assert 1 <= len(walker.front) <= 3  # truncated to front_size, the most crowded dropped
    step = walker.step(seen)
    assert step is not None and step.arch_id not in seen
    front_neighbours = {
        n.arch_id for a, _ in walker.front for n in space.neighbours(Architecture.from_json(a))
    }
    assert step.arch_id in front_neighbours


@pytest.mark.parametrize(
    "make",
    [
        lambda s: RegularizedEvolution(s, seed=0, population=5, objectives=OBJECTIVES, walk=1),
        lambda s: TPE(s, seed=0, objectives=OBJECTIVES, walk=1, walk_after=5),
        lambda s: NSGA2(s, seed=0, walk=1, walk_after=5),
    ],
    ids=["evolution", "tpe", "nsga2"],
)
def test_multi_objective_controllers_walk_from_their_front(make):
    space = _nb201()
    controller = make(space)
    told = []
    for _ in range(5):  # the warm-up
        arch = controller.ask()
        accuracy = _accuracy(space, arch)
        flops = float(space.cost(arch).flops)
        objectives = {"accuracy": accuracy, "flops": flops}
        controller.tell(arch, Outcome(reward=accuracy, objectives=objectives))
        told.append(arch)
    near = {n.arch_id for a in told for n in space.neighbours(a)}
    for _ in range(5):
        arch = controller.ask()
        assert arch.arch_id in near and arch.arch_id not in {a.arch_id for a in told}
        accuracy = _accuracy(space, arch)
        flops = float(space.cost(arch).flops)
        objectives = {"accuracy": accuracy, "flops": flops}
        controller.tell(arch, Outcome(reward=accuracy, objectives=objectives))
        told.append(arch)
        near |= {n.arch_id for n in space.neighbours(arch)}


def test_tpe_walks_after_its_warm_up_and_a_restored_one_walks_alike():
    space = _nb201()
    tpe = TPE(space, seed=3, walk=1.0, walk_after=4)
    told = []
    for _ in range(4):
        arch = tpe.ask()
        tpe.tell(arch, Outcome(reward=_accuracy(space, arch)))
        told.append(arch)
    best = max(told, key=lambda a: _accuracy(space, a))
    step = tpe.ask()  # walk=1: a neighbour of the best result
    assert step.arch_id in {n.arch_id for n in space.neighbours(best)}
    tpe.tell(step, Outcome(reward=_accuracy(space, step)))
    twin = TPE(space, seed=3, walk=1.0, walk_after=4)
    twin.load_state_dict(json.loads(json.dumps(tpe.state_dict())))
    assert [twin.ask() for _ in range(3)] == [tpe.ask() for _ in range(3)]
    assert TPE(space).config()["walk"] == 0.8 and TPE(space, walk=0).config()["walk"] == 0
    with pytest.raises(ConfigError, match="walk"):
        TPE(space, walk=2)


def test_tpe_without_a_walk_asks_only_the_sampler():
    """walk=0 is Optuna's TPE alone: after the warm-up its asks are not all neighbours."""
    space = NB201Space()
    tpe = TPE(space, seed=0, walk=0)
    told = []
    for _ in range(20):
        arch = tpe.ask()
        tpe.tell(arch, Outcome(reward=_accuracy(space, arch)))
        told.append(arch)
    near = {n.arch_id for a in told[:10] for n in space.neighbours(a)}
    assert not all(a.arch_id in near for a in told[10:])


def test_evolutions_multi_objective_walk_is_the_walkers_step():
    """walk=1: after the warm-up every ask is the step a walker fed the same results
    takes, not a tournament's mutation."""
    space = _nb201()
    evolution = RegularizedEvolution(space, seed=0, population=5, objectives=OBJECTIVES, walk=1)
    walker = Walker(space, size=5, directions=list(OBJECTIVES.values()))
    seen: set[str] = set()
    for n in range(12):
        arch = evolution.ask()
        if n >= 5:
            assert arch == walker.step(seen)
        seen.add(arch.arch_id)
        accuracy = _accuracy(space, arch)
        flops = float(space.cost(arch).flops)
        outcome = Outcome(reward=accuracy, objectives={"accuracy": accuracy, "flops": flops})
        evolution.tell(arch, outcome)
        walker.add(arch, accuracy, [accuracy, flops])


def test_local_search_reads_a_state_saved_before_the_walker():
    """A study saved with every result in LocalSearch's state opens and walks on."""
    space = _nb201()
    rng = np.random.default_rng(2)
    told = [space.sample(rng) for _ in range(12)]
    old = {
        "rng": np.random.default_rng(0).bit_generator.state,
        "results": [[a.to_json(), _accuracy(space, a)] for a in told],
        "pending": [],
    }
    local = LocalSearch(space, seed=0, size=10)
    local.load_state_dict(json.loads(json.dumps(old)))
    local.mark_seen(a.arch_id for a in told)
    best = max(told, key=lambda a: _accuracy(space, a))
    step = local.ask()
    assert step.arch_id in {n.arch_id for n in space.neighbours(best)}
    assert local.state_dict()["results"] == 12
    assert len(local.state_dict()["walker"]["recent"]) == 10  # bounded from now on


def test_at_a_local_optimum_the_walker_steps_from_any_of_the_best_results():
    space = _nb201()
    rng = np.random.default_rng(4)
    walker = Walker(space, size=5)
    told = [space.sample(rng) for _ in range(8)]
    for arch in told:
        walker.add(arch, _accuracy(space, arch))
    best = Architecture.from_json(walker.elite.members[0][0])
    seen = {a.arch_id for a in told} | {n.arch_id for n in space.neighbours(best)}
    step = walker.step(seen)  # the best's neighbourhood is all seen
    assert step is not None and step.arch_id not in seen
    pooled = {
        n.arch_id
        for a, _ in walker.elite.members[1:]
        for n in space.neighbours(Architecture.from_json(a))
    }
    assert step.arch_id in pooled


class _Lookup:
    """A stand-in for the walker's predictor: fixed predictions (signed: every
    objective minimised) by architecture id, and no standardisation."""

    def __init__(self, values):
        self.values = values

    def fit(self, archs, targets):
        return self

    def standardise(self, targets):
        return np.asarray(targets, dtype=float)

    def predict(self, archs):
        return np.array([self.values[a.arch_id] for a in archs], dtype=float)


def _front_walker(space, members):
    """A multi-objective walker told ``members`` (architecture, accuracy, cost), and
    the members' neighbours all seen but two of each."""
    walker = Walker(space, size=10, directions=["maximize", "minimize"])
    for arch, accuracy, cost in members:
        walker.add(arch, accuracy, [accuracy, cost])
    unseen = []
    for arch, _, _ in members:
        near = [n for n in space.neighbours(arch) if n.arch_id not in {a.arch_id for a in unseen}]
        unseen += near[:2]
    near_all = {n.arch_id for arch, _, _ in members for n in space.neighbours(arch)}
    seen = near_all - {a.arch_id for a in unseen} | {arch.arch_id for arch, _, _ in members}
    return walker, unseen, seen


def test_a_front_walk_anchors_each_prediction_on_the_member_it_neighbours():
    space = _nb201()
    rng = np.random.default_rng(5)
    a, b = space.sample(rng), space.sample(rng)
    walker, unseen, seen = _front_walker(space, [(a, 0.9, 10.0), (b, 0.8, 5.0)])
    near_a, near_b = unseen[0], unseen[2]
    # The model underrates a by 0.4 and gets b right; a's neighbour is predicted as
    # poor as a is predicted, b's neighbour a little more accurate than b.
    values = {a.arch_id: [-0.5, 10.0], b.arch_id: [-0.8, 5.0]}
    values |= {n.arch_id: [0.0, 20.0] for n in unseen}  # far behind the front
    values[near_a.arch_id] = [-0.52, 8.0]
    values[near_b.arch_id] = [-0.85, 6.0]
    walker._predictor = _Lookup(values)
    # Anchored on a (its residual, -0.4 in accuracy), a's neighbour is predicted at
    # 0.92, 8: more than b's neighbour adds; unanchored, b's neighbour would win.
    assert walker.step(seen) == near_a
    front = np.array([[-0.9, 10.0], [-0.8, 5.0]])
    reference = np.array([1.0, 21.0])  # as the walker puts it: beyond the worst
    raw = hypervolume_gains(front, np.array([[-0.52, 8.0], [-0.85, 6.0]]), reference)
    assert raw[1] > raw[0]


def test_when_every_neighbour_is_predicted_dominated_the_walk_takes_the_nearest():
    space = _nb201()
    a = space.sample(np.random.default_rng(6))
    walker, unseen, seen = _front_walker(space, [(a, 0.9, 5.0)])
    first, second = unseen
    walker._predictor = _Lookup(
        {a.arch_id: [-0.9, 5.0], first.arch_id: [-0.5, 7.0], second.arch_id: [-0.85, 6.0]}
    )
    # Both are dominated by a; the second needs the smaller shift (0.05) to join the
    # front, the first 0.4.
    assert walker.step(seen) == second
