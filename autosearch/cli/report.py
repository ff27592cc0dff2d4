"""``autosearch report``: write a stored study's HTML report (opened read-only)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autosearch.cli._common import open_stored
from autosearch.report import write_report


def cmd_report(args: argparse.Namespace) -> int:
    study = open_stored(args)
    path = write_report(
        study, Path(args.out) if args.out else Path("runs") / study.name / "report.html"
    )
    print(json.dumps({"report": str(path), "bytes": path.stat().st_size}) if args.json else path)
    return 0
