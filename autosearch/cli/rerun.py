"""``autosearch rerun``: train a stored trial again with its seed and compare."""

from __future__ import annotations

import argparse
import json

from autosearch.cli._common import accuracies, open_stored


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
            f"stored {accuracies(stored)}; {how} {accuracies(again)}: {verdict}"
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
