"""``autosearch population``: train a study's architecture (its best, or a trial's) as a
population, its learning rate adapted while it trains, as one trial of the study
(autosearch.population.trial). Several of these commands on one study train the
same population together; a cut run resumes where it stopped."""

from __future__ import annotations

import argparse
import json
from typing import Any

from autosearch.population.rules import PopulationBasedTraining
from autosearch.study import default_storage, load_study
from autosearch.studyfile import load_spec

__all__ = ["cmd_population"]


def cmd_population(args: argparse.Namespace) -> int:
    spec = load_spec(args.study_file)
    url = args.storage or spec.storage or default_storage(spec.name)
    load_study(spec.name, storage=url, read_only=True)  # no such study: said, nothing made
    study = load_study(spec.name, storage=url)
    arch = study.record(args.trial).arch if args.trial is not None else study.best().arch
    population = PopulationBasedTraining.of_learning_rate(
        args.size, args.interval, study.definition.train.lr, seed=study.definition.seed
    )
    record = study.train_population(population, arch)
    if record is None:
        print(f"interrupted by {study.interrupted}; `autosearch population` again resumes it")
        return 130
    facts = study.trials.get(record.trial).user_attrs["result"].get("population") or {}
    summary: dict[str, Any] = {
        "study": study.name,
        "trial": record.trial,
        "state": record.state,
        "architecture": record.description,
        "accuracy": record.accuracy,
        "test_accuracy": record.test_accuracy,
        "winner": facts.get("winner"),
        "final": facts.get("final"),
        "schedule": facts.get("schedule"),
        "rounds": len(facts.get("rounds", [])),
    }
    if args.json:
        print(json.dumps(summary))
        return 0 if record.state == "complete" else 1
    if record.state != "complete":
        print(f"trial {record.trial} {record.state}: {record.reason}")
        return 1
    print(
        f"study {study.name}: trial {record.trial} trained {record.description} as a "
        f"population of {args.size} ({summary['rounds']} rounds); member {summary['winner']} "
        f"won: val acc {record.accuracy:.4f}, test acc {record.test_accuracy:.4f}"
    )
    for part in summary["schedule"] or []:
        settings = ", ".join(f"{k} {v:.4g}" for k, v in part["settings"].items())
        print(f"  epochs {part['from']}-{part['to']}: {settings}")
    return 0
