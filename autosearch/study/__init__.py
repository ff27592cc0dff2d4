"""Studies: an architecture search kept in an Optuna storage.

Each concern in a file of its own. The facade composes the parts; each part takes
what it reads (a definition, the stored trials, claims, artifacts, an evaluator, a
callback), never the facade:

======================  ================================================================
``opening.py``          ``create_study``, ``load_study``: they give the facade
``study.py``            the facade, :class:`Study`: composes the parts below
``definition.py``       the typed, frozen study definition (JSON once each way)
``stored.py``           the definition in storage: created once, read back, continued
``records.py``          how a trial is written to storage and read back as records
``trials.py``           the stored trials, read: records, curves, counts
``dataset.py``          the study's data, loaded when first needed
``plans.py``            how the study evaluates an architecture (a trial's plan)
``claims.py``           which worker trains which architecture; heartbeats; resume
``replay.py``           the controller's state in storage, results replayed into it
``results.py``          what records say: the Pareto front, the best within a budget
``loop.py``             one worker's search loop: claim → run → store → tell
``interrupts.py``       Ctrl-C and SIGTERM: stop after the epoch's checkpoint
``workers.py``          a run's workers (shares, resumed slots) and torchrun ranks
``executors.py``        where workers run: local processes, Ray tasks, Slurm jobs
``rebuild.py``          a stored trial exported (variants derived again) or rerun
``progress.py``         trial and epoch bars, or a log line per trial
``artifacts.py``        trained weights and per-attempt work folders (a folder, or S3:
                        ``_s3.py``)
``jobs.py``             work done once per study, claimed through the storage
``supernet_job.py``     the supernet's training as such a job, and its evaluator
``supernet_state.py``   what a study stores of its supernet, checked on read
``supernet_file.py``    a supernet's weights as a file of their own (save, import)
======================  ================================================================

A whole trial (training, variants, costs, rewards) is the runner's
(autosearch.evaluation.runner); the study claims, stores and tells.
"""

from __future__ import annotations

from autosearch.evaluation.tabular import Table
from autosearch.study.definition import StudyDefinition, trial_seed
from autosearch.study.executors import ProcessExecutor, RayExecutor, SlurmExecutor
from autosearch.study.opening import create_study, default_storage, load_study
from autosearch.study.records import Record
from autosearch.study.study import Study

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
