"""The garbage collector in autosearch's processes (autosearch/workers/_collection.py):
a command freezes what it loaded before its work starts, a pool's worker too; importing
autosearch in a user's process pauses collection while it loads and leaves the
collector, and every object's fate, as they were."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest

# Reads the collector's state as a study file is loaded, inside the command, then stops
# the command (before any trial): what the command froze, and whether what the study
# file itself makes is still collected.
_RECORDING_STUDY = """
import gc, json, sys, weakref

class Cycle:
    pass

cycle = Cycle()
cycle.me = cycle
alive = weakref.ref(cycle)
del cycle
gc.collect()
with open("state.json", "w") as out:
    json.dump({
        "enabled": gc.isenabled(),
        "frozen": gc.get_freeze_count(),
        "compiler": "torch._dynamo" in sys.modules,
        "cycle_collected": alive() is None,
    }, out)
raise SystemExit("recorded")
"""


def _state_in_command(tmp_path: Path, command: str) -> dict:
    (tmp_path / "s.py").write_text(_RECORDING_STUDY)
    cli = Path(sys.executable).with_name("autosearch")
    run = subprocess.run(
        [str(cli), command, "s.py"], cwd=tmp_path, capture_output=True, text=True, timeout=1800
    )
    assert run.returncode == 2 and "recorded" in run.stderr, run.stderr[-3000:]  # on purpose
    return json.loads((tmp_path / "state.json").read_text())


def test_a_command_that_trains_freezes_what_it_loaded_the_compiler_included(tmp_path):
    state = _state_in_command(tmp_path, "run")
    assert state["enabled"] and state["cycle_collected"]  # later garbage is collected
    assert state["frozen"] > 100_000 and state["compiler"]  # torch, its compiler, autosearch


def test_a_command_that_reads_freezes_what_it_loaded_without_the_compiler(tmp_path):
    state = _state_in_command(tmp_path, "status")
    assert state["enabled"] and state["cycle_collected"]
    assert state["frozen"] > 50_000 and not state["compiler"]


def test_a_command_called_in_a_users_process_freezes_nothing(tmp_path, monkeypatch):
    from autosearch.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(_RECORDING_STUDY)
    # Every freeze is seen as it is asked for. Not the frozen count: frozen objects that
    # reference counting frees lower it (a logging handler list replaced, say), so an
    # earlier test that froze in this process could make the same command read as if it
    # had unfrozen something.
    freeze, asked = gc.freeze, []
    monkeypatch.setattr(gc, "freeze", lambda: (asked.append("freeze"), freeze())[1])
    collecting = gc.isenabled()
    assert main(["status", "s.py"]) == 2  # the study file stops it, as in the others
    assert json.loads((tmp_path / "state.json").read_text())["cycle_collected"]
    assert asked == [] and gc.isenabled() == collecting


_IMPORTING = """
import gc, json, sys, weakref

class Cycle:
    pass

if sys.argv[1] == "disabled":
    gc.disable()
kept = [[i] for i in range(1000)]
if sys.argv[1] == "frozen":
    gc.freeze()
cycle = Cycle()
cycle.me = cycle
alive = weakref.ref(cycle)
del cycle  # garbage, left to the collector, when autosearch is imported
import autosearch
collected = {id(o) for o in gc.get_objects()}  # the frozen are in no generation
after = {
    "enabled": gc.isenabled(),
    "frozen": gc.get_freeze_count() > 0,
    "kept_frozen": not any(id(k) in collected for k in kept),
}
gc.collect()
after["cycle_collected"] = alive() is None
print(json.dumps(after))
"""


@pytest.mark.parametrize("collector", ["default", "disabled", "frozen"])
def test_importing_autosearch_leaves_a_users_collector_and_garbage_as_they_were(collector):
    """Collection is paused only while autosearch loads: the collector is on or off as
    the user left it, nothing of the user's is frozen or unfrozen, and garbage made
    before the import is collected by the next collection."""
    run = subprocess.run(
        [sys.executable, "-c", _IMPORTING, collector], capture_output=True, text=True,
        timeout=1800,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    frozen = collector == "frozen"  # by the user, and then only what the user froze
    assert json.loads(run.stdout) == {
        "enabled": collector != "disabled",
        "frozen": frozen,
        "kept_frozen": frozen,
        "cycle_collected": True,
    }
