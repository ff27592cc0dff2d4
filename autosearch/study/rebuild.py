"""A stored trial rebuilt: its trained network loaded, or exported (a variant derived
again from the trial's weights), or its training rerun from scratch to check that it
reproduces.

Export and rerun use the plan the trial was evaluated with (autosearch.runner.TrialPlan): the
candidate's own training settings and the seed the trial stored.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from autosearch._provenance import provenance
from autosearch._version import __version__
from autosearch.errors import ConfigError, ExportError, PlatformError, StudyError
from autosearch.export import write_export
from autosearch.runner import TrialPlan, derive_variant, train_candidate
from autosearch.study import records
from autosearch.study.loop import teacher
from autosearch.study.records import Record
from autosearch.train import evaluate, train

if TYPE_CHECKING:
    from autosearch.study.study import Study

__all__ = ["export", "load_model", "rerun", "stored_plan"]


def stored_plan(study: Study, record: Record) -> TrialPlan:
    """How ``record``'s trial was evaluated: with the seed it stored."""
    stored = study.optuna_trial(record.trial).user_attrs.get("seed")
    seed = int(stored) if stored is not None else None
    return study.plan(record.arch, number=record.trial, seed=seed)


def load_model(study: Study, record: Record) -> nn.Module:
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
    if study.supernet is not None:  # inherited again from the supernet, recalibrated
        evaluator = study.supernet_evaluator
        scored_on = records.result_facts(study.optuna_trial(record.trial)).get("supernet")
        if scored_on and scored_on != evaluator.digest:
            raise ExportError(
                f"trial {record.trial} was scored on supernet weights {scored_on}, but the "
                f"study's supernet is now {evaluator.digest} (it was trained again): its "
                f"subnet would not have the recorded accuracy {record.accuracy}. See what it "
                f"scores now with `autosearch rerun STUDY_FILE --trial {record.trial}`, or "
                "search on: new trials are scored on the new weights"
            )
        return evaluator.subnet(record.arch)
    artifact = records.weights_id(study.optuna_trial(record.trial))
    if artifact is None:
        how = " (it was looked up in a benchmark table, not trained)" if study.table else ""
        raise ExportError(f"trial {record.trial} stored no weights{how}")
    model = study.space.build(
        record.arch, input_shape=study.data.input_shape, num_classes=study.data.num_classes
    )
    try:
        model.load_state_dict(study.artifacts.load_weights(artifact, trial=record.trial))
    except RuntimeError as exc:  # tensors of other names or shapes
        first = (str(exc).strip().splitlines() or [""])[0]
        raise PlatformError(
            f"the stored weights of trial {record.trial} (artifact {artifact} in "
            f"{study.artifacts.location}) do not fit its network ({first}); restore them "
            "from a copy, or run the trial again"
        ) from None
    return model.eval()


def export(study: Study, record: Record, out_dir: str | Path, *, finetune_epochs: int = 0) -> Path:
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
    data = study.data
    base = record if record.is_base else study.record(record.trial)
    model = study.load_model(base)
    metrics: dict[str, Any] = dict(record.metrics)
    plan = stored_plan(study, record)
    if finetune_epochs:
        model = _finetuned(study, plan, model, finetune_epochs, metrics)
    derived = None
    if not record.is_base:
        if record.state != "complete":
            raise ExportError(
                f"variant {record.variant} of trial {record.trial} failed "
                f"({record.reason}); there is nothing to export"
            )
        mentor = teacher(study, base.metrics) if record.variant == "distill" else None
        derived = derive_variant(plan, record.variant, model, data, teacher=mentor)
        metrics["accuracy_exported"] = evaluate(derived.model, data.val, data)[0]
    return write_export(
        out_dir,
        arch=study.space.plain(record.arch),
        spec=study.space.network(
            record.arch, input_shape=data.input_shape, num_classes=data.num_classes
        ),
        model=model,
        description=record.description,
        input_shape=data.input_shape,
        mean=data.mean,
        std=data.std,
        metrics=metrics,
        provenance={"study": study.name, "trial": record.trial, "version": __version__},
        samples=data.normalize(data.val.take(torch.arange(min(64, len(data.val))))),
        variant=record.variant,
        derived=derived,
        training={
            "data": study.definition.data,
            "seed": study.seed,
            "train": dataclasses.asdict(plan.config),
        },
    )


def _finetuned(
    study: Study, plan: TrialPlan, model: nn.Module, epochs: int, metrics: dict[str, Any]
) -> nn.Module:
    """``model`` trained ``epochs`` more with the study's recipe at the fine-tuning
    learning rate; its accuracy before and after go into ``metrics``."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ConfigError(f"finetune_epochs={epochs!r} cannot be used: expected an integer >= 0")
    data = study.data
    metrics["accuracy_inherited"] = evaluate(model, data.val, data)[0]
    config = dataclasses.replace(
        plan.config, epochs=epochs, lr=plan.config.lr * study.compression.finetune_lr_scale
    )
    train(model, data, config, seed=plan.seed)
    metrics["accuracy_finetuned"] = evaluate(model, data.val, data)[0]
    metrics["test_accuracy_finetuned"] = evaluate(model, data.test, data)[0]
    metrics["finetune_epochs"] = epochs
    return model.eval()


def rerun(study: Study, trial: int) -> dict[str, Any]:
    """Train trial ``trial``'s architecture again, from scratch, with its stored seed
    and the study's data and training config (nothing is stored), and compare.

    Returns the stored and the new validation and test accuracy, whether they are
    identical, and what differs in the data hash and provenance (a different code
    version or package may explain a different result).
    """
    record = study.record(trial)
    if record.state != "complete":
        raise StudyError(f"trial {trial} is {record.state}; only complete trials can be rerun")
    if study.supernet is not None:
        return _evaluate_again(study, record)
    if study.table is not None:
        raise StudyError("a table study looks results up; there is no training to rerun")
    stored = study.optuna_trial(trial).user_attrs
    plan = dataclasses.replace(stored_plan(study, record), work=None)
    again = train_candidate(plan, study.data).metrics
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
        "data_hash": {"stored": stored.get("data_hash"), "now": study.data_hash},
        "provenance_changed": changed,
    }


def _evaluate_again(study: Study, record: Record) -> dict[str, Any]:
    """A supernet trial's rerun: its subnet evaluated again on the study's supernet (its
    training is the supernet's), saying whether the supernet's weights are still the
    ones that scored it."""
    evaluator = study.supernet_evaluator
    stored = study.optuna_trial(record.trial).user_attrs
    _, again = evaluator.evaluate(record.arch)
    scored_on = records.result_facts(study.optuna_trial(record.trial)).get("supernet")
    accuracies = ("accuracy", "test_accuracy")
    return {
        "trial": record.trial,
        "description": record.description,
        "seed": study.seed,
        "evaluated_by": "supernet",
        "stored": {k: record.metrics.get(k) for k in accuracies},
        "rerun": {k: again.get(k) for k in accuracies},
        "identical": all(again.get(k) == record.metrics.get(k) for k in accuracies),
        "supernet": {"stored": scored_on, "now": evaluator.digest},
        "data_hash": {"stored": stored.get("data_hash"), "now": study.data_hash},
        "provenance_changed": {},
    }
