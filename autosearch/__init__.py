"""autosearch: neural architecture search with every candidate trained for real.

import autosearch
from search_spaces import ResNetSpace
from controllers import RandomSearch

study = autosearch.create_study("digits", controller=RandomSearch(ResNetSpace(), seed=0))
study.optimize(n_trials=10)
study.pareto()
"""

from __future__ import annotations

import gc as _gc

# No garbage collection while autosearch and its libraries load: torch alone allocates
# ~170,000 objects that live as long as the process, and collecting while they arrive
# scanned them again and again (0.3 s of each import on a 2-core Zen 4). Then they are
# moved to the oldest generation unscanned (a freeze undone; unless this process froze
# objects of its own, which that would undo): what they hold is still collected by the
# next full collection, not scanned twice more on the way. autosearch's own processes
# freeze what they loaded for good (study/workers/_collection.py).
_collecting = _gc.isenabled()
_gc.disable()
try:
    from autosearch import _logs, _moved
    from autosearch._version import __version__
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
    from autosearch.evaluation.supernet import SupernetConfig
    from autosearch.evaluation.tabular import Table
    from autosearch.registry import register_controller, register_space
    from autosearch.space import Categorical, IntRange, NetworkSpec, SearchSpace
    from autosearch.study import (
        ProcessExecutor,
        RayExecutor,
        Record,
        SlurmExecutor,
        Study,
        create_study,
        load_study,
    )
    from autosearch.study.population import PopulationResult, train_population
    from autosearch.study.population.rules import PopulationBasedTraining
    from autosearch.studyfile import StudySpec
    from autosearch.training.train import TrainConfig
finally:
    if _gc.get_freeze_count() == 0:
        _gc.freeze()
        _gc.unfreeze()
    if _collecting:
        _gc.enable()
    del _collecting

__all__ = [
    "Architecture",
    "AutosearchError",
    "BudgetError",
    "Categorical",
    "Compression",
    "ConfigError",
    "Controller",
    "DataError",
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
_moved.install()  # import autosearch.plots, and 0.1.0's module paths (with a warning)


def __getattr__(name: str) -> object:
    # plots and report pull in plotly: load them on first use, not on `import autosearch`
    # (autosearch.plots is autosearch.report.plots, as documented).
    if name == "report":
        import importlib

        return importlib.import_module("autosearch.report")
    module = _moved.attribute(name)
    if module is None:
        raise AttributeError(f"module 'autosearch' has no attribute {name!r}")
    return module
