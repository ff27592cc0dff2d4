"""``autosearch status``: a stored study's trial counts and Pareto front (opened read-only)."""

from __future__ import annotations

import argparse
import json

from autosearch.cli._common import open_stored, table
from autosearch.cli.confirm import confirmations_table
from autosearch.study.overlays import figures, is_estimated


def cmd_status(args: argparse.Namespace) -> int:
    study = open_stored(args)
    records = study.records(variants=False)
    counts = {s: sum(r.state == s for r in records) for s in ("complete", "failed", "running")}
    if args.json:
        front = [
            {
                "trial": r.trial,
                "variant": r.variant,
                "description": r.description,
                "figures": figures(r),
                **r.metrics,
            }
            for r in study.pareto()
        ]
        status = {
            "study": study.name,
            "storage": study.storage_url,
            "space": study.space.name,
            "controller": study.controller.name,
            "objectives": list(study.definition.objectives),
            "trials": counts,
            "pareto": front,
            "unreadable": study.trials.unreadable,
            "confirmations": [
                c.to_json() for c in (study.supernet.confirmations() if study.supernet else [])
            ],
        }
        print(json.dumps(status, indent=2))
        return 0
    print(
        f"study {study.name} ({study.storage_url}): space {study.space.name}, controller "
        f"{study.controller.name}, objectives {', '.join(study.definition.objectives)}"
    )
    print(", ".join(f"{n} {s}" for s, n in counts.items()))
    for reason in study.trials.unreadable.values():
        print(f"left out, unreadable: {reason}")
    if counts["complete"]:
        points = study.pareto()
        print(
            "\nPareto front over every (architecture, variant) (FLOPs = 2 x MACs per "
            "image; latency: ms per image, batch 1, one CPU thread):\n" + table(points)
        )
        estimated = sum(is_estimated(r) for r in points)
        if estimated:
            print(
                f"{estimated} point(s) of the front show estimates, not measurements: "
                "`autosearch run` on the study file (or study.pareto(measured=True)) measures them"
            )
    confirmed = study.supernet.confirmations() if study.supernet else []
    if confirmed:
        print(
            "\nSubnets of the supernet confirmed by training (validation accuracy):\n"
            + confirmations_table(confirmed)
        )
    return 0
