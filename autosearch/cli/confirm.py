"""``autosearch confirm``: train the top ``k`` subnets of a supernet study's front from
scratch (or, with ``--ranker``, ``k`` chosen one after another by the ranker), as trials of
the study (autosearch.weight_sharing.confirm), and compare each subnet's inherited
accuracy with its confirmed one. Several of these commands on one study share
the subnets (each is trained once); a cut run resumes where it stopped."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from autosearch.errors import StudyError
from autosearch.population.rules import PopulationBasedTraining
from autosearch.study import Study, default_storage, load_study
from autosearch.study.study import WeightSharing
from autosearch.studyfile import load_spec
from autosearch.weight_sharing.confirm import Confirmation

__all__ = ["cmd_confirm", "confirmations_table"]


def confirmations_table(rows: Sequence[Confirmation]) -> str:
    """Inherited against confirmed validation accuracy, one subnet a line."""
    head = ("trial", "architecture", "MFLOPs", "inherited", "confirmed", "test", "by", "state")
    lines = [head]
    for c in rows:
        lines.append(
            (
                str(c.trial),
                c.description,
                f"{c.flops / 1e6:.2f}",
                f"{c.inherited:.4f}",
                "-" if c.confirmed is None else f"{c.confirmed:.4f}",
                "-" if c.confirmed_test is None else f"{c.confirmed_test:.4f}",
                "-" if c.confirmed_by is None else f"trial {c.confirmed_by}",
                c.state,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 1 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


def cmd_confirm(args: argparse.Namespace) -> int:
    spec = load_spec(args.study_file)
    if spec.supernet is None:
        raise StudyError(
            f"study file {args.study_file} defines no supernet (StudySpec(supernet=...)): its "
            "trials are trained already; there is nothing to confirm"
        )
    url = args.storage or spec.storage or default_storage(spec.name)
    load_study(spec.name, storage=url, read_only=True)  # no such study: said, nothing made
    study = load_study(spec.name, storage=url)
    population = None
    if args.population:  # the learning rate adapted within 1/10 to 10 times the study's
        population = PopulationBasedTraining.of_learning_rate(
            args.population,
            args.population_interval,
            study.definition.train.lr,
            seed=study.definition.seed,
        )
    supernet = _supernet(study)
    done = supernet.confirm(args.k, ranker=args.ranker or None, population=population)
    wanted = {r.confirms for r in done}
    rows = [c for c in supernet.confirmations() if c.trial in wanted]
    if args.json:
        print(json.dumps({"study": study.name, "confirmations": [c.to_json() for c in rows]}))
    else:
        print(
            f"study {study.name}: {len(done)} subnet(s) "
            + ("chosen by the ranker" if args.ranker else "of the supernet's front")
            + " confirmed by training from scratch (validation accuracy):\n"
            + confirmations_table(rows)
        )
    if study.interrupted:
        print(f"interrupted by {study.interrupted}; `autosearch confirm` again resumes it")
        return 130
    return 0


def _supernet(study: Study) -> WeightSharing:
    if study.supernet is None:
        raise StudyError(
            f"study {study.name!r} has no supernet: confirm trains a weight-sharing study's "
            "front (create the study with supernet=...)"
        )
    return study.supernet
