"""A study's definition: what is searched, on what data, measured and scored how.

:class:`StudyDefinition` is typed and frozen. It is written to storage as JSON once,
when the study is created (a study user attribute), and read back once, when it is
opened; nothing else parses it. Continuing a stored study checks that the new
definition measures the same thing (:meth:`StudyDefinition.check_continues`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from autosearch._version import __version__
from autosearch.architecture import Architecture
from autosearch.compress import Compression, VariantSpec, parse_variants
from autosearch.controller import Controller
from autosearch.data import Dataset
from autosearch.errors import (
    AutosearchError,
    ConfigError,
    PlatformError,
    StudyError,
)
from autosearch.evaluation.proxies import ProxyConfig
from autosearch.evaluation.tabular import Table
from autosearch.registry import controllers, spaces
from autosearch.scoring import Reward, objective, parse_reward, resolve_reward
from autosearch.scoring.cost import Cost
from autosearch.scoring.metrics import declared
from autosearch.scoring.pareto import Direction
from autosearch.space import SearchSpace
from autosearch.training.early_stopping import SuccessiveHalving, from_dict
from autosearch.training.train import TrainConfig
from autosearch.weight_sharing.supernet import ElasticSpaceLike, SupernetConfig

__all__ = [
    "Component",
    "StudyDefinition",
    "resolve_components",
    "trial_seed",
]

logger = logging.getLogger(__name__)

FORMAT = 1
# What must match for a stored study to be continued: its results would not be
# comparable otherwise. (The controller and compression settings may change.)
_COMPARED = (
    "space",
    "objectives",
    "data",
    "reward",
    "train",
    "seed",
    "table",
    "variants",
    "supernet",
    "proxies",
    "evaluator",
    "metrics",
)
_FLOAT_BUDGET = {"flops": "max_flops", "params": "max_params"}
_TARGET_SAMPLES = 64


@dataclass(frozen=True, kw_only=True)
class Component:
    """A registered space or controller: its name and constructor configuration."""

    name: str
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, thing: SearchSpace | Controller) -> Component:
        config = thing.config()
        try:
            json.dumps(dict(config))
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"a study cannot store {type(thing).__name__}: its settings are not JSON "
                f"({exc}), and a study keeps them so that every worker and a resume "
                "rebuild it; drive it with ask/tell from Python instead"
            ) from None
        return cls(name=thing.name, config=config)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "config": json.loads(json.dumps(dict(self.config)))}


@dataclass(frozen=True, kw_only=True)
class StudyDefinition:
    """Everything a study's results depend on, and how its trials are run.

    ``reward`` is resolved (its cost target filled in), so every trial of the study,
    on any worker, scores with the same numbers.
    """

    space: Component
    controller: Component
    data: str
    objectives: tuple[str, ...]
    reward: Reward
    variants: tuple[VariantSpec, ...]
    compression: Compression = field(default_factory=Compression)
    train: TrainConfig = field(default_factory=TrainConfig)
    seed: int = 0
    artifacts: str | None = None
    table: Table | None = None
    supernet: SupernetConfig | None = None
    early_stopping: SuccessiveHalving | None = None
    proxies: ProxyConfig | None = None  # zero-cost proxies of every candidate, seed filled in
    # A user's evaluator trains and scores each candidate (autosearch.evaluation.user): its
    # import path, to check that every process runs the same one (never imported from here).
    evaluator: str | None = None
    # Figures of the evaluator made objectives: name -> "maximize" / "minimize", declared
    # in every process that opens the study (autosearch.scoring.metrics.declare).
    metrics: Mapping[str, str] = field(default_factory=dict)
    data_report: Mapping[str, Any] | None = None
    created_by: str = f"autosearch {__version__}"

    @property
    def directions(self) -> list[Direction]:
        return [objective(o).direction for o in self.objectives]

    def build(self, *, where: str) -> Controller:
        """The study's controller over its space, rebuilt from the stored components:
        each name resolves only through its registry, and the stored configuration
        reaches only that component's own constructor. Anything a stored definition
        holds either builds or fails in one line (a StudyError naming ``where``)."""

        def make_space() -> SearchSpace:
            space = spaces.get(self.space.name)(**self.space.config)
            space.domains()  # a space that cannot be rebuilt (a stored name refused) fails here
            return space

        space = _rebuilt("search space", self.space, make_space, where)
        return _rebuilt(
            "controller",
            self.controller,
            lambda: controllers.get(self.controller.name)(space, **self.controller.config),
            where,
        )

    # JSON, once each way --------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "space": self.space.to_json(),
            "controller": self.controller.to_json(),
            "data": self.data,
            "objectives": list(self.objectives),
            "reward": str(self.reward),
            "variants": [v.name for v in self.variants],
            "compression": dataclasses.asdict(self.compression),
            "train": dataclasses.asdict(self.train),
            "seed": self.seed,
            "artifacts": self.artifacts,
            "table": json.loads(json.dumps(dataclasses.asdict(self.table))) if self.table else None,
            "supernet": self.supernet.to_dict() if self.supernet else None,
            "early_stopping": self.early_stopping.to_dict() if self.early_stopping else None,
            "proxies": self.proxies.to_dict() if self.proxies else None,
            "evaluator": self.evaluator,
            "metrics": dict(self.metrics),
            "data_report": dict(self.data_report) if self.data_report else None,
            "created_by": self.created_by,
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any], *, where: str) -> StudyDefinition:
        """Read a stored definition; ``where`` names the study in errors. Whatever it
        holds, it is read or refused in one line: a StudyError."""
        if not isinstance(stored, Mapping) or _format(stored) > FORMAT:
            raise StudyError(
                f"{where} was stored by {_get(stored, 'created_by')}, which this autosearch "
                f"({__version__}) cannot read; upgrade autosearch"
            )
        try:
            artifacts = stored.get("artifacts")
            if artifacts is not None and not (isinstance(artifacts, str) and artifacts):
                raise ValueError(f"artifacts location {artifacts!r} is not a path or URL")
            metrics = declared(stored.get("metrics") or {})  # before the objectives name them
            return cls(
                space=Component(**stored["space"]),
                controller=Component(**stored["controller"]),
                data=str(stored["data"]),
                objectives=_objectives(stored["objectives"]),
                reward=parse_reward(stored["reward"]),
                variants=parse_variants(stored.get("variants") or ["base"]),
                compression=Compression(**(stored.get("compression") or {})),
                train=TrainConfig(**stored["train"]),
                seed=_seed(stored["seed"]),
                artifacts=artifacts,
                table=Table(**stored["table"]) if stored.get("table") else None,
                supernet=SupernetConfig(**stored["supernet"]) if stored.get("supernet") else None,
                early_stopping=from_dict(stored.get("early_stopping")),
                proxies=ProxyConfig(**stored["proxies"]) if stored.get("proxies") else None,
                evaluator=_evaluator(stored.get("evaluator")),
                metrics=metrics,
                data_report=stored.get("data_report"),
                created_by=str(stored.get("created_by", "")),
            )
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError, ConfigError) as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise StudyError(
                f"{where}: its stored definition cannot be read ({type(exc).__name__}: "
                f"{first}); it was written by {_get(stored, 'created_by')}"
            ) from None

    # Continuing -------------------------------------------------------------------------
    def check_continues(self, stored: StudyDefinition, name: str) -> None:
        """Refuse to continue ``stored`` with a definition that measures differently."""
        mine, theirs = self.to_json(), stored.to_json()
        differs = [k for k in _COMPARED if _canonical(mine[k]) != _canonical(theirs[k])]
        if differs:
            lines = "; ".join(f"{k}: stored {theirs[k]!r}, given {mine[k]!r}" for k in differs)
            raise StudyError(
                f"study {name!r} is stored with a different definition ({lines}). Its results "
                "would not be comparable: use a new study name, or autosearch.load_study to "
                "continue it as stored"
            )

    @classmethod
    def define(
        cls,
        *,
        space: SearchSpace,
        controller: Controller,
        data: str,
        objectives: Sequence[str],
        reward: str,
        variants: Sequence[str],
        compression: Compression | None,
        train: TrainConfig | None,
        seed: int,
        artifacts: str | None,
        table: Table | None,
        early_stopping: SuccessiveHalving | None,
        supernet: SupernetConfig | None = None,
        proxies: ProxyConfig | None = None,
        evaluator: str | None = None,
        metrics: Mapping[str, str] | None = None,
    ) -> StudyDefinition:
        """Check a new study's settings, before any data is read or anything stored. Its
        reward's target is filled in by :meth:`with_data`. ``evaluator``: the name of a
        user's evaluator that trains each candidate instead of the study's trainer."""
        if evaluator is not None and (table is not None or supernet is not None):
            raise ConfigError(
                "a user's evaluator trains each candidate; a study that looks candidates up "
                "in a table or scores them on a supernet trains none: give one of them"
            )
        if metrics and evaluator is None:
            raise ConfigError(
                "metrics= declares figures of a user's evaluator as objectives; this study "
                "has no evaluator=, and autosearch measures only its own metrics"
            )
        metrics = declared(metrics)
        objectives = _check_objectives(objectives, controller)
        specs = parse_variants(variants)
        if compression is not None and compression.latency_table:
            from autosearch.scoring.latency import read

            read(compression.latency_table)  # another device's table: refused here if unusable
        if table is not None and len(specs) > 1:
            raise ConfigError(
                "a table study looks results up instead of training, so it has no models to "
                "compress; use variants=('base',)"
            )
        if supernet is not None:
            _check_supernet(space, supernet, table, early_stopping)
        if proxies is not None:
            proxies = _check_proxies(proxies, table, seed)
        if controller.needs_scorer:
            _check_scorer(controller, proxies)
        return cls(
            space=Component.of(space),
            controller=Component.of(controller),
            data=data,
            objectives=objectives,
            reward=parse_reward(reward),
            variants=specs,
            compression=compression or Compression(),
            train=train or TrainConfig(),
            seed=seed,
            artifacts=artifacts,
            table=table,
            supernet=supernet,
            early_stopping=early_stopping,
            proxies=proxies,
            evaluator=evaluator,
            metrics=metrics,
        )

    def with_data(self, space: SearchSpace, data: Dataset | None) -> StudyDefinition:
        """The definition with its data's cleaning report, and the reward's cost target
        filled in (when not given) for the data's input shape (for a table study, the
        space's budget input)."""
        shape = data.input_shape if data else space.budget_input
        classes = data.num_classes if data else space.budget_classes
        if data is not None:
            _say_how_large(space, shape, classes)
        reward = resolve_reward(
            self.reward, lambda metric: _default_target(space, metric, shape, classes)
        )
        # As stored (6 significant digits): every process scores with the same target.
        reward = parse_reward(str(reward))
        report = data.report.to_dict() if data else None
        return dataclasses.replace(self, reward=reward, data_report=report)


def _objectives(stored: Any) -> tuple[str, ...]:
    """A stored list of objectives, each a known metric, distinct."""
    if not isinstance(stored, list) or not stored:
        raise ValueError(f"objectives {stored!r} is not a list of metric names")
    for name in stored:
        if not isinstance(name, str):
            raise ValueError(f"objective {name!r} is not a metric name")
        objective(name)  # an unknown name: UnknownNameError, with the close matches
    if len(set(stored)) != len(stored):
        raise ValueError(f"objectives {stored!r} repeat a name")
    return tuple(stored)


def _evaluator(value: Any) -> str | None:
    """A stored evaluator's name (``module:qualname``), or None."""
    if value is not None and not (isinstance(value, str) and ":" in value):
        raise ValueError(f"evaluator {value!r} is not a module:name")
    return value


def _seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"seed {value!r} is not an integer >= 0")
    return value


def trial_seed(study_seed: int, arch: Architecture) -> int:
    """A trial's seed depends only on the study seed and the architecture, so a
    retrained architecture repeats its result whatever order trials ran in."""
    digest = hashlib.sha256(f"{study_seed}:{arch.arch_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def resolve_components(
    space: SearchSpace | str | None, controller: Controller | str, seed: int
) -> tuple[SearchSpace, Controller]:
    """The study's space and controller from what ``create_study`` was given: instances,
    or registered names (a controller by name needs the space)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed={seed!r} cannot be used: expected an integer >= 0")
    if isinstance(space, str):  # a registered space name, with its default configuration
        space = spaces.get(space)()
    if isinstance(controller, str):
        if space is None:
            raise ConfigError(
                f"controller {controller!r} is given by name, so the study needs space=...; "
                "or pass a controller instance, e.g. RandomSearch(ResNetSpace(), seed=0)"
            )
        return space, controllers.get(controller)(space, seed=seed)
    if not isinstance(controller, Controller):
        raise ConfigError(
            f"controller must be a Controller or a registered name, got {type(controller).__name__}"
        )
    if space is not None and Component.of(space) != Component.of(controller.space):
        raise ConfigError("space= differs from the controller's own space; pass one of them")
    return controller.space, controller


T = TypeVar("T")


def _rebuilt(what: str, component: Component, make: Callable[[], T], where: str) -> T:
    """``make()``, its failures on stored values told in one line."""
    if not isinstance(component.name, str) or not isinstance(component.config, Mapping):
        raise StudyError(f"{where}: its stored {what} is not a name and a configuration")
    try:
        return make()
    except PlatformError:
        raise
    except (AutosearchError, TypeError, ValueError, KeyError, OverflowError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise StudyError(
            f"{where}: its stored {what} {component.name!r} cannot be rebuilt "
            f"({type(exc).__name__}: {first})"
        ) from None


def _check_supernet(
    space: SearchSpace,
    supernet: SupernetConfig,
    table: Table | None,
    early_stopping: SuccessiveHalving | None,
) -> None:
    if not isinstance(supernet, SupernetConfig):
        raise ConfigError(f"supernet= takes a SupernetConfig, got {type(supernet).__name__}")
    if not isinstance(space, ElasticSpaceLike):
        raise ConfigError(
            f"supernet= evaluates candidates on a supernet, so the study's space must be the "
            f"elastic part of one: {space.name!r} is not; use e.g. ResNetSpace(...).supernet() "
            "or MobileNetSpace(...).supernet(elastic=(...))"
        )
    if table is not None or early_stopping is not None:
        raise ConfigError(
            "a supernet study evaluates candidates on its supernet: it takes no table= and no "
            "early_stopping= (they are for looked-up and trained candidates)"
        )


def _check_objectives(names: Sequence[str], controller: Controller) -> tuple[str, ...]:
    objectives = tuple(names)
    for name in objectives:
        objective(name)  # unknown names raise with suggestions
    if len(set(objectives)) != len(objectives) or not objectives:
        raise ConfigError(f"objectives must be distinct and non-empty, got {objectives}")
    wanted = getattr(controller, "objectives", None) or {}
    if set(wanted) - set(objectives):
        raise ConfigError(
            f"controller {controller.name!r} optimises {sorted(wanted)} but the study "
            f"measures {list(objectives)}; add them to objectives= or give the controller "
            "a subset"
        )
    return objectives


def _check_scorer(controller: Controller, proxies: ProxyConfig | None) -> None:
    """A controller that ranks untrained candidates is scored by the study's proxies:
    the study must compute them, every one the controller ranks by."""
    wanted = controller.config().get("proxies") or ()
    if proxies is None:
        raise ConfigError(
            f"controller {controller.name!r} ranks untrained candidates by zero-cost proxies, "
            "which the study computes: add proxies=autosearch.ProxyConfig(...)"
        )
    missing = [n for n in wanted if n not in proxies.names]
    if missing:
        raise ConfigError(
            f"controller {controller.name!r} ranks by {missing}, which the study's "
            f"proxies={list(proxies.names)} do not compute: add them to ProxyConfig(names=...)"
        )


def _check_proxies(proxies: ProxyConfig, table: Table | None, seed: int) -> ProxyConfig:
    """The proxies a study computes, with its seed where none is given."""
    if not isinstance(proxies, ProxyConfig):
        raise ConfigError(f"proxies= takes a ProxyConfig, got {type(proxies).__name__}")
    if table is not None:
        raise ConfigError(
            "a table study looks results up and builds no network to score: it takes no "
            "proxies=; drop it, or train the candidates (no table=)"
        )
    return proxies if proxies.seed is not None else dataclasses.replace(proxies, seed=seed)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _format(stored: Mapping[str, Any]) -> int:
    value = stored.get("format", 0)
    return value if isinstance(value, int) else FORMAT + 1  # unknown: not ours to read


def _get(stored: Any, key: str) -> str:
    return str(stored.get(key, "an unknown version")) if isinstance(stored, Mapping) else "?"


def _default_target(
    space: SearchSpace, metric: str, shape: tuple[int, int, int], classes: int
) -> float | None:
    """A reward's cost target when none is given: the space's budget for that metric,
    else the median over architectures drawn from the space (seeded: the same study
    definition always gets the same target). None for measured-only costs."""
    budget = getattr(space, _FLOAT_BUDGET.get(metric, ""), None)
    if budget is not None:
        return float(budget)
    if metric not in ("flops", "macs", "params", "sparse_macs"):
        return None  # latency, bytes, bops: measured after training, not known ahead
    costs = [c.params if metric == "params" else c.flops for c in _drawn(space, shape, classes)]
    value = float(np.median(costs))
    return value / 2 if metric in ("macs", "sparse_macs") else value


@functools.lru_cache(maxsize=8)
def _drawn(space: SearchSpace, shape: tuple[int, int, int], classes: int) -> tuple[Cost, ...]:
    """The costs of architectures drawn from the space (seeded: always the same)."""
    rng = np.random.default_rng(0)
    return tuple(
        space.cost(space.sample(rng), input_shape=shape, num_classes=classes)
        for _ in range(_TARGET_SAMPLES)
    )


# Candidates larger than this (per image) make trials minutes long on a CPU: said once.
_LARGE_FLOPS, _LARGE_PARAMS = 1e8, 1e7


def _say_how_large(space: SearchSpace, shape: tuple[int, int, int], classes: int) -> None:
    """A space without a budget: say how large its candidates get on these images, and
    how to bound them (loudly when that is large)."""
    if space.max_flops is not None or space.max_params is not None:
        return
    drawn = _drawn(space, shape, classes)
    flops, params = max(c.flops for c in drawn), max(c.params for c in drawn)
    large = flops > _LARGE_FLOPS or params > _LARGE_PARAMS
    (logger.warning if large else logger.debug)(
        "space %s has no budget: on %s images its candidates reach %.3g MFLOPs and %.3g M "
        "parameters (the largest of %d drawn)%s; bound them with max_flops= or max_params=",
        space.name,
        "x".join(map(str, shape)),
        flops / 1e6,
        params / 1e6,
        len(drawn),
        ", which takes long to train" if large else "",
    )
