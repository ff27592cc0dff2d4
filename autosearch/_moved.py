"""Module paths of earlier releases, kept importable for one release.

Release 0.2.0 grouped the top level into packages (``autosearch.scoring``,
``autosearch.training``, ``autosearch.evaluation``, ...). Code written against 0.1.0
imports ``autosearch.cost`` or ``from autosearch.train import TrainConfig``: such an
import still works, gives the very module of the new path (so objects are the same
and isinstance checks hold), and warns once with a ``FutureWarning`` (meant for users,
shown by default) that names the new path. The aliases go in 0.3.0 (CHANGELOG.md). The
same for the study package's parts grouped into ``storage/``, ``workers/`` and
``supernet/`` (``autosearch.study.executors`` is ``autosearch.study.workers.executors``).

``autosearch.plots`` is not deprecated: it is the documented name of
``autosearch.report.plots``, importable as a module as well as an attribute.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

REMOVED_IN = "0.3.0"

# old module -> where it lives now
MOVED = {
    "autosearch.cost": "autosearch.scoring.cost",
    "autosearch.latency": "autosearch.scoring.latency",
    "autosearch.metrics": "autosearch.scoring.metrics",
    "autosearch.pareto": "autosearch.scoring.pareto",
    "autosearch.early_stopping": "autosearch.training.early_stopping",
    "autosearch.runtime": "autosearch.training.runtime",
    "autosearch.train": "autosearch.training.train",
    "autosearch.runner": "autosearch.evaluation.runner",
    "autosearch.supernet": "autosearch.evaluation.supernet",
    "autosearch.tabular": "autosearch.evaluation.tabular",
    "autosearch.trial": "autosearch.evaluation.trial",
    "autosearch.retrain": "autosearch.export.retrain",
    # 0.2.x grouped the study package (storage/, workers/, supernet/)
    "autosearch.study.artifacts": "autosearch.study.storage.artifacts",
    "autosearch.study.stored": "autosearch.study.storage.stored",
    "autosearch.study.executors": "autosearch.study.workers.executors",
    "autosearch.study.interrupts": "autosearch.study.workers.interrupts",
    "autosearch.study.confirm": "autosearch.study.supernet.confirm",
    "autosearch.study.supernet_file": "autosearch.study.supernet.file",
    "autosearch.study.supernet_job": "autosearch.study.supernet.job",
    "autosearch.study.supernet_progress": "autosearch.study.supernet.progress",
    "autosearch.study.supernet_state": "autosearch.study.supernet.state",
}
# documented names of modules that live elsewhere (no warning)
ALIASES = {"autosearch.plots": "autosearch.report.plots"}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str, *, deprecated: bool) -> None:
        self.target, self.deprecated = target, deprecated

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        if self.deprecated:
            warnings.warn(
                f"{spec.name} moved to {self.target}; import it from there (the old path "
                f"goes in autosearch {REMOVED_IN})",
                FutureWarning,
                stacklevel=2,
            )
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """The module of the new path is imported already."""


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname) or ALIASES.get(fullname)
        if new is None:
            return None
        loader = _AliasLoader(new, deprecated=fullname in MOVED)
        return importlib.machinery.ModuleSpec(fullname, loader)


def install() -> None:
    """Let the old paths be imported (once per process)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())


def attribute(name: str) -> ModuleType | None:
    """``autosearch.NAME`` for an old or aliased module path (imported, so warned)."""
    full = f"autosearch.{name}"
    return importlib.import_module(full) if full in MOVED or full in ALIASES else None
