"""A stored trial rebuilt: its trained network loaded, or exported (a variant derived
again from the trial's weights), or its training rerun from scratch to check that it
reproduces (a supernet's subnet: evaluated again on the supernet).

Export and rerun use the plan the trial was evaluated with
(autosearch.evaluation.runner.TrialPlan): the candidate's own training settings and the
seed the trial stored.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from autosearch._version import __version__
from autosearch.errors import ConfigError, ExportError, PlatformError, StudyError
from autosearch.evaluation.runner import TrialPlan, derive_variant, run_trial, train_candidate
from autosearch.export import write_export
from autosearch.population.full import schedule_trainer
from autosearch.space import SearchSpace
from autosearch.storage.artifacts import Artifacts
from autosearch.study import records
from autosearch.study.dataset import StudyData
from autosearch.study.definition import StudyDefinition
from autosearch.study.plans import Planner
from autosearch.study.records import Record, provenance
from autosearch.study.trials import StoredTrials
from autosearch.training.train import evaluate, train
from autosearch.weight_sharing.supernet import SubnetEvaluator

__all__ = ["Rebuilder"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Rebuilder:
    """Rebuilds the stored trials of study ``name`` from what it reads: its stored
    trials, how its trials are planned (the planner holds the definition, the space and
    the artifacts that hold the weights), its data, and its supernet's evaluator (None:
    trials train)."""

    name: str
    trials: StoredTrials
    planner: Planner
    data: StudyData
    supernet: Callable[[], SubnetEvaluator] | None = None  # the supernet's evaluator

    @property
    def definition(self) -> StudyDefinition:
        return self.planner.definition

    @property
    def space(self) -> SearchSpace:
        return self.planner.space

    @property
    def artifacts(self) -> Artifacts:
        return self.planner.artifacts

    def stored_plan(self, record: Record) -> TrialPlan:
        """How ``record``'s trial was evaluated: with the seed it stored."""
        return self.planner.stored(self.trials.get(record.trial), record.arch)

    def teacher(self, metrics: Mapping[str, float]) -> nn.Module | None:
        """The study's most accurate trained model so far, if it beats a candidate of
        ``metrics`` (None: the candidate teaches itself)."""
        done = [
            r for r in self.trials.records(variants=False) if r.state == "complete" and r.accuracy
        ]
        best = max(done, key=lambda r: r.metrics["accuracy"], default=None)
        if best is None or best.metrics["accuracy"] <= metrics["accuracy"]:
            return None
        try:
            return self.load_model(best)
        except ExportError as exc:
            logger.info("no teacher for distillation (%s); the candidate teaches itself", exc)
            return None

    def load_model(self, record: Record) -> nn.Module:
        """The trained network of a complete record, in eval mode."""
        if record.state != "complete":
            raise ExportError(
                f"trial {record.trial} is {record.state}; only complete trials have trained weights"
            )
        if not record.is_base:
            raise ExportError(
                f"record {record.trial}/{record.variant} is a measured variant; its weights are "
                f"not stored. Load the base (study.record({record.trial})) and derive it again "
                f"with autosearch.compress.derive({record.variant!r}, model, data, config)"
            )
        if self.supernet is not None and record.kind is None:  # inherited, recalibrated
            evaluator = self.supernet()
            scored_on = records.result_facts(self.trials.get(record.trial)).get("supernet")
            if scored_on and scored_on != evaluator.digest:
                raise ExportError(
                    f"trial {record.trial} was scored on supernet weights {scored_on}, but the "
                    f"study's supernet is now {evaluator.digest} (it was trained again): its "
                    f"subnet would not have the recorded accuracy {record.accuracy}. See what it "
                    f"scores now with `autosearch rerun STUDY_FILE --trial {record.trial}`, or "
                    "search on: new trials are scored on the new weights"
                )
            return evaluator.subnet(record.arch)
        trial = self.trials.get(record.trial)
        artifact = records.weights_id(trial)
        if artifact is None:
            how = (
                " (it was looked up in a benchmark table, not trained)"
                if self.definition.table
                else ""
            )
            raise ExportError(f"trial {record.trial} stored no weights{how}")
        model = self.space.build(
            record.arch,
            input_shape=self.data.dataset.input_shape,
            num_classes=self.data.dataset.num_classes,
        )
        try:
            model.load_state_dict(
                self.artifacts.load_weights(
                    artifact, trial=record.trial, expected=records.weights_digest(trial)
                )
            )
        except RuntimeError as exc:  # tensors of other names or shapes
            first = (str(exc).strip().splitlines() or [""])[0]
            raise PlatformError(
                f"the stored weights of trial {record.trial} (artifact {artifact} in "
                f"{self.artifacts.location}) do not fit its network ({first}); restore them "
                "from a copy, or run the trial again"
            ) from None
        return model.eval()

    def export(self, record: Record, out_dir: str | Path, *, finetune_epochs: int = 0) -> Path:
        """Write an export folder (``autosearch.export``): ``model.py``, weights, ONNX
        (checked in onnxruntime), ``arch.json`` and a README.

        A variant record is derived again from its trial's stored weights, the same way
        and with the same seed and training config as when it was measured (``distill``
        takes the study's best model now as its teacher), and its accuracy is measured
        again; both the stored and the new figures are written. A subnet of a supernet
        study is exported with its inherited weights (recalibrated batch norm), fine-tuned
        for ``finetune_epochs`` first when asked (the study's training config at the
        compression's fine-tuning learning-rate scale); its architecture is written as one
        of the space the supernet is of, which ``autosearch train`` trains from scratch.
        """
        data = self.data.dataset
        base = record if record.is_base else self.trials.record(record.trial)
        model = self.load_model(base)
        metrics: dict[str, Any] = dict(record.metrics)
        plan = self.stored_plan(record)
        if finetune_epochs:
            model = self._finetuned(plan, model, finetune_epochs, metrics)
        derived = None
        if not record.is_base:
            if record.state != "complete":
                raise ExportError(
                    f"variant {record.variant} of trial {record.trial} failed "
                    f"({record.reason}); there is nothing to export"
                )
            mentor = self.teacher(base.metrics) if record.variant == "distill" else None
            derived = derive_variant(plan, record.variant, model, data, teacher=mentor)
            metrics["accuracy_exported"] = evaluate(derived.model, data.val, data)[0]
        return write_export(
            out_dir,
            arch=self.space.plain(record.arch),
            spec=self.space.network(
                record.arch, input_shape=data.input_shape, num_classes=data.num_classes
            ),
            model=model,
            description=record.description,
            input_shape=data.input_shape,
            mean=data.mean,
            std=data.std,
            metrics=metrics,
            provenance={"study": self.name, "trial": record.trial, "version": __version__},
            samples=data.normalize(data.val.take(torch.arange(min(64, len(data.val))))),
            variant=record.variant,
            derived=derived,
            training={
                "data": self.definition.data,
                "seed": self.definition.seed,
                "train": dataclasses.asdict(plan.config),
            },
        )

    def _finetuned(
        self, plan: TrialPlan, model: nn.Module, epochs: int, metrics: dict[str, Any]
    ) -> nn.Module:
        """``model`` trained ``epochs`` more with the study's recipe at the fine-tuning
        learning rate; its accuracy before and after go into ``metrics``."""
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise ConfigError(
                f"finetune_epochs={epochs!r} cannot be used: expected an integer >= 0"
            )
        data = self.data.dataset
        metrics["accuracy_inherited"] = evaluate(model, data.val, data)[0]
        config = dataclasses.replace(
            plan.config,
            epochs=epochs,
            lr=plan.config.lr * self.definition.compression.finetune_lr_scale,
        )
        train(model, data, config, seed=plan.seed)
        metrics["accuracy_finetuned"] = evaluate(model, data.val, data)[0]
        metrics["test_accuracy_finetuned"] = evaluate(model, data.test, data)[0]
        metrics["finetune_epochs"] = epochs
        return model.eval()

    def rerun(self, trial: int) -> dict[str, Any]:
        """Train trial ``trial``'s architecture again, from scratch, with its stored seed
        and the study's data and training config (nothing is stored), and compare; a
        trial trained as a population, by its winner's schedule replayed.

        Returns the stored and the new validation and test accuracy, whether they are
        identical, and what differs in the data hash and provenance (a different code
        version or package may explain a different result).
        """
        record = self.trials.record(trial)
        if record.state != "complete":
            raise StudyError(f"trial {trial} is {record.state}; only complete trials can be rerun")
        if self.supernet is not None and record.kind is None:
            return self._evaluate_again(record)
        if self.definition.table is not None:
            raise StudyError("a table study looks results up; there is no training to rerun")
        stored = self.trials.get(trial).user_attrs
        plan = dataclasses.replace(self.stored_plan(record), work=None)
        population = records.result_facts(self.trials.get(trial)).get("population") or {}
        with tempfile.TemporaryDirectory(prefix="autosearch-rerun-") as work:
            if population:  # trained as a population: its winner's schedule, replayed
                trainer = schedule_trainer(population["schedule"])
                plan = dataclasses.replace(plan, trainer=trainer, work=Path(work))
            if self.definition.evaluator:  # the user's evaluator trains it, as it did
                if plan.evaluator is None:
                    raise StudyError(
                        f"trial {trial} was trained by evaluator {self.definition.evaluator}: "
                        "open the study with it (load_study(..., evaluator=...)) to rerun"
                    )
                again = run_trial(plan, self.data.dataset).base.metrics
            else:
                again = train_candidate(plan, self.data.dataset).metrics
        then, now = stored.get("provenance") or {}, provenance()
        changed = {
            key: {"stored": then.get(key), "now": now.get(key)}
            for key in ("code", "packages", "python")
            if then and then.get(key) != now.get(key)
        }
        accuracies = ("accuracy", "test_accuracy")
        return {
            "trial": trial,
            "description": record.description,
            "seed": plan.seed,
            "stored": {k: record.metrics.get(k) for k in accuracies},
            "rerun": {k: again.get(k) for k in accuracies},
            "identical": all(again.get(k) == record.metrics.get(k) for k in accuracies),
            "data_hash": {"stored": stored.get("data_hash"), "now": self.data.hash},
            "provenance_changed": changed,
        }

    def _evaluate_again(self, record: Record) -> dict[str, Any]:
        """A supernet trial's rerun: its subnet evaluated again on the study's supernet (its
        training is the supernet's), saying whether the supernet's weights are still the
        ones that scored it."""
        assert self.supernet is not None
        evaluator = self.supernet()
        stored = self.trials.get(record.trial).user_attrs
        _, again = evaluator.evaluate(record.arch)
        scored_on = records.result_facts(self.trials.get(record.trial)).get("supernet")
        accuracies = ("accuracy", "test_accuracy")
        return {
            "trial": record.trial,
            "description": record.description,
            "seed": self.definition.seed,
            "evaluated_by": "supernet",
            "stored": {k: record.metrics.get(k) for k in accuracies},
            "rerun": {k: again.get(k) for k in accuracies},
            "identical": all(again.get(k) == record.metrics.get(k) for k in accuracies),
            "supernet": {"stored": scored_on, "now": evaluator.digest},
            "data_hash": {"stored": stored.get("data_hash"), "now": self.data.hash},
            "provenance_changed": {},
        }
