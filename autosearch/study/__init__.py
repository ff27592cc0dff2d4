"""Studies: an architecture search kept in an Optuna storage.

Each concern in a file of its own. The facade composes the parts; each part takes
what it reads (a definition, the stored trials, claims, artifacts, an evaluator, a
callback), never the facade:

========================  ==============================================================
``opening.py``            ``create_study``, ``load_study``: they give the facade
``study.py``              the facade, :class:`Study`: composes the parts below
``_typed.py``             what the facade shows: the definition's properties, the trials
``definition.py``         the typed, frozen study definition (JSON once each way)
``records.py``            how a trial is written to storage and read back as records
``trials.py``             the stored trials, read: records, curves, counts
``dataset.py``            the study's data, loaded when first needed
``plans.py``              how the study evaluates an architecture (a trial's plan)
``claims.py``             which worker trains which architecture; resume
``replay.py``             the controller's state in storage, results replayed into it
``results.py``            what records say: the Pareto front, the best within a budget
``loop.py``               one worker's search loop: claim → run → store → tell
``rebuild.py``            a stored trial exported (variants derived again) or rerun
``measure.py``            the front's estimated points measured for real
``overlays.py``           measured figures laid over a trial's estimates
``progress.py``           trial and epoch bars, or a log line per trial
``jobs.py``               work done once per study, claimed through the storage
``storage/``              storage URLs (``_urls.py``), the definition in storage
                          (``stored.py``), weights and work folders (``artifacts.py``,
                          a folder or S3: ``_s3.py``)
``workers/``              a run's workers and torchrun ranks (``pool.py``), where they
                          run (``executors.py``: local, Ray, Slurm), heartbeats,
                          Ctrl-C and SIGTERM (``interrupts.py``)
``supernet/``             the supernet's training as a job and its evaluator
                          (``job.py``), what is stored of it (``state.py``), its weights
                          file (``file.py``), its choice confirmed by training, ranked
                          or not (``confirm.py``)
========================  ==============================================================

A whole trial (training, variants, costs, rewards) is the runner's
(autosearch.evaluation.runner); the study claims, stores and tells.
"""

from __future__ import annotations

from autosearch.evaluation.tabular import Table
from autosearch.study.definition import StudyDefinition, trial_seed
from autosearch.study.opening import create_study, default_storage, load_study
from autosearch.study.records import Record
from autosearch.study.study import Study
from autosearch.study.workers.executors import ProcessExecutor, RayExecutor, SlurmExecutor

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
