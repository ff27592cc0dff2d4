"""Studies: an architecture search kept in an Optuna storage.

Each concern in a file of its own:

=================  ==================================================================
``study.py``       the facade: ``create_study``, ``load_study``, :class:`Study`
``definition.py``  the typed, frozen study definition (JSON once each way)
``records.py``     how a trial is written to storage and read back as records
``claims.py``      which worker trains which architecture; heartbeats; resume
``replay.py``      the controller's state in storage, results replayed into it
``loop.py``        one worker's search loop: claim → run → store → tell
``workers.py``     a run's workers (shares, resumed slots) and torchrun ranks
``executors.py``   where workers run: local processes, Ray tasks, Slurm jobs
``rebuild.py``     a stored trial exported (variants derived again) or rerun
``artifacts.py``   trained weights and per-epoch checkpoints (a folder, or S3:
                   ``_s3.py``)
=================  ==================================================================

A whole trial (training, variants, costs, rewards) is the runner's
(autosearch.runner); the study claims, stores and tells.
"""

from __future__ import annotations

from autosearch.study.definition import StudyDefinition, trial_seed
from autosearch.study.executors import RayExecutor, SlurmExecutor
from autosearch.study.records import Record
from autosearch.study.study import Study, create_study, default_storage, load_study
from autosearch.tabular import Table

__all__ = [
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
