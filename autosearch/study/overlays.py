"""Estimates and measurements: figures measured after a trial, laid over the
estimates it stored, and which device's latency table a study predicts with.

A search scores candidates on estimates (int8 accuracy by fake quantization, latency
from the lookup table); the points of the front are then measured for real
(study/measure.py). The measured figures are stored on the study beside the trial (a
study user attribute ``measured:TRIAL:VARIANT``, written whole, once per point): the
trial's own result, estimates included, is never changed, and reading a record lays
the measured figures over it, keeping each estimate as ``NAME_estimate``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping

from optuna.storages import BaseStorage

from autosearch.errors import StudyError
from autosearch.latency import latency_table
from autosearch.study.definition import StudyDefinition
from autosearch.study.records import Record

__all__ = [
    "ESTIMATED_FLAGS",
    "ESTIMATES",
    "PREFIX",
    "check_latency_model",
    "is_estimated",
    "measured_overlays",
    "overlay",
]

logger = logging.getLogger(__name__)

PREFIX = "measured:"
# What marks a point's figure as an estimate (records.Record.metrics): int8 accuracy
# and bytes simulated, latency predicted.
ESTIMATED_FLAGS = ("estimated", "latency_predicted")
ESTIMATES = ("accuracy", "test_accuracy", "bytes", "latency", "latency_batched")


def is_estimated(record: Record) -> bool:
    """Whether a record holds estimates that were not measured (a point whose
    measurement failed, ``measure_failed``, keeps its estimates and is not tried again)."""
    return any(record.metrics.get(flag) for flag in ESTIMATED_FLAGS) and not record.metrics.get(
        "measure_failed"
    )


def figures(record: Record) -> str:
    """What a record's figures are, in a word or three: ``measured``, or which are
    estimated (``int8 estimated``, ``latency predicted``)."""
    said = []
    if record.metrics.get("estimated"):
        said.append("accuracy estimated (fake quantization)")
    if record.metrics.get("latency_predicted"):
        said.append("latency predicted (lookup table)")
    if said and record.metrics.get("measure_failed"):
        said.append("its measurement failed")
    return ", ".join(said) or "measured"


def measured_overlays(storage: BaseStorage, study_id: int) -> dict[tuple[int, str], dict]:
    """The measured figures stored on a study, by (trial, variant)."""
    found = {}
    for key, value in storage.get_study_user_attrs(study_id).items():
        if not key.startswith(PREFIX):
            continue
        trial, _, variant = key.removeprefix(PREFIX).partition(":")
        try:
            metrics = {str(k): float(v) for k, v in json.loads(value).items()}
            found[(int(trial), variant)] = metrics
        except (ValueError, TypeError, AttributeError):
            logger.warning("ignoring unreadable measured figures %s on the study", key)
    return found


def overlay(record: Record, measured: Mapping[str, float] | None) -> Record:
    """``record`` with its measured figures laid over its estimates (kept as
    ``NAME_estimate``); unchanged when nothing was measured."""
    if not measured:
        return record
    if measured.get("measure_failed"):
        return dataclasses.replace(record, metrics={**record.metrics, **measured})
    metrics = {k: v for k, v in record.metrics.items() if k not in ESTIMATED_FLAGS}
    for name in ESTIMATES:
        if name in record.metrics and name in measured and is_estimated(record):
            metrics[f"{name}_estimate"] = record.metrics[name]
    return dataclasses.replace(record, metrics={**metrics, **measured})


LATENCY_MODEL = "latency_model"


def check_latency_model(
    storage: BaseStorage, study_id: int, name: str, definition: StudyDefinition
) -> None:
    """Note on the study which device's table predicts its latencies, and refuse to
    predict with another's: two machines' predictions are not comparable."""
    compression, supernet = definition.compression, definition.supernet
    if (
        compression.latency == "measured"
        or definition.table is not None
        or (supernet is not None and not supernet.latency)
    ):
        return
    table = latency_table(compression.latency_table)
    stored = storage.get_study_user_attrs(study_id).get(LATENCY_MODEL)
    if stored is None:
        storage.set_study_user_attr(study_id, LATENCY_MODEL, table.name)
    elif stored != table.name:
        raise StudyError(
            f"study {name!r} predicts latency with the table of {stored}, but this worker's "
            f"is {table.name}: their figures would not be comparable. Run it on that device "
            "type, or copy that machine's table (~/.cache/autosearch/latency/) here and "
            "pass Compression(latency=PATH) with load_if_exists=True"
        )
