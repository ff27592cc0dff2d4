"""What one process that runs a study's trials shows of them, live: each trial's run
started (or continued, where it resumes), its epochs, its variants' figures and state
at the end; a supernet's epochs; the front. Every call returns at once: the work is
done in a thread per tool (``_sender``), and a tool that fails is one line in the log.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from autosearch.evaluation.trial import TrialPlan
from autosearch.study.definition import StudyDefinition
from autosearch.study.overlays import ESTIMATED_FLAGS, estimated_names, figures
from autosearch.study.records import Record
from autosearch.tracking._sender import Sender
from autosearch.tracking.mlflow_runs import MLflowRuns, metric_key
from autosearch.tracking.spec import Tracking
from autosearch.tracking.tensorboard_logs import TensorBoardLogs
from autosearch.training.train import EpochResult

__all__ = ["Tracker", "variant_metrics"]

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT = 30.0  # seconds a process waits, at the end of a run, for a slow tracker
# Seconds MLflow's first call may take: importing MLflow and making a new store's tables,
# every worker of a study at once, one at a time under the store's lock, on a machine
# kept busy by other processes (the closing timeout above was not enough there).
MLFLOW_SETUP = 180.0
# A trial's epochs reach MLflow at most this often: the first at once, those that end
# sooner after it together with the next (each call costs a store transaction).
EPOCHS_EVERY = 2.0
# A trial's state as an MLflow run's status (interrupted, or anything else: KILLED).
_STATUS = {"complete": "FINISHED", "failed": "FAILED", "stopped": "FINISHED"}
_FLAGS = {*ESTIMATED_FLAGS, "measured", "measure_failed"}


class Tracker:
    """The tracking of study ``study`` (creation id ``uid``) in this process, as
    ``tracking`` asks (nothing where it is off)."""

    def __init__(
        self, tracking: Tracking, *, study: str, uid: str, definition: StudyDefinition
    ) -> None:
        self.tracking = tracking
        self._study = (_study_params(definition), _study_tags(definition, study))
        self._controller = definition.controller.name
        self._mlflow: tuple[MLflowRuns, Sender] | None = None
        self._tensorboard: tuple[TensorBoardLogs, Sender] | None = None
        self._supernet_started = False
        self._senders: list[Sender] = []
        # Per trial: epochs not yet sent to MLflow (figures, epoch, time in ms), and
        # when its epochs were last sent.
        self._epochs: dict[str, list[tuple[dict[str, float], int, int]]] = {}
        self._epochs_sent: dict[str, float] = {}
        self._resumed: dict[str, int] = {}  # per trial: the epoch it resumed after
        if tracking.mlflow:
            self._mlflow = (
                MLflowRuns(tracking.mlflow, study, uid),
                Sender(f"MLflow at {tracking.mlflow}", setup=MLFLOW_SETUP),
            )
            self._senders.append(self._mlflow[1])
        if tracking.tensorboard:
            logs = TensorBoardLogs(tracking.tensorboard, study)
            self._tensorboard = (logs, Sender(f"TensorBoard in {tracking.tensorboard}"))
            self._senders.append(self._tensorboard[1])
        if self._senders:
            atexit.register(self.close, 5.0)

    @property
    def on(self) -> bool:
        return bool(self._senders)

    @property
    def busy(self) -> float:
        """CPU seconds this process has spent sending to the trackers."""
        return sum(sender.busy for sender in self._senders)

    def trial_started(
        self,
        key: str,
        number: int,
        plan: TrialPlan,
        *,
        first: bool = False,
        resumed_at: int = 0,
        worker: str = "",
        first_number: int | None = None,
    ) -> None:
        """Trial ``number`` (its claim's ``key``) starts (on its ``first`` attempt: no
        earlier run to look for), or resumes after epoch ``resumed_at`` an earlier attempt
        (its first: ``first_number``) whose curve it goes on with: its genes and training
        settings as parameters."""
        self._resumed[key] = resumed_at
        if self._mlflow:
            runs, sender = self._mlflow
            params = trial_params(plan)
            tags = {
                "autosearch.trial": str(number),
                "autosearch.state": "running",
                "autosearch.controller": self._controller,
                "autosearch.arch_id": plan.arch.arch_id,
                "autosearch.worker": worker,
                "mlflow.note.content": plan.space.describe(plan.arch),
            }
            first = first and not resumed_at
            sender.send(
                runs.trial_started, key, f"trial {number}", params, tags, self._study, first=first
            )
        if self._tensorboard:
            logs, sender = self._tensorboard
            folder = number if first_number is None else first_number
            sender.send(logs.trial_started, key, folder, resumed_at + 1 if resumed_at else 0)

    def epoch(self, key: str, epoch: EpochResult) -> None:
        figures = _figures(epoch)
        if self._mlflow:
            self._epochs.setdefault(key, []).append((figures, epoch.epoch, int(time.time() * 1000)))
            if time.monotonic() - self._epochs_sent.get(key, -EPOCHS_EVERY) >= EPOCHS_EVERY:
                self._send_epochs(key)
        if self._tensorboard:
            logs, sender = self._tensorboard
            shown = {f"{'train' if k.startswith('train') else 'val'}/{k.partition('_')[2]}": v
                     for k, v in figures.items() if k != "epoch_seconds"}  # fmt: skip
            sender.send(logs.scalars, key, shown, epoch.epoch)

    def _send_epochs(self, key: str) -> None:
        points = self._epochs.pop(key, [])
        if self._mlflow and points:
            runs, sender = self._mlflow
            *earlier, (figures, step, _) = points
            sender.send(runs.log, key, figures, step, points=earlier)
            self._epochs_sent[key] = time.monotonic()

    def trial_ended(
        self,
        key: str,
        plan: TrialPlan,
        records: Sequence[Record],
        *,
        reason: str = "",
        facts: Mapping[str, Any] | None = None,
        history: Sequence[EpochResult] = (),
    ) -> None:
        """The trial's records (one per variant; none where it stopped unstored):
        every variant's figures, its state, and ``arch.json``. A trial that resumed
        also sends, from its whole ``history``, the epochs before it resumed that its
        run lacks (an attempt killed before it sent them)."""
        resumed_at = self._resumed.pop(key, 0)
        state: str = records[0].state if records else "interrupted"
        if self._mlflow:
            runs, sender = self._mlflow
            metrics: dict[str, float] = {}
            tags: dict[str, str] = {"autosearch.state": state}
            for record in records:
                metrics.update(variant_metrics(record))
                tags[f"autosearch.figures.{metric_key(record.variant)}"] = figures(record)
            if reason or (records and records[0].reason):
                tags["autosearch.reason"] = (reason or records[0].reason)[:5000]
            supernet = (facts or {}).get("supernet")
            if supernet:
                tags["autosearch.supernet"] = str(supernet)
            texts = {"arch.json": plan.arch.to_json()}
            status = _STATUS.get(state, "KILLED")
            epochs = self._epochs.pop(key, [])
            self._epochs_sent.pop(key, None)
            now = int(time.time() * 1000)
            earlier = [(_figures(e), e.epoch, now) for e in history if e.epoch <= resumed_at]
            sender.send(runs.trial_ended, key, status, metrics, tags, texts, epochs, earlier)
        if self._tensorboard:
            logs, sender = self._tensorboard
            base = next((r for r in records if r.variant == "base"), None)
            final = {
                k: v for k, v in (base.metrics if base else {}).items() if k in _HPARAM_METRICS
            }
            sender.send(logs.trial_ended, key, trial_params(plan), final)

    def measured(self, key: str, record: Record) -> None:
        """A point of the front measured for real after the search (its estimates
        kept as ``NAME_estimate``)."""
        if self._mlflow:
            runs, sender = self._mlflow
            said = {f"autosearch.figures.{metric_key(record.variant)}": figures(record)}
            sender.send(runs.log, key, variant_metrics(record), tags=said)

    def supernet_epoch(self, epoch: EpochResult) -> None:
        """An epoch of the study's supernet (a run of its own, beside the trials')."""
        if self._mlflow:
            runs, sender = self._mlflow
            figures = {"train_loss": epoch.train_loss, "val_accuracy": epoch.val_accuracy}
            if not self._supernet_started:
                self._supernet_started = True
                tags = {"autosearch.role": "supernet", "autosearch.state": "running"}
                sender.send(runs.trial_started, "supernet", "supernet", {}, tags, self._study)
            sender.send(runs.log, "supernet", figures, epoch.epoch)
        if self._tensorboard:
            logs, sender = self._tensorboard
            shown = {"train/loss": epoch.train_loss, "val/accuracy": epoch.val_accuracy}
            sender.send(logs.scalars, "supernet", shown, epoch.epoch)

    def supernet_ended(self, status: str) -> None:
        """The supernet's training ended: FINISHED, or KILLED (interrupted)."""
        if self._mlflow and self._supernet_started:
            runs, sender = self._mlflow
            tags = {"autosearch.state": "complete" if status == "FINISHED" else "interrupted"}
            sender.send(runs.trial_ended, "supernet", status, {}, tags, {})

    def front(self, records: Sequence[Record]) -> None:
        """The front as it stands (TensorBoard's ``front``)."""
        if self._tensorboard:
            points = [(r.metrics["flops"], r.metrics["accuracy"]) for r in records
                      if "flops" in r.metrics and "accuracy" in r.metrics]  # fmt: skip
            logs, sender = self._tensorboard
            sender.send(logs.front, points)

    def search_ended(
        self,
        done: Sequence[Record],
        fresh: Mapping[tuple[int, str], Record],
        front: Callable[[], Sequence[Record]],
        *,
        ended: bool,
    ) -> None:
        """After ``optimize``: the points of the trials ``done`` measured since they were
        told (``fresh``: every record now); where this process ran the search (not a
        pool's worker, ``ended``), the ``front()`` as it stands and the study's run
        ended. Then waits for what was sent."""
        if not self.on:
            return
        told = {r.trial for r in done}
        for (trial, _), now in fresh.items():
            if trial in told and now.metrics.get("measured"):
                key = now.arch.arch_id if now.kind is None else f"{now.kind}:{now.arch.arch_id}"
                self.measured(key, now)
        if ended:
            self.front(front())
            self.study_ended()
        self.close()

    @contextmanager
    def supernet(self) -> Iterator[None]:
        """Around the supernet's training: its run ended FINISHED, or KILLED when it is
        interrupted; then waits for what was sent."""
        try:
            yield
        except BaseException:
            self.supernet_ended("KILLED")
            raise
        else:
            self.supernet_ended("FINISHED")
        finally:
            self.close()

    def study_ended(self) -> None:
        if self._mlflow:
            runs, sender = self._mlflow
            sender.send(runs.study_ended)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Wait (``timeout`` at most) for what was sent; the writers closed."""
        for key in list(self._epochs):  # a trial's epochs that no end of it sent
            self._send_epochs(key)
        if self._tensorboard:
            logs, sender = self._tensorboard
            sender.send(logs.close)
        for sender in self._senders:
            sender.close(timeout)


def _figures(epoch: EpochResult) -> dict[str, float]:
    """An epoch's figures as a trial's step metrics."""
    return {"train_loss": epoch.train_loss, "val_accuracy": epoch.val_accuracy,
            "val_loss": epoch.val_loss, "epoch_seconds": epoch.seconds}  # fmt: skip


_HPARAM_METRICS = ("accuracy", "test_accuracy", "flops", "params", "latency", "reward")


def variant_metrics(record: Record) -> dict[str, float]:
    """A point's figures as MLflow metrics: the base's by their names, a variant's
    prefixed with it (``int8.accuracy``); an estimate not yet measured named
    ``NAME_estimate``, a measured figure ``NAME`` (its estimate kept beside it)."""
    prefix = "" if record.variant == "base" else f"{record.variant}."
    estimated = estimated_names(record)
    shown = {}
    for name, value in record.metrics.items():
        if name in _FLAGS:
            continue
        shown[metric_key(prefix + (f"{name}_estimate" if name in estimated else name))] = value
    return shown


def trial_params(plan: TrialPlan) -> dict[str, Any]:
    """A trial's parameters: its genes by name, and the settings it trains with
    (``train.lr``, …: the study's, with the candidate's searched ones applied)."""
    config = plan.config
    settings = {f"train.{f.name}": getattr(config, f.name) for f in dataclasses.fields(config)}
    shown = {
        k: v for k, v in settings.items() if isinstance(v, (int, float, str, bool)) or v is None
    }
    return {**dict(plan.arch.genes), **{k: "None" if v is None else v for k, v in shown.items()}}


def _study_params(definition: StudyDefinition) -> dict[str, Any]:
    return {
        "space": definition.space.name,
        "controller": definition.controller.name,
        "data": definition.data,
        "objectives": ",".join(definition.objectives),
        "variants": ",".join(v.name for v in definition.variants),
        "seed": definition.seed,
        "epochs": definition.train.epochs,
    }


def _study_tags(definition: StudyDefinition, study: str) -> dict[str, str]:
    return {
        "autosearch.study": study,
        "autosearch.space": definition.space.name,
        "autosearch.controller": definition.controller.name,
        "mlflow.note.content": f"autosearch study {study!r}: {definition.space.name} searched "
        f"by {definition.controller.name} on {definition.data}",
    }
