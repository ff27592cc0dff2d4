"""Studies: an architecture search kept in an Optuna storage.

Each concern in a file of its own. The facade composes the parts; each part takes
what it reads (a definition, the stored trials, claims, artifacts, an evaluator, a
callback), never the facade:

========================  ==============================================================
``opening.py``            ``create_study``, ``load_study``: they give the facade
``study.py``              the facade, :class:`Study` (and a weight-sharing study's
                          supernet, :class:`~autosearch.study.study.WeightSharing`)
``definition.py``         the typed, frozen study definition (JSON once each way)
``stored.py``             the definition in storage: created once, read back, continued
``records.py``            how a trial is written to storage and read back as records
                          (with what ran it: versions, code)
``trials.py``             the stored trials, read: records, curves, counts
``dataset.py``            the study's data, loaded when first needed
``plans.py``              how the study evaluates an architecture (a trial's plan)
``claims.py``             which worker trains which architecture; resume
``jobs.py``               work done once per study, claimed through the storage
``replay.py``             the controller's state in storage, results replayed into it
``results.py``            what records say: the Pareto front, the best within a budget
``loop.py``               one worker's search loop: claim → run → store → tell
``rebuild.py``            a stored trial exported (variants derived again) or rerun
``measure.py``            the front's estimated points measured for real
``overlays.py``           measured figures laid over a trial's estimates
``progress.py``           trial and epoch bars, or a log line per trial
``leftovers.py``          what no trial needs any more, swept when a search ends
========================  ==============================================================

Where a study is kept is :mod:`autosearch.storage`; who runs its trials,
:mod:`autosearch.workers`; where it is shown live, :mod:`autosearch.tracking`; an
architecture trained as a population, :mod:`autosearch.population`; a supernet for the
whole space, :mod:`autosearch.weight_sharing`. A whole trial (training, variants,
costs, rewards) is the runner's (autosearch.evaluation.runner); the study claims,
stores and tells. The names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autosearch.evaluation.tabular import Table
    from autosearch.study.definition import StudyDefinition, trial_seed
    from autosearch.study.opening import create_study, default_storage, load_study
    from autosearch.study.records import Record
    from autosearch.study.study import Study
    from autosearch.workers.executors import ProcessExecutor, RayExecutor, SlurmExecutor

# name -> the module that defines it (loaded on first use: the study's parts import each
# other through this package, and the facade imports the features that use its loop)
_EXPORTS = {
    "Table": "autosearch.evaluation.tabular",
    "StudyDefinition": "autosearch.study.definition",
    "trial_seed": "autosearch.study.definition",
    "create_study": "autosearch.study.opening",
    "default_storage": "autosearch.study.opening",
    "load_study": "autosearch.study.opening",
    "Record": "autosearch.study.records",
    "Study": "autosearch.study.study",
    "ProcessExecutor": "autosearch.workers.executors",
    "RayExecutor": "autosearch.workers.executors",
    "SlurmExecutor": "autosearch.workers.executors",
}

__all__ = [
    "ProcessExecutor",
    "RayExecutor",
    "Record",
    "SlurmExecutor",
    "Study",
    "StudyDefinition",
    "Table",
    "create_study",
    "default_storage",
    "load_study",
    "trial_seed",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autosearch.study' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
