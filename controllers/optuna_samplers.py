"""Any Optuna sampler as a controller: TPE, multi-objective TPE, NSGA-II, GP, random."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
import optuna
from optuna.search_space import IntersectionSearchSpace
from optuna.storages import InMemoryStorage
from optuna.trial import TrialState, create_trial

from autosearch.architecture import Architecture
from autosearch.controller import Controller, Outcome, unseen_architecture
from autosearch.distributions import distributions, suggest
from autosearch.errors import AutosearchError, ConfigError, UnknownNameError
from autosearch.registry import register_controller
from autosearch.scoring.pareto import Direction
from autosearch.space import SearchSpace
from controllers._walk import Walker

__all__ = ["GP", "NSGA2", "TPE", "OptunaController", "register_sampler"]

_NO_TRIAL = -1  # a pending architecture the sampler did not propose (a fallback)

_Factory = Callable[..., optuna.samplers.BaseSampler]

# The samplers a (stored) controller may name: name -> (factory(seed, **options), the
# class whose constructor the options reach, for checking them). Code fills it; a
# stored study only reads it.
_SAMPLERS: dict[str, tuple[_Factory, Callable[..., Any]]] = {}

# Optuna's own samplers that take seed=, also by their dotted paths (which earlier
# studies stored): fixed names in a fixed module, registered on first use.
_OPTUNA_SAMPLERS = {
    "random": "RandomSampler",
    "qmc": "QMCSampler",
    "cmaes": "CmaEsSampler",
    "nsga3": "NSGAIIISampler",
    "bruteforce": "BruteForceSampler",
}


def _builtin() -> None:
    # Constant liar: pending asks count as bad results, so parallel workers spread out.
    _SAMPLERS["tpe"] = (
        lambda seed, **o: optuna.samplers.TPESampler(
            seed=seed, **{"multivariate": True, "constant_liar": True, **o}
        ),
        optuna.samplers.TPESampler,
    )
    _SAMPLERS["nsga2"] = (_plain(optuna.samplers.NSGAIISampler), optuna.samplers.NSGAIISampler)
    _SAMPLERS["gp"] = (_plain(optuna.samplers.GPSampler), optuna.samplers.GPSampler)
    for name, attr in _OPTUNA_SAMPLERS.items():
        cls = getattr(optuna.samplers, attr)
        _SAMPLERS[name] = (_plain(cls), cls)
    for attr in ("TPESampler", "NSGAIISampler", "GPSampler", *_OPTUNA_SAMPLERS.values()):
        cls = getattr(optuna.samplers, attr)
        _SAMPLERS[f"optuna.samplers.{attr}"] = (_plain(cls), cls)


def _plain(make: Callable[..., Any]) -> _Factory:
    return lambda seed, **options: make(seed=seed, **options)


def register_sampler(name: str, factory: _Factory) -> None:
    """Make an Optuna sampler known by ``name`` to ``OptunaController(sampler=name)``;
    ``factory(seed=..., **options)`` makes one (a sampler class, or a function). A study
    stores the name, never the code: the code that opens the study registers it again
    (as it imports its own spaces and controllers)."""
    if not isinstance(name, str) or not name or not callable(factory):
        raise ConfigError(
            f"register_sampler takes a name and a sampler class or factory, got {name!r}, "
            f"{factory!r}"
        )
    existing = _SAMPLERS.get(name)
    if existing is not None and existing[1] is not factory:
        raise ConfigError(f"sampler name {name!r} is already registered")
    _SAMPLERS[name] = (_plain(factory), factory)


def _sampler_factory(name: str, options: Mapping[str, Any]) -> _Factory:
    """The registered sampler ``name`` stands for, its ``options`` checked against the
    constructor they reach. Nothing else: a name, stored or given, never makes
    autosearch import a module or reach an attribute."""
    if not isinstance(name, str) or name not in _SAMPLERS:
        shown = [n for n in _SAMPLERS if not n.startswith("optuna.samplers.")]
        error = UnknownNameError("Optuna sampler", str(name), shown)
        error.args = (
            f"{error.args[0]} Register another in the code that opens the study: "
            "controllers.register_sampler('name', MySampler)",
        )
        raise error
    factory, constructor = _SAMPLERS[name]
    _check_options(name, constructor, options)
    return factory


def _check_options(name: str, constructor: Callable[..., Any], options: Mapping[str, Any]) -> None:
    """Refuse, in one line, options the sampler's constructor does not take."""
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ConfigError(f"sampler options must be a mapping of names, got {options!r}")
    try:
        params = inspect.signature(constructor).parameters
    except (TypeError, ValueError):
        return  # a factory that hides its parameters: its own errors say what is wrong
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted((set(options) - set(params)) | ({"seed"} & set(options)))
    if unknown:
        takes = ", ".join(n for n in params if n not in ("self", "seed"))
        raise ConfigError(
            f"sampler {name!r} takes no option {', '.join(map(repr, unknown))}; it takes {takes}"
        )


_builtin()


def _carry_caches(
    old: optuna.samplers.BaseSampler, new: optuna.samplers.BaseSampler
) -> optuna.samplers.BaseSampler:
    """Hand the previous sampler's search-space cache to the next one.

    Optuna's TPE and GP samplers keep an incremental ``IntersectionSearchSpace`` over
    the study's trials. The controller makes a sampler afresh for each ask (its seed
    derives from the ask's index, so that a restored controller decides alike); without
    this, each would rebuild that cache from every trial, O(n) distribution comparisons
    per ask (at 300 trials half of TPE's ask + tell). Same study, same answer: the
    intersection does not depend on when it was computed."""
    if type(old) is type(new):
        for name in ("_search_space", "_intersection_search_space"):
            cache = getattr(old, name, None)
            if isinstance(cache, IntersectionSearchSpace) and hasattr(new, name):
                setattr(new, name, cache)
    return new


@register_controller("optuna")
class OptunaController(Controller):
    """Runs an Optuna sampler over the space's gene domains, in an in-memory study.

    Before each ask the sampler is made afresh with a seed derived from ``seed`` and
    the ask's index, so the controller's whole state is its trials and counters
    (:meth:`state_dict` is plain JSON) and a restored controller repeats the
    original's decisions exactly. An architecture the sampler proposes twice gets
    its known result (or, while still pending, is discarded) and the sampler is
    asked again, a bounded number of times.

    Args:
        space: The search space.
        sampler: ``"tpe"`` (multivariate, constant liar), ``"nsga2"``, ``"gp"``,
            ``"random"``, ``"qmc"``, ``"cmaes"``, ``"nsga3"``, ``"bruteforce"`` (also
            by Optuna's paths, ``"optuna.samplers.QMCSampler"``), or a name given to
            :func:`register_sampler`. A registered name, not an instance, so that a
            stored study can rebuild its controller; a stored name never makes
            autosearch import a module.
        seed: Seed of the derived sampler seeds.
        objectives: ``{name: "maximize" | "minimize"}`` to optimise the study's
            objectives directly (multi-objective samplers); None maximises the reward.
        options: Keyword arguments for the sampler (e.g. ``{"n_startup_trials": 5}``).
        max_tries: Proposals per ask before giving up on an unseen architecture.
        walk: The share of asks, once ``walk_after`` results are in, that take a
            predictor-guided step to an unseen one-gene neighbour of the best result
            (multi-objective: of the Pareto front) instead of the sampler's proposal,
            as :class:`~controllers.RegularizedEvolution` does; the sampler learns from
            those results too. 0: the sampler alone. None: 0 here, 0.8 for
            :class:`TPE` and :class:`NSGA2` (measured on NB201: benchmarks/RESULTS.md).
        walk_after: Results before the first walk.
    """

    sampler_name: ClassVar[str | None] = None  # fixed by the named subclasses
    default_walk: ClassVar[float] = 0.0  # the named subclasses' measured choice

    def __init__(
        self,
        space: SearchSpace,
        *,
        sampler: str = "tpe",
        seed: int | None = None,
        objectives: Mapping[str, Direction] | None = None,
        options: Mapping[str, Any] | None = None,
        max_tries: int = 100,
        walk: float | None = None,
        walk_after: int = 10,
    ) -> None:
        super().__init__(space)
        walk = self.default_walk if walk is None else walk
        if not 0 <= walk <= 1 or walk_after < 1:
            raise ConfigError(
                f"need 0 <= walk <= 1 and walk_after >= 1, got walk={walk}, walk_after={walk_after}"
            )
        self.walk, self.walk_after = walk, walk_after
        self.sampler = self.sampler_name or sampler
        self._factory = _sampler_factory(self.sampler, options or {})
        self.seed = seed
        self.objectives = dict(objectives) if objectives else None
        self.options = dict(options or {})
        self.max_tries = max_tries
        self._distributions = distributions(space)
        self._stream: int | None = None  # a parallel worker's own stream (reseed)
        self._reset()

    def _reset(self) -> None:
        self._storage = InMemoryStorage()
        directions: list[Direction] = (
            list(self.objectives.values()) if self.objectives else ["maximize"]
        )
        self._study = optuna.create_study(
            storage=self._storage, directions=directions, sampler=self._new_sampler(0)
        )
        self._study_id = self._storage.get_study_id_from_name(self._study.study_name)
        self._asks = 0
        self._pending: dict[str, int] = {}  # arch_id -> trial number
        self._known: dict[str, list[float] | None] = {}  # arch_id -> values (None: failed)
        self._walker = Walker(
            self.space, 20, list(self.objectives.values()) if self.objectives else None
        )
        self._results = 0  # ok results told

    def _new_sampler(self, index: int) -> optuna.samplers.BaseSampler:
        seed = None
        if self.seed is not None or self._stream is not None:
            stream = "" if self._stream is None else f"{self._stream}:"
            digest = hashlib.sha256(f"{stream}{self.seed}:{index}".encode()).digest()
            seed = int.from_bytes(digest[:4], "little")
        return self._factory(seed, **self.options)

    def reseed(self, stream: int) -> None:
        self._stream = stream

    def ask(self) -> Architecture:
        step = self._walk()
        if step is not None:
            self._pending[step.arch_id] = _NO_TRIAL  # told as a trial the sampler did not ask
            return step
        for _ in range(self.max_tries):
            self._study.sampler = _carry_caches(self._study.sampler, self._new_sampler(self._asks))
            self._asks += 1
            trial = self._study.ask()
            genes = {gene: suggest(trial, gene, d) for gene, d in self.space.domains().items()}
            arch = self.space.make(genes)
            if arch.arch_id in self._pending:
                self._study.tell(trial, state=TrialState.FAIL)  # a twin is being evaluated
            elif arch.arch_id in self._known:
                self._tell_trial(trial.number, self._known[arch.arch_id])
            elif not self.space.within_budget(arch):
                self._study.tell(trial, state=TrialState.FAIL)  # over budget: propose again
            else:
                self._pending[arch.arch_id] = trial.number
                return arch
        arch = unseen_architecture(
            self.space,
            self._known.keys() | self._pending.keys(),
            np.random.default_rng([self._asks, self.seed or 0]),
            why=f"the {self.sampler} sampler proposed only known or over-budget architectures "
            f"{self.max_tries} times in a row",
        )
        self._pending[arch.arch_id] = _NO_TRIAL  # told as a trial the sampler did not ask
        return arch

    def _walk(self) -> Architecture | None:
        """A walk's step, when this ask walks (decided by a draw seeded like the
        sampler's, so that a restored controller decides alike)."""
        if self.walk <= 0 or self._results < self.walk_after:
            return None
        draw = np.random.default_rng([self._asks, self.seed or 0, self._stream or 0]).random()
        self._asks += 1
        if draw >= self.walk:
            return None
        return self._walker.step(self._known.keys() | self._pending.keys())

    def _values(self, outcome: Outcome) -> list[float] | None:
        if not outcome.ok:
            return None
        if self.objectives is None:
            assert outcome.reward is not None
            return [float(outcome.reward)]
        missing = set(self.objectives) - set(outcome.objectives)
        if missing:
            raise AutosearchError(
                f"the {self.sampler} controller optimises {sorted(self.objectives)} but the "
                f"outcome lacks {sorted(missing)}: make its objectives a subset of the study's"
            )
        return [float(outcome.objectives[name]) for name in self.objectives]

    def _tell_trial(self, number: int, values: list[float] | None) -> None:
        if values is None:
            self._study.tell(number, state=TrialState.FAIL)
        else:
            self._study.tell(number, values)

    def tell(self, arch: Architecture, outcome: Outcome) -> None:
        arch = self.space.canonicalize(arch)
        values = self._values(outcome)
        number = self._pending.pop(arch.arch_id, _NO_TRIAL)
        if number != _NO_TRIAL:
            self._tell_trial(number, values)
        else:  # never asked here: record it as a finished trial the sampler learns from
            self._add(dict(arch), values)
        self._known[arch.arch_id] = values
        if values is not None:
            self._results += 1
            reward = outcome.reward if outcome.reward is not None else values[0]
            self._walker.add(arch, reward, values if self.objectives else ())

    def _add(
        self,
        params: dict[str, Any],
        values: list[float] | None,
        state: TrialState | None = None,
        system_attrs: dict[str, Any] | None = None,
    ) -> None:
        state = state or (TrialState.COMPLETE if values is not None else TrialState.FAIL)
        template = create_trial(
            state=state,
            params=params,
            distributions=self._distributions,
            values=values,
            system_attrs=system_attrs,
        )
        self._storage.create_new_trial(self._study_id, template_trial=template)

    def state_dict(self) -> dict[str, Any]:
        # The samplers' own bookkeeping travels too (NSGA-II's generations and parents
        # are trial and study system attributes).
        trials = [
            {"params": t.params, "values": t.values, "state": t.state.name}
            | ({"system_attrs": t.system_attrs} if t.system_attrs else {})
            for t in self._storage.get_all_trials(self._study_id, deepcopy=False)
        ]
        return {
            "study_attrs": self._storage.get_study_system_attrs(self._study_id),
            "seed": self.seed,  # the sampler seeds derive from it
            "stream": self._stream,
            "asks": self._asks,
            "trials": trials,
            "pending": dict(self._pending),
            "known": dict(self._known),
            "walker": self._walker.state(),
            "results": self._results,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.seed = state["seed"]
        self._reset()
        for t in state["trials"]:
            self._add(t["params"], t["values"], TrialState[t["state"]], t.get("system_attrs"))
        for key, value in state.get("study_attrs", {}).items():
            self._storage.set_study_system_attr(self._study_id, key, value)
        self._asks = int(state["asks"])
        self._stream = state.get("stream")
        self._pending = {k: int(v) for k, v in state["pending"].items()}
        self._known = {k: (list(v) if v is not None else None) for k, v in state["known"].items()}
        self._walker.load(state.get("walker", {}))
        self._results = int(state.get("results", sum(v is not None for v in self._known.values())))

    def config(self) -> dict[str, Any]:
        config = {
            "seed": self.seed,
            "objectives": self.objectives,
            "options": self.options,
            "max_tries": self.max_tries,
            "walk": self.walk,
            "walk_after": self.walk_after,
        }
        return config if self.sampler_name else {"sampler": self.sampler, **config}


@register_controller("tpe")
class TPE(OptunaController):
    """Optuna's multivariate TPE with constant liar; multi-objective (MOTPE) when given
    ``objectives``. By default 80 % of the asks after the first 10 results are
    predictor-guided walks (``walk=0.8``): on a synthetic NB201 table that found the
    best cell by 150 evaluations in 92 % of seeds against TPE's 60 %, and 99.3 % of the
    front's hypervolume by 300 against 98.3 % (benchmarks/RESULTS.md); ``walk=0`` is TPE
    alone."""

    sampler_name = "tpe"
    default_walk = 0.8


@register_controller("nsga2")
class NSGA2(OptunaController):
    """Optuna's NSGA-II, by default on accuracy (max) and FLOPs (min), with generations
    of 10 (Optuna's default of 50 makes the first generation, which is random, as large
    as a small study: measured on NB201, 50 fell behind random search up to 100
    evaluations, 10 did not; benchmarks/RESULTS.md). ``options={"population_size": N}``
    sets another size. By default 80 % of the asks after the first 10 results step
    from the front to the neighbour with the largest predicted hypervolume gain
    (``walk=0.8``; 99.2 % of the true front's hypervolume by 300 evaluations on a
    synthetic NB201 table against 97.7 %); ``walk=0`` is NSGA-II alone."""

    sampler_name = "nsga2"
    default_walk = 0.8
    multi_objective: ClassVar[bool] = True

    def __init__(
        self,
        space: SearchSpace,
        *,
        objectives: Mapping[str, Direction] | None = None,
        options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            space,
            objectives=objectives or {"accuracy": "maximize", "flops": "minimize"},
            options={"population_size": 10, **(options or {})},
            **kwargs,
        )


@register_controller("gp")
class GP(OptunaController):
    """Optuna's Gaussian-process sampler (Bayesian optimisation)."""

    sampler_name = "gp"
