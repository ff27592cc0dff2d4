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
from autosearch.scoring.latency import latency_table
from autosearch.scoring.metrics import metric
from autosearch.study.definition import StudyDefinition
from autosearch.study.records import Record

__all__ = [
    "ESTIMATED_FLAGS",
    "ESTIMATES",
    "PREFIX",
    "check_latency_model",
    "estimated_names",
    "figures",
    "is_estimated",
    "measured_overlays",
    "overlay",
    "parse_overlay",
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


def estimated_names(record: Record) -> set[str]:
    """The figures of ``record`` that are estimates not measured since (none once its
    measurement is laid over it; a point whose measurement failed keeps them)."""
    flags = [flag for flag in ESTIMATED_FLAGS if record.metrics.get(flag)]
    return {name for flag in flags for name in _OVERLAID[flag] if name in record.metrics}


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


# What a measurement may lay over a point, by what was estimated there: int8 accuracy and
# its bytes and bit-operations simulated (and no latency yet), or only latency predicted.
_OVERLAID: dict[str, tuple[str, ...]] = {
    "estimated": ("accuracy", "test_accuracy", "bytes", "bops", "latency", "latency_batched"),
    "latency_predicted": ("latency", "latency_batched"),
}
_MARKS = ("measured", "measure_failed")  # 1.0: measured for real; its measuring failed


def measured_overlays(storage: BaseStorage, study_id: int) -> dict[tuple[int, str], dict]:
    """The measured figures stored on a study, by (trial, variant): each checked as a
    result's figures are (autosearch.scoring.metrics bounds); one that is not is logged and
    left out, and its point stays estimated (measured again when it is needed)."""
    found = {}
    for key, value in storage.get_study_user_attrs(study_id).items():
        if not key.startswith(PREFIX):
            continue
        trial, _, variant = key.removeprefix(PREFIX).partition(":")
        try:
            found[(_trial_number(trial), variant)] = parse_overlay(value)
        except ValueError as exc:
            logger.warning("ignoring damaged measured figures %s on the study: %s", key, exc)
    return found


def parse_overlay(value: object) -> dict[str, float]:
    """A stored overlay (JSON text of names to numbers), checked.

    Raises:
        ValueError: it is not JSON of an object, names a figure a measurement never
            writes, or holds a value out of its metric's bounds.
    """
    try:
        stored = json.loads(value) if isinstance(value, str) else None
    except (ValueError, RecursionError):
        stored = None
    if not isinstance(stored, dict):
        raise ValueError("it is not a JSON object of figures")
    parsed = {}
    for name, figure in stored.items():
        if name in _MARKS:
            if figure != 1.0 or isinstance(figure, bool):
                raise ValueError(f"{name} is {figure!r}, not 1.0")
            parsed[name] = 1.0
        elif name == "reward" or name in _OVERLAID["estimated"]:
            parsed[name] = metric(name).parse(figure)
        else:
            raise ValueError(f"{str(name)[:40]!r} is not a figure a measurement writes")
    return parsed


def _trial_number(text: str) -> int:
    if not text.isdigit() or len(text) > 12:
        raise ValueError(f"{text[:20]!r} is not a trial number")
    return int(text)


def overlay(record: Record, measured: Mapping[str, float] | None) -> Record:
    """``record`` with its measured figures laid over its estimates (kept as
    ``NAME_estimate``): only the figures that were estimated there, and only on a point
    that holds estimates; unchanged otherwise."""
    flags = [flag for flag in ESTIMATED_FLAGS if record.metrics.get(flag)]
    if not measured or not flags:
        return record
    if measured.get("measure_failed"):
        return dataclasses.replace(record, metrics={**record.metrics, "measure_failed": 1.0})
    allowed = {name for flag in flags for name in _OVERLAID[flag]}
    laid = {k: v for k, v in measured.items() if k in allowed or k in ("reward", "measured")}
    metrics = {k: v for k, v in record.metrics.items() if k not in ESTIMATED_FLAGS}
    for name in ESTIMATES:
        if name in record.metrics and name in laid:
            metrics[f"{name}_estimate"] = record.metrics[name]
    return dataclasses.replace(record, metrics={**metrics, **laid})


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
