"""autosearch: neural architecture search with every candidate trained for real.

import autosearch
from search_spaces import ResNetSpace
from controllers import RandomSearch

study = autosearch.create_study("digits", controller=RandomSearch(ResNetSpace(), seed=0))
study.optimize(n_trials=10)
study.pareto()

The names below are loaded on first use (PEP 562): ``import autosearch`` loads only
this module, so that a program that owns its process (the ``autosearch`` command, a
worker) can load the rest as it sees fit (autosearch/workers/_collection.py), and a
program that does not is left as it was: ``import autosearch`` changes nothing of the
interpreter's state (its collector, its import machinery).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autosearch import _logs
from autosearch._version import __version__

if TYPE_CHECKING:
    from autosearch.architecture import Architecture
    from autosearch.compress import Compression
    from autosearch.controller import Controller, Outcome
    from autosearch.errors import (
        AutosearchError,
        BudgetError,
        ConfigError,
        DataError,
        ExportError,
        InvalidArchitectureError,
        PlatformError,
        SpaceExhausted,
        StorageError,
        StudyError,
        StudyFileError,
        TrialFailed,
        UnknownNameError,
    )
    from autosearch.evaluation.proxies import ProxyConfig
    from autosearch.evaluation.ranker import Ranker, RankerConfig
    from autosearch.evaluation.tabular import Table
    from autosearch.evaluation.user import Candidate, Evaluator
    from autosearch.population import PopulationResult, train_population
    from autosearch.population.rules import PopulationBasedTraining
    from autosearch.registry import register_controller, register_space
    from autosearch.space import Categorical, IntRange, NetworkSpec, SearchSpace
    from autosearch.study import Record, Study, create_study, load_study
    from autosearch.studyfile import StudySpec
    from autosearch.training.train import TrainConfig
    from autosearch.weight_sharing.supernet import SupernetConfig
    from autosearch.workers.executors import ProcessExecutor, RayExecutor, SlurmExecutor

# name -> the module that defines it
_EXPORTS = {
    "Architecture": "autosearch.architecture",
    "Compression": "autosearch.compress",
    "Controller": "autosearch.controller",
    "Outcome": "autosearch.controller",
    **dict.fromkeys(
        (
            "AutosearchError",
            "BudgetError",
            "ConfigError",
            "DataError",
            "ExportError",
            "InvalidArchitectureError",
            "PlatformError",
            "SpaceExhausted",
            "StorageError",
            "StudyError",
            "StudyFileError",
            "TrialFailed",
            "UnknownNameError",
        ),
        "autosearch.errors",
    ),
    "ProxyConfig": "autosearch.evaluation.proxies",
    "Candidate": "autosearch.evaluation.user",
    "Evaluator": "autosearch.evaluation.user",
    "Ranker": "autosearch.evaluation.ranker",
    "RankerConfig": "autosearch.evaluation.ranker",
    "Table": "autosearch.evaluation.tabular",
    "PopulationResult": "autosearch.population",
    "train_population": "autosearch.population",
    "PopulationBasedTraining": "autosearch.population.rules",
    "register_controller": "autosearch.registry",
    "register_space": "autosearch.registry",
    "Categorical": "autosearch.space",
    "IntRange": "autosearch.space",
    "NetworkSpec": "autosearch.space",
    "SearchSpace": "autosearch.space",
    "Record": "autosearch.study",
    "Study": "autosearch.study",
    "create_study": "autosearch.study",
    "load_study": "autosearch.study",
    "StudySpec": "autosearch.studyfile",
    "TrainConfig": "autosearch.training.train",
    "SupernetConfig": "autosearch.weight_sharing.supernet",
    "ProcessExecutor": "autosearch.workers.executors",
    "RayExecutor": "autosearch.workers.executors",
    "SlurmExecutor": "autosearch.workers.executors",
}

__all__ = [
    "Architecture",
    "AutosearchError",
    "BudgetError",
    "Candidate",
    "Categorical",
    "Compression",
    "ConfigError",
    "Controller",
    "DataError",
    "Evaluator",
    "ExportError",
    "IntRange",
    "InvalidArchitectureError",
    "NetworkSpec",
    "Outcome",
    "PlatformError",
    "PopulationBasedTraining",
    "PopulationResult",
    "ProcessExecutor",
    "ProxyConfig",
    "Ranker",
    "RankerConfig",
    "RayExecutor",
    "Record",
    "SearchSpace",
    "SlurmExecutor",
    "SpaceExhausted",
    "StorageError",
    "Study",
    "StudyError",
    "StudyFileError",
    "StudySpec",
    "SupernetConfig",
    "Table",
    "TrainConfig",
    "TrialFailed",
    "UnknownNameError",
    "__version__",
    "create_study",
    "load_study",
    "register_controller",
    "register_space",
    "train_population",
]

_logs.install()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # found once; later lookups skip this function
        return value
    if name in _PACKAGES:  # `autosearch.report.plots.pareto(study)` after `import autosearch`
        return importlib.import_module(f"autosearch.{name}")
    raise AttributeError(f"module 'autosearch' has no attribute {name!r}")


# The packages a user reaches as attributes of ``autosearch`` without importing them.
_PACKAGES = frozenset({"report"})


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
