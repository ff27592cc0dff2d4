"""The commands that read a stored study: ``status``, ``report``, ``export`` and
``rerun`` (opened read-only: nothing stored is created or changed), and the plain-text
table of records they print."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from autosearch.cli.confirm import confirmations_table
from autosearch.errors import ConfigError, StudyError
from autosearch.report import write_report
from autosearch.scoring.metrics import metric
from autosearch.study import Record, Study, default_storage, load_study
from autosearch.study.overlays import figures, is_estimated
from autosearch.studyfile import load_spec
from autosearch.tracking import Tracking

__all__ = ["cmd_export", "cmd_report", "cmd_rerun", "cmd_status", "open_stored", "table"]


_COLUMNS = ("accuracy", "test_accuracy", "flops", "params", "latency", "bytes")


def table(records: Sequence[Record]) -> str:
    """A plain-text table of records, in the units of autosearch.scoring.metrics (FLOPs are
    2 × MACs per image; latency ms per image at batch 1 on one CPU thread)."""
    head = ("trial", "architecture", "variant", *(metric(n).header for n in _COLUMNS), "figures")
    rows = [head]
    for r in records:
        cells = (metric(n).cell(r.metrics) for n in _COLUMNS)
        rows.append((str(r.trial), r.description, r.variant, *cells, figures(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i in (1, len(row) - 1) else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


def open_stored(args: argparse.Namespace) -> Study:
    """The study named by a study file or by --study (and --storage), opened to read:
    nothing in its storage is created or changed."""
    if args.study_file:
        spec = load_spec(args.study_file)
        url = args.storage or spec.storage or default_storage(spec.name)
        return load_study(spec.name, storage=url, read_only=True)
    if not args.study:
        raise StudyError("name the study: a study file (studies/digits_quick.py) or --study NAME")
    url = args.storage or default_storage(args.study)
    return load_study(args.study, storage=url, read_only=True)


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


def cmd_report(args: argparse.Namespace) -> int:
    study = open_stored(args)
    path = write_report(
        study, Path(args.out) if args.out else Path("runs") / study.name / "report.html"
    )
    print(json.dumps({"report": str(path), "bytes": path.stat().st_size}) if args.json else path)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.register is not None and not args.mlflow:
        raise ConfigError("--register NAME registers an MLflow model: add --mlflow")
    if args.register is not None:  # before the export's work
        from autosearch.tracking.mlflow_model import check_model_name

        check_model_name(args.register)
    if args.mlflow:  # a bad URI, or MLflow not installed, said before exporting
        Tracking.of(mlflow=args.mlflow)
    study = open_stored(args)
    if args.trial is not None:
        record = study.record(args.trial, args.variant or "base")
    else:
        record = study.best(max_flops=args.max_flops, variant=args.variant)
    out = study.export(
        record,
        Path(args.out) if args.out else Path("runs") / study.name / "export",
        finetune_epochs=args.finetune or 0,
    )
    card = json.loads((out / "arch.json").read_text())
    logged = None
    if args.mlflow:
        logged = study.log_model(out, mlflow=args.mlflow, register=args.register)
    if args.json:
        files = sorted(p.name for p in out.iterdir())
        mlflow = {"mlflow": {"model": logged.uri, "run": logged.run_id}} if logged else {}
        print(json.dumps({"folder": str(out), "files": files, **card, **mlflow}, indent=2))
        return 0
    print(
        f"exported trial {record.trial} ({record.description}), variant {record.variant}, "
        f"to {out}/: {', '.join(sorted(p.name for p in out.iterdir()))}\n"
        f"ONNX checked in onnxruntime: largest |difference| from torch "
        f"{card['onnx']['max_abs_diff']:.2g} on {card['onnx']['checked_images']} images"
    )
    if logged:
        print(f"MLflow model: {logged}")
    return 0


def cmd_rerun(args: argparse.Namespace) -> int:
    """Retrain a stored trial with its seed and compare with what was stored."""
    study = open_stored(args)
    outcome = study.rerun(args.trial)
    if args.json:
        print(json.dumps(outcome, indent=2))
    else:
        stored, again = outcome["stored"], outcome["rerun"]
        verdict = "reproduced exactly" if outcome["identical"] else "NOT reproduced"
        how = "evaluated again on the supernet" if "supernet" in outcome else "rerun"
        print(
            f"trial {args.trial} ({outcome['description']}), seed {outcome['seed']}: "
            f"stored {_accuracies(stored)}; {how} {_accuracies(again)}: {verdict}"
        )
        weights = outcome.get("supernet", {})
        if weights.get("stored") and weights["stored"] != weights["now"]:
            print(
                f"the supernet was trained again since the trial ran: its weights were "
                f"{weights['stored']}, now {weights['now']}"
            )
        if outcome["data_hash"]["stored"] != outcome["data_hash"]["now"]:
            print(f"the data differs from the stored data: {outcome['data_hash']}")
        for key, change in outcome["provenance_changed"].items():
            print(f"{key} changed since the trial ran: {change['stored']} -> {change['now']}")
    return 0 if outcome["identical"] else 1


def _accuracies(figures: dict[str, float | None]) -> str:
    return " ".join(
        f"{name} {figures[key]:.6f}"
        for key, name in (("accuracy", "val"), ("test_accuracy", "test"))
        if figures.get(key) is not None
    )
