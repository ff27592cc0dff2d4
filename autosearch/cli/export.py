"""``autosearch export``: write a stored trial's export folder (``model.py``, weights,
ONNX), and log it as an MLflow model where asked."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autosearch.cli._common import open_stored
from autosearch.errors import ConfigError
from autosearch.tracking import Tracking


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
