"""The study's front measured for real.

A search scores candidates on estimates (int8 accuracy by fake quantization, latency
from the lookup table: autosearch.compress._fake_quant, autosearch.latency). What a
user sees on the front, picks with ``best()`` and exports is measured: each point of
the front with an estimated figure is rebuilt from its trial (the supernet's subnet, or
the trained weights), its int8 program lowered for real, evaluated and timed, and the
figures stored beside the trial (study/overlays.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from optuna.storages import BaseStorage

from autosearch.compress import Derived
from autosearch.cost import Cost
from autosearch.errors import AutosearchError
from autosearch.runner import derive_variant, profile
from autosearch.study.overlays import ESTIMATES, PREFIX, is_estimated, overlay
from autosearch.study.rebuild import Rebuilder
from autosearch.study.records import Record
from autosearch.study.results import front
from autosearch.train import evaluate

__all__ = ["FrontMeasurer"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class FrontMeasurer:
    """Measures the estimated points of study ``rebuilder.name``'s front, from what it
    reads: the stored trials (through the rebuilder), the study's objectives, and the
    storage where the figures are written."""

    rebuilder: Rebuilder
    storage: BaseStorage
    study_id: int
    objectives: tuple[str, ...]

    def front(self) -> list[Record]:
        """The front's points (every objective, every variant) measured first where
        they were estimated; measuring can move a point off the front and another on,
        so this repeats until the front holds measured points only."""
        for _ in range(10):
            points = front(self.rebuilder.trials.records(), self.objectives)
            estimated = [r for r in points if is_estimated(r)]
            if not estimated:
                return points
            self.measure(estimated)
        return front(self.rebuilder.trials.records(), self.objectives)

    def measured(self, record: Record, *, store: bool) -> Record:
        """``record`` with its estimates measured (stored on the study if ``store``)."""
        if not is_estimated(record):
            return record
        if store:
            self.measure([record])
            return self.rebuilder.trials.record(record.trial, record.variant)
        return overlay(record, self._measured(record))

    def measure(self, points: Sequence[Record]) -> None:
        """Measure ``points`` for real and store their figures."""
        for record in points:
            try:
                measured = self._measured(record)
            except AutosearchError as exc:
                logger.warning(
                    "trial %d (%s) could not be measured: %s", record.trial, record.variant, exc
                )
                measured = {"measure_failed": 1.0}
            key = f"{PREFIX}{record.trial}:{record.variant}"
            self.storage.set_study_user_attr(self.study_id, key, json.dumps(measured))
            logger.info(
                "measured trial %d %s: %s",
                record.trial,
                record.variant,
                ", ".join(f"{k} {v:.4g}" for k, v in measured.items() if k in ESTIMATES),
            )

    def _measured(self, record: Record) -> dict[str, float]:
        """What a point's estimates are, measured: its int8 program lowered and
        evaluated, and the latency of what really runs timed."""
        rebuilder = self.rebuilder
        data = rebuilder.data.dataset
        base = record if record.is_base else rebuilder.trials.record(record.trial)
        model = rebuilder.load_model(base)
        plan = rebuilder.stored_plan(record)
        m = record.metrics
        counted = Cost(flops=int(m["flops"]), macs=int(m["macs"]), params=int(m["params"]))
        if record.is_base:
            derived = Derived(model=model, float_model=model)
            figures: dict[str, float] = {}
        else:
            derived = derive_variant(plan, record.variant, model, data)
            figures = {
                "accuracy": evaluate(derived.model, data.val, data)[0],
                "test_accuracy": evaluate(derived.model, data.test, data)[0],
            }
        # A study for another device keeps that device's predicted latency.
        timed = None if plan.compression.latency_table else "measured"
        measured = {**figures, **profile(derived, data, latency=timed, counted=counted)}
        keep = ("accuracy", "test_accuracy", "bytes", "bops", "latency", "latency_batched")
        result = {k: float(measured[k]) for k in keep if k in measured}
        result["measured"] = 1.0
        result["reward"] = float(plan.reward({**m, **result}))
        return result
