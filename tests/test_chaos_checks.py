"""Every invariant of the chaos soak (benchmarks/_chaos_checks.py) fails on a damage of
its own, made on a finished store: a check that cannot fail would pass a broken store.
The store is made once (the soak's studies, a population of the trained one's best, no
chaos); every invariant holds on it, and each damage, made on a copy, breaks its own."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import _chaos_checks as checks  # noqa: E402
import chaos  # noqa: E402

SETTINGS = {k: chaos.SETTINGS["quick"][k] for k in ("trained", "supernet", "population")}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """The soak's trained and supernet studies, and a population, finished in peace."""
    folder = tmp_path_factory.mktemp("finished")
    url = f"sqlite:///{folder}/study.db"
    cli = str(Path(sys.executable).with_name("autosearch"))
    for name, template in (("trained", chaos.TRAINED), ("supernet", chaos.SUPERNET)):
        file = folder / f"{name}.py"
        artifacts = str(folder / "artifacts" / name)
        file.write_text(template.format(storage=url, artifacts=artifacts, **SETTINGS[name]))
        done = subprocess.run([cli, "run", str(file), "--no-export"], cwd=folder,
                              capture_output=True, text=True, timeout=1800)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    size, interval = SETTINGS["population"]["size"], SETTINGS["population"]["interval"]
    done = subprocess.run(
        [cli, "population", str(folder / "trained.py"), "--size", str(size),
         "--interval", str(interval)],
        cwd=folder, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def _copy(store: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    # The copy's own artifacts folders, where the studies store the original's path.
    _sql(copy, "UPDATE study_user_attributes SET value_json = replace(value_json, ?, ?)",
         str(store), str(copy))  # fmt: skip
    return copy


def _sql(folder: Path, statement: str, *values) -> list:
    with sqlite3.connect(folder / "study.db") as db:
        return db.execute(statement, values).fetchall()


def _trial(folder: Path, study: str, where: str = "state = 'COMPLETE'") -> int:
    """The id of the first trial of ``study`` that matches ``where``."""
    (row,) = _sql(
        folder,
        f"SELECT trial_id FROM trials JOIN studies USING (study_id) WHERE study_name = ? "
        f"AND {where} ORDER BY number LIMIT 1",
        study,
    )
    return int(row[0])


def _attr(folder: Path, trial_id: int, key: str) -> object:
    (row,) = _sql(folder, "SELECT value_json FROM trial_user_attributes WHERE trial_id = ? AND "
                  "key = ?", trial_id, key)  # fmt: skip
    return json.loads(row[0])


def _set_attr(folder: Path, trial_id: int, key: str, value: object) -> None:
    _sql(folder, "DELETE FROM trial_user_attributes WHERE trial_id = ? AND key = ?", trial_id, key)
    _sql(folder, "INSERT INTO trial_user_attributes (trial_id, key, value_json) VALUES (?, ?, ?)",
         trial_id, key, json.dumps(value))  # fmt: skip


def _optuna(folder: Path, study: str):
    import optuna

    return optuna.load_study(study_name=study, storage=f"sqlite:///{folder}/study.db")


# Damages -------------------------------------------------------------------------------


def _complete_twice(folder: Path) -> None:
    study = _optuna(folder, "trained")
    study.add_trial(next(t for t in study.trials if t.state.name == "COMPLETE"))


def _failed_silently(folder: Path) -> None:
    import optuna

    _optuna(folder, "trained").add_trial(
        optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL)
    )


def _complete_turned_failed(folder: Path) -> None:
    trial = _trial(folder, "trained")
    _sql(folder, "UPDATE trials SET state = 'FAIL' WHERE trial_id = ?", trial)
    _set_attr(folder, trial, "fail_reason", "RuntimeError: made up")


def _complete_copy_superseded(folder: Path) -> None:
    study = _optuna(folder, "trained")
    trial = next(t for t in study.trials if t.state.name == "COMPLETE")
    trial.user_attrs["superseded"] = "a copy"
    study.add_trial(trial)


def _waiting(folder: Path) -> None:
    _optuna(folder, "trained").enqueue_trial({})


def _one_more(folder: Path) -> None:
    study = _optuna(folder, "trained")
    trial = next(t for t in study.trials if t.state.name == "COMPLETE")
    trial.user_attrs["arch_id"] = "0" * 16
    study.add_trial(trial)


def _accuracy_changed(folder: Path) -> None:
    _sql(folder, "UPDATE trial_values SET value = value + 0.125 WHERE trial_id = ? AND "
         "objective = 0", _trial(folder, "trained"))  # fmt: skip


def _saved_state(folder: Path, study: str = "trained") -> dict:
    (row,) = _sql(
        folder,
        "SELECT value_json FROM study_system_attributes JOIN studies USING (study_id) "
        "WHERE study_name = ? AND key = 'autosearch:controller'",
        study,
    )
    return json.loads(row[0])


def _write_state(folder: Path, state: dict, study: str = "trained") -> None:
    _sql(folder, "UPDATE study_system_attributes SET value_json = ? WHERE key = "
         "'autosearch:controller' AND study_id = (SELECT study_id FROM studies WHERE "
         "study_name = ?)", json.dumps(state), study)  # fmt: skip


def _told_beyond(folder: Path) -> None:
    from autosearch.study import replay

    state = _saved_state(folder)
    population = _trial(folder, "trained", "trial_id IN (SELECT trial_id FROM "
                        "trial_user_attributes WHERE key = 'population_key')")  # fmt: skip
    ((number,),) = _sql(folder, "SELECT number FROM trials WHERE trial_id = ?", population)
    state["told"].append([number, number])  # a trial that is no search result
    state[replay.DIGEST] = replay._digest(state)  # a whole state, wrongly told
    _write_state(folder, state)


def _state_deleted(folder: Path) -> None:
    _sql(folder, "DELETE FROM study_system_attributes WHERE key = 'autosearch:controller'")


def _state_cut_short(folder: Path) -> None:
    state = _saved_state(folder)
    state["told"] = state["told"][:-1] or [[0, 0]]
    _write_state(folder, state)


def _other_supernet(folder: Path) -> None:
    trial = _trial(folder, "supernet")
    result = _attr(folder, trial, "result")
    result["supernet"] = "f" * 16
    _set_attr(folder, trial, "result", result)


def _population_member_short(folder: Path) -> None:
    trial = _trial(folder, "trained", "trial_id IN (SELECT trial_id FROM trial_user_attributes "
                   "WHERE key = 'population_key')")  # fmt: skip
    result = _attr(folder, trial, "result")
    result["population"]["members"][0]["scores"] = {}
    _set_attr(folder, trial, "result", result)


def _result_garbled(folder: Path) -> None:
    _set_attr(folder, _trial(folder, "trained"), "result", "not a result")


def _weights_zeroed(folder: Path) -> None:
    from autosearch.study.records import RESULT

    weights = _attr(folder, _trial(folder, "trained"), RESULT)["weights"]
    (path,) = (folder / "artifacts").rglob(weights)
    data = bytearray(path.read_bytes())
    middle = (8 + int.from_bytes(data[:8], "little") + len(data)) // 2
    data[middle : middle + 64] = bytes(64)
    path.write_bytes(bytes(data))


def _arch_unreadable(folder: Path) -> None:
    """A complete trial stored after the controller's last save (not in its told), whose
    architecture no longer reads: no replay can tell it."""
    from autosearch.study import replay

    trial = _trial(folder, "trained")
    _set_attr(folder, trial, "arch", "{not json")
    ((number,),) = _sql(folder, "SELECT number FROM trials WHERE trial_id = ?", trial)
    state = _saved_state(folder)
    told = replay._numbers(state["told"], below=10**6) - {number}
    state["told"] = replay._runs(told)
    state[replay.DIGEST] = replay._digest(state)
    _write_state(folder, state)


DAMAGES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "each architecture complete at most once": ("trained", _complete_twice),
    "every failed trial says why": ("trained", _failed_silently),
    "only given-up attempts failed": ("trained", _complete_turned_failed),
    "every superseded trial is failed": ("trained", _complete_copy_superseded),
    "no unfinished trial or claim left": ("trained", _waiting),
    "n_trials exact": ("trained", _one_more),
    "complete trials' values are their results'": ("trained", _accuracy_changed),
    "the saved controller was told only stored results": ("trained", _told_beyond),
    "one supernet digest, trained once": ("supernet", _other_supernet),
    "the population trained once, every member whole": ("trained", _population_member_short),
    "figures readable": ("trained", _result_garbled),
    "weights loadable, best exported": ("trained", _weights_zeroed),
    "the controller replays exactly the stored results": ("trained", _arch_unreadable),
    "the controller's saved state is whole": ("trained", _state_deleted),
}


def test_every_invariant_has_a_damage_here():
    assert set(DAMAGES) == set(checks.STORED) | set(checks.READ)


def test_every_invariant_holds_on_the_finished_store(store):
    results = checks.check(f"sqlite:///{store}/study.db", SETTINGS, {"trained": 0})
    broken = {k: v["detail"] for k, v in results.items() if not v["held"]}
    assert not broken and len(results) == 1 + 2 * (len(checks.STORED) + len(checks.READ)) - 2


@pytest.mark.parametrize("label", sorted(DAMAGES))
def test_each_damage_breaks_its_invariant(store, tmp_path, label):
    study, damage = DAMAGES[label]
    copy = _copy(store, tmp_path)
    damage(copy)
    settings = {study: SETTINGS[study], "population": SETTINGS["population"]}
    results = checks.check(f"sqlite:///{copy}/study.db", settings, {}, only={label})
    assert not results[f"{study}: {label}"]["held"], results


def test_a_controller_state_cut_short_is_not_whole(store, tmp_path):
    copy = _copy(store, tmp_path)
    _state_cut_short(copy)
    label = "the controller's saved state is whole"
    results = checks.check(f"sqlite:///{copy}/study.db", {"trained": SETTINGS["trained"]}, {},
                           only={label})  # fmt: skip
    assert not results[f"trained: {label}"]["held"]
    assert "digest differs" in results[f"trained: {label}"]["detail"]


def test_a_recovery_run_that_failed_is_said(store):
    results = checks.check(f"sqlite:///{store}/study.db", SETTINGS, {"trained": 0, "supernet": 1},
                           only={checks.RECOVERED})  # fmt: skip
    assert results == {checks.RECOVERED: {"held": False, "detail": "{'trained': 0, 'supernet': 1}"}}
