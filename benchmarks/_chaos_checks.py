"""What benchmarks/chaos.py reads while it runs (which studies are done, what a worker
was doing when it was hit) and the invariants it checks when a round ends."""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from typing import Any

from optuna.trial import TrialState

import autosearch
from autosearch.study.jobs import companion_name
from autosearch.study.records import CONFIRMS, FAIL_REASON, FINISHED, result_facts, superseded
from autosearch.study.replay import stored_told
from autosearch.study.storage._urls import close_storage, open_storage
from autosearch.study.workers._heartbeat import WORKER

STUDIES = ("trained", "supernet")


def _searched(trials: list) -> list:
    """Search trials that count: finished, not superseded, not confirmations."""
    return [
        t
        for t in trials
        if t.state in FINISHED and not superseded(t) and CONFIRMS not in t.user_attrs
    ]


class Reader:
    """A reading connection to the round's storage (named, on PostgreSQL, so that cutting
    the workers' connections spares it)."""

    def __init__(self, url: str, settings: dict) -> None:
        if url.startswith("postgresql://"):
            url += "?application_name=chaos-reader"
        self.storage = open_storage(url, create=False, write=False)
        self.settings = settings

    def _trials(self, name: str) -> list:
        try:
            study_id = self.storage.get_study_id_from_name(name)
            return self.storage.get_all_trials(study_id, deepcopy=False)
        except KeyError:
            return []

    def done(self) -> dict[str, bool]:
        """Whether each study holds its trials."""
        return {
            name: len(_searched(self._trials(name))) >= self.settings[name]["n_trials"]
            for name in STUDIES
        }

    def phases(self) -> dict[int, str]:
        """What each process holding a trial or a job claim is doing, by pid (as the
        storage shows it); a process absent holds nothing (starting, claiming, between
        trials, or a pool's parent)."""
        found: dict[int, str] = {}
        epochs = self.settings["trained"]["epochs"]
        for name in STUDIES:
            for t in self._trials(name):
                if t.state != TrialState.RUNNING:
                    continue
                if name == "supernet":
                    phase = "evaluating a subnet"
                elif len(t.intermediate_values) < epochs:
                    phase = "training"
                else:
                    phase = "after training (variants, storing)"
                found[_pid(t.user_attrs.get("worker", t.system_attrs.get(WORKER)))] = phase
            for t in self._trials(companion_name(name)):
                if t.state == TrialState.RUNNING:
                    job = str(t.user_attrs.get("job", ""))
                    phase = "measuring the front" if job.startswith("measure:") else "supernet job"
                    found[_pid(t.system_attrs.get(WORKER))] = phase
        return found

    def close(self) -> None:
        close_storage(self.storage)


def _pid(worker: object) -> int:
    """The pid of a worker id (host:pid); -1 when it is not one."""
    text = str(worker).rpartition(":")[2]
    return int(text) if text.isdigit() else -1


def check(url: str, settings: dict, recovered: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The invariants of a round, each ``{"held": bool, "detail": str}``."""
    results = {
        "recovery runs finished (exit 0)": _held(recovered, all(c == 0 for c in recovered.values()))
    }
    storage = open_storage(url, create=False, write=False)
    try:
        for name in STUDIES:
            study_id = storage.get_study_id_from_name(name)
            trials = storage.get_all_trials(study_id, deepcopy=False)
            jobs = storage.get_all_trials(
                storage.get_study_id_from_name(companion_name(name)), deepcopy=False
            )
            for label, (held, detail) in _storage_checks(name, trials, jobs, settings).items():
                results[f"{name}: {label}"] = {"held": held, "detail": detail}
            told = stored_told(storage, study_id)
            searched = {t.number for t in _searched(trials)}
            results[f"{name}: the saved controller was told only stored results"] = {
                "held": told <= searched,
                "detail": f"told beyond the results: {sorted(told - searched)[:10]}",
            }
    finally:
        close_storage(storage)
    for name in STUDIES:
        for label, (held, detail) in _study_checks(name, url).items():
            results[f"{name}: {label}"] = {"held": held, "detail": detail}
    return results


def _held(value: Any, held: bool) -> dict[str, Any]:
    return {"held": bool(held), "detail": str(value)}


def _storage_checks(name: str, trials: list, jobs: list, settings: dict) -> dict:
    searched = _searched(trials)
    complete = [t for t in searched if t.state == TrialState.COMPLETE]
    twice = [a for a, n in Counter(t.user_attrs.get("arch_id") for t in complete).items() if n > 1]
    silent = [
        t.number
        for t in trials
        if t.state == TrialState.FAIL and not (t.user_attrs.get(FAIL_REASON) or superseded(t))
    ]
    running = [t.number for t in trials if t.state == TrialState.RUNNING]
    running_jobs = [t.user_attrs.get("job") for t in jobs if t.state == TrialState.RUNNING]
    checks = {
        "each architecture complete at most once": (not twice, f"twice: {twice}"),
        "every failed trial says why": (not silent, f"without a reason: {silent}"),
        "no running trial or claim left": (
            not running and not running_jobs,
            f"running trials {running}, job claims {running_jobs}",
        ),
        "n_trials exact": (
            len(searched) == settings[name]["n_trials"],
            f"{len(searched)} of {settings[name]['n_trials']}",
        ),
    }
    if name == "supernet":
        digests = {result_facts(t).get("supernet") for t in complete}
        trained = [t.user_attrs.get("job") for t in jobs if t.state == TrialState.COMPLETE]
        trained = [j for j in trained if not str(j).startswith("measure:")]
        checks["one supernet digest, trained once"] = (
            len(digests) == 1 and None not in digests and len(trained) == 1,
            f"digests {sorted(map(str, digests))}, supernet jobs done {trained}",
        )
    return checks


def _study_checks(name: str, url: str) -> dict:
    """What a user reads back: figures, weights, an export, the controller's replay."""
    study = autosearch.load_study(name, storage=url)
    records = study.records()
    complete = [r for r in records if r.state == "complete"]
    bad = [
        (r.trial, r.variant)
        for r in complete
        if not all(math.isfinite(v) for v in r.metrics.values()) or "accuracy" not in r.metrics
    ]
    loaded, failed = 0, []
    for record in (r for r in complete if r.variant == "base"):
        try:
            study.load_model(record)
            loaded += 1
        except Exception as exc:  # what failed is the finding
            failed.append(f"{record.trial}: {type(exc).__name__}: {exc}"[:200])
    try:
        with tempfile.TemporaryDirectory() as out:
            study.export(study.best(), out)
        exported = "ok"
    except Exception as exc:
        exported = f"{type(exc).__name__}: {exc}"[:300]
    searched = {t.number for t in _searched(study.optuna_study.get_trials(deepcopy=False))}
    return {
        "figures readable": (
            not study.unreadable and not bad,
            f"unreadable {study.unreadable}, bad figures {bad}",
        ),
        "weights loadable, best exported": (
            not failed and exported == "ok",
            f"{loaded} loaded; failed {failed[:5]}; export: {exported}",
        ),
        "the controller replays exactly the stored results": (
            study.replay.told == searched,
            f"told {len(study.replay.told)}, stored {len(searched)}, "
            f"missing {sorted(searched - study.replay.told)[:10]}, "
            f"extra {sorted(study.replay.told - searched)[:10]}",
        ),
    }
