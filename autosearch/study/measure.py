"""The study's front measured for real.

A search scores candidates on estimates (int8 accuracy by fake quantization, latency
from the lookup table: autosearch.compress._fake_quant, autosearch.scoring.latency). What a
user sees on the front, picks with ``best()`` and exports is measured: each point of
the front with an estimated figure is rebuilt from its trial (the supernet's subnet, or
the trained weights), its int8 program lowered for real, evaluated and timed, and the
figures stored beside the trial (study/overlays.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from optuna.storages import BaseStorage

from autosearch.compress import Derived
from autosearch.errors import AutosearchError
from autosearch.evaluation.runner import derive_variant, evaluation_splits, profile
from autosearch.scoring.cost import Cost
from autosearch.study.jobs import Done, Held, Jobs
from autosearch.study.overlays import ESTIMATES, PREFIX, is_estimated, overlay, parse_overlay
from autosearch.study.rebuild import Rebuilder
from autosearch.study.records import Record
from autosearch.study.results import front
from autosearch.training.train import evaluate
from autosearch.workers._heartbeat import beating

__all__ = ["FrontMeasurer"]

logger = logging.getLogger(__name__)

_ROUNDS = 3  # measurements of one point in a row whose figures did not stay stored
_MARKS = ("measured", "measure_failed")


@dataclass(frozen=True, kw_only=True)
class FrontMeasurer:
    """Measures the estimated points of study ``rebuilder.name``'s front, from what it
    reads: the stored trials (through the rebuilder), the study's objectives, the
    storage where the figures are written, and the study's job claims (``jobs``; with
    the heartbeat ``interval``): each point is measured by one worker, whoever asks."""

    rebuilder: Rebuilder
    storage: BaseStorage
    study_id: int
    objectives: tuple[str, ...]
    jobs: Jobs
    interval: float

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
        """Measure ``points`` for real and store their figures: each point a job of the
        study (autosearch.study.jobs), so that of workers measuring the same front at
        once one measures a point and the others wait for its figures. A point another
        worker is measuring is left for after the free ones: workers that reach the
        front together (a pool's, as its trials run out) share its points instead of
        each waiting for one point at a time. A job is done only while its figures are
        there and readable: figures gone or damaged since make the next round's job,
        measured again."""
        held = [record for record in points if not self._measure(record, wait=_skip)]
        for record in held:
            self._measure(record, wait=_pause)

    def _measure(self, record: Record, *, wait: Callable[[Held], None]) -> bool:
        """Measure ``record``'s point unless its figures are stored; False where another
        worker held its job and ``wait`` raised :class:`_Busy` (nothing claimed)."""
        key = f"{PREFIX}{record.trial}:{record.variant}"
        for _ in range(_ROUNDS):
            # The round first, then the figures: a round that another worker ends after
            # this read is found done (with its figures), never taken for the next one.
            job = self._job(key)
            if self._readable(key):
                return True  # measured (by another worker, meanwhile)
            try:
                found = self.jobs.acquire(job, wait=wait)
            except _Busy:
                return False
            if isinstance(found, Done):
                continue  # its figures are read (again) on the next pass
            with beating(self.storage, found.trial_id, self.interval, stamped=True):
                measured = self._measure_one(record)
            # The figures are written while the claim holds the job, then the job
            # ends: whoever finds the job done finds its figures. (Written after, a
            # worker that found the job done before they were written took them for
            # gone and measured the point again.) A worker killed between the two
            # leaves its figures under a running claim, given up as dead by the next
            # look at the job or the search's tidy().
            if self.jobs.taken_over(found) is None:
                self.storage.set_study_user_attr(self.study_id, key, json.dumps(measured))
            self.jobs.finish(found, {"figures": key})
        logger.warning(
            "trial %d (%s): its measured figures do not stay stored", record.trial, record.variant
        )
        return True

    def _readable(self, key: str) -> bool:
        """Whether the figures at ``key`` are stored, readable and say what they are
        (measured, or that measuring failed)."""
        stored = self.storage.get_study_user_attrs(self.study_id).get(key)
        try:
            return any(mark in parse_overlay(stored) for mark in _MARKS)
        except ValueError:
            return False

    def _job(self, key: str) -> str:
        """The job of measuring the point stored at ``key`` in this round: one more
        than the jobs of that point already done (their figures, if any, were found
        gone or damaged)."""
        prefix = f"measure:{key.removeprefix(PREFIX)}:"
        rounds = sum(name.startswith(prefix) for name in self.jobs.names(finished=True))
        return f"{prefix}{rounds}"

    def _measure_one(self, record: Record) -> dict[str, float]:
        try:
            measured = self._measured(record)
        except AutosearchError as exc:
            logger.warning(
                "trial %d (%s) could not be measured: %s", record.trial, record.variant, exc
            )
            return {"measure_failed": 1.0}
        logger.info(
            "measured trial %d %s: %s",
            record.trial,
            record.variant,
            ", ".join(f"{k} {v:.4g}" for k, v in measured.items() if k in ESTIMATES),
        )
        return measured

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
            val, test = evaluation_splits(plan, data)  # the images its estimate was scored on
            figures = {
                "accuracy": evaluate(derived.model, val, data)[0],
                "test_accuracy": evaluate(derived.model, test, data)[0],
            }
        # A study for another device keeps that device's predicted latency.
        timed = None if plan.compression.latency_table else "measured"
        measured = {**figures, **profile(derived, data, latency=timed, counted=counted)}
        keep = ("accuracy", "test_accuracy", "bytes", "bops", "latency", "latency_batched")
        result = {k: float(measured[k]) for k in keep if k in measured}
        result["measured"] = 1.0
        result["reward"] = float(plan.reward({**m, **result}))
        return result


class _Busy(Exception):
    """Another worker is measuring the point: left for later."""


def _skip(held: Held) -> None:
    raise _Busy


def _pause(held: Held) -> None:
    """Between reads while another worker measures a point (seconds, at most)."""
    time.sleep(0.5)
