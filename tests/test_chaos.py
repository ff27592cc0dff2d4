"""The chaos soak's short version: one round of benchmarks/chaos.py on SQLite with tiny
studies (a trained one, a supernet one, one trained in shards, and a population), its
workers killed, stopped and terminated at random and on purpose (the failpoints), their
checkpoint, shard and member files removed or cut short, then every invariant checked.
The long soak (every backend, 30 minutes each) is the benchmark's; its figures are in
benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_short_chaos_round_holds_every_invariant(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "chaos.py"),
            "--quick",
            "--backend",
            "sqlite",
            "--seed",
            "3",
            "--folder",
            str(tmp_path / "chaos"),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)["sqlite"]
    (round_,) = report["rounds_detail"]
    broken = {k: v["detail"] for k, v in round_["invariants"].items() if not v["held"]}
    assert not broken and report["held"], broken
    assert len(round_["invariants"]) >= 38  # every check ran, on every study
    damaged = [a for a in report["actions"] if " file " in a]
    assert damaged, report["actions"]  # checkpoint files removed or cut short
    signals = sum(n for action, n in report["actions"].items() if action.split(":")[0] in {
        "kill", "stop", "term", "failpoint end_trial.inside", "failpoint end_trial.after",
        "failpoint store.weights", "failpoint tell.before", "failpoint end_trial.before",
    })  # fmt: skip
    assert signals >= 1 and report["actions"]["workers started"] >= 4, report["actions"]
