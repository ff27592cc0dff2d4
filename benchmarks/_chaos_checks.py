"""What benchmarks/chaos.py reads while it runs (which studies are done, what a worker
was doing when it was hit) and the invariants it checks when a round ends.

Each invariant is a named check of what the storage holds (``STORED``, one study's
trials, job claims and saved controller state) or of what a user reads back
(``READ``: records, weights, an export, the controller's replay). Each one fails on a
damage of its own (tests/test_chaos_checks.py makes every damage on a finished store
and sees its invariant fail), so a check that cannot fail is found in the suite.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

import autosearch
from autosearch.storage._urls import close_storage, open_storage
from autosearch.study.jobs import companion_name
from autosearch.study.records import (
    CONFIRMS,
    FAIL_REASON,
    FINISHED,
    RESULT,
    VALUES_FROM,
    result_facts,
    superseded,
    trial_kind,
)
from autosearch.study.replay import stored_told
from autosearch.workers._heartbeat import WORKER

RECOVERED = "recovery runs finished (exit 0)"
OBJECTIVES = ("accuracy", "flops")  # every soak study's (the default)


def studies(settings: dict) -> tuple[str, ...]:
    """The round's studies: each one its settings name."""
    return tuple(name for name in ("trained", "supernet", "sharded") if name in settings)


def _searched(trials: list) -> list:
    """Search trials that count: finished, not superseded, not confirmations, nor of
    another kind (a population trained beside the search)."""
    return [
        t
        for t in trials
        if t.state in FINISHED
        and not superseded(t)
        and CONFIRMS not in t.user_attrs
        and trial_kind(t.user_attrs) is None
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
        """Whether each study holds its trials (and the trained study its population,
        where the round trains one)."""
        done = {
            name: len(_searched(self._trials(name))) >= self.settings[name]["n_trials"]
            for name in studies(self.settings)
        }
        if "population" in self.settings:
            done["population"] = bool(self.populations("trained"))
        return done

    def populations(self, name: str) -> list:
        """The complete population trials of study ``name``."""
        return [
            t
            for t in self._trials(name)
            if t.state == TrialState.COMPLETE
            and str(trial_kind(t.user_attrs)).startswith("population:")
        ]

    def phases(self) -> dict[int, str]:
        """What each process holding a trial or a job claim is doing, by pid (as the
        storage shows it); a process absent holds nothing (starting, claiming, between
        trials, or a pool's parent)."""
        found: dict[int, str] = {}
        for name in studies(self.settings):
            epochs = self.settings[name]["epochs"]
            for t in self._trials(name):
                if t.state != TrialState.RUNNING:
                    continue
                if name == "supernet":
                    phase = "evaluating a subnet"
                elif trial_kind(t.user_attrs) is not None:
                    phase = "training a population"
                elif len(t.intermediate_values) < epochs:
                    phase = "training" if name == "trained" else "training in shards"
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


@dataclass(frozen=True)
class Stored:
    """What the storage holds of one study."""

    name: str
    trials: list[FrozenTrial]
    jobs: list[FrozenTrial]
    told: set[int]
    settings: dict

    @property
    def searched(self) -> list[FrozenTrial]:
        return _searched(self.trials)


Verdict = tuple[bool, str]


def _once(stored: Stored) -> Verdict:
    complete = [t for t in stored.searched if t.state == TrialState.COMPLETE]
    twice = [a for a, n in Counter(t.user_attrs.get("arch_id") for t in complete).items() if n > 1]
    return not twice, f"twice: {twice}"


def _failed_say_why(stored: Stored) -> Verdict:
    silent = [
        t.number
        for t in stored.trials
        if t.state == TrialState.FAIL and not (t.user_attrs.get(FAIL_REASON) or superseded(t))
    ]
    return not silent, f"without a reason: {silent}"


def _only_attempts_failed(stored: Stored) -> Verdict:
    """The soak's candidates train without fault: a failed trial is an attempt given up
    (superseded: its worker died, or was stopped), never a result lost as a failure."""
    lost = [t.number for t in stored.trials if t.state == TrialState.FAIL and not superseded(t)]
    return not lost, f"failed, not superseded: {lost}"


def _superseded_are_failed(stored: Stored) -> Verdict:
    wrong = [t.number for t in stored.trials if superseded(t) and t.state != TrialState.FAIL]
    return not wrong, f"superseded, not failed: {wrong}"


def _nothing_left_running(stored: Stored) -> Verdict:
    left = [t.number for t in stored.trials if not t.state.is_finished()]
    jobs = [t.user_attrs.get("job") for t in stored.jobs if not t.state.is_finished()]
    return not left and not jobs, f"unfinished trials {left}, job claims {jobs}"


def _n_trials(stored: Stored) -> Verdict:
    wanted = stored.settings[stored.name]["n_trials"]
    return len(stored.searched) == wanted, f"{len(stored.searched)} of {wanted}"


def _values_are_results(stored: Stored) -> Verdict:
    """A complete trial's objective values are those of its stored result's point they
    came from (stored in one transaction)."""
    objectives = OBJECTIVES
    wrong = []
    for t in (t for t in stored.trials if t.state == TrialState.COMPLETE):
        result = t.user_attrs.get(RESULT) or {}
        points = {p.get("variant"): p.get("metrics") for p in result.get("points", [])}
        metrics = points.get(t.user_attrs.get(VALUES_FROM)) or {}
        expected = [metrics.get(o) for o in objectives]
        if t.values is None or [float(v) for v in t.values] != expected:
            wrong.append(t.number)
    return not wrong, f"values not their result's: {wrong}"


def _told_only_stored(stored: Stored) -> Verdict:
    searched = {t.number for t in stored.searched}
    return (
        stored.told <= searched,
        f"told beyond the results: {sorted(stored.told - searched)[:10]}",
    )


def _one_supernet(stored: Stored) -> Verdict:
    complete = [t for t in stored.searched if t.state == TrialState.COMPLETE]
    digests = {result_facts(t).get("supernet") for t in complete}
    trained = [t.user_attrs.get("job") for t in stored.jobs if t.state == TrialState.COMPLETE]
    trained = [j for j in trained if not str(j).startswith("measure:")]
    held = len(digests) == 1 and None not in digests and len(trained) == 1
    return held, f"digests {sorted(map(str, digests))}, supernet jobs done {trained}"


def _one_population(stored: Stored) -> Verdict:
    """The population asked for is one complete trial, whose record holds every member
    at its last epoch."""
    trials = [t for t in stored.trials if str(trial_kind(t.user_attrs)).startswith("population:")]
    complete = [t for t in trials if t.state == TrialState.COMPLETE and not superseded(t)]
    if len(complete) != 1:
        return False, f"{len(complete)} complete population trials of {len(trials)}"
    facts = (complete[0].user_attrs.get(RESULT) or {}).get("population") or {}
    epochs = stored.settings["trained"]["epochs"]
    members = facts.get("members") or []
    short = [m.get("id") for m in members if str(epochs) not in (m.get("scores") or {})]
    size = stored.settings["population"]["size"]
    held = len(members) == size and not short and facts.get("winner") in range(size)
    return held, f"members {len(members)} of {size}, short of epoch {epochs}: {short}"


# label -> (the studies it applies to, None: all; the check)
STORED: dict[str, tuple[Collection[str] | None, Callable[[Stored], Verdict]]] = {
    "each architecture complete at most once": (None, _once),
    "every failed trial says why": (None, _failed_say_why),
    "only given-up attempts failed": (None, _only_attempts_failed),
    "every superseded trial is failed": (None, _superseded_are_failed),
    "no unfinished trial or claim left": (None, _nothing_left_running),
    "n_trials exact": (None, _n_trials),
    "complete trials' values are their results'": (None, _values_are_results),
    "the saved controller was told only stored results": (None, _told_only_stored),
    "one supernet digest, trained once": (("supernet",), _one_supernet),
    "the population trained once, every member whole": (("trained",), _one_population),
}


def _figures_readable(study: autosearch.Study) -> Verdict:
    complete = [r for r in study.records() if r.state == "complete"]
    bad = [
        (r.trial, r.variant)
        for r in complete
        if not all(math.isfinite(v) for v in r.metrics.values()) or "accuracy" not in r.metrics
    ]
    return (
        not study.trials.unreadable and not bad,
        f"unreadable {study.trials.unreadable}, bad figures {bad}",
    )


def _weights_loadable(study: autosearch.Study) -> Verdict:
    complete = [r for r in study.records() if r.state == "complete" and r.variant == "base"]
    loaded, failed = 0, []
    for record in complete:
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
    held = not failed and exported == "ok"
    return held, f"{loaded} loaded; failed {failed[:5]}; export: {exported}"


def _replays_stored(study: autosearch.Study) -> Verdict:
    searched = {t.number for t in _searched(study.optuna_study.get_trials(deepcopy=False))}
    told = study._replay.told
    return told == searched, (
        f"told {len(told)}, stored {len(searched)}, missing {sorted(searched - told)[:10]}, "
        f"extra {sorted(told - searched)[:10]}"
    )


def _saved_state_whole(study: autosearch.Study) -> Verdict:
    """The controller saved its state after each result it was told: it is there, this
    controller's, and reads as it was saved (its digest)."""
    return study._replay.restored == "saved", f"the saved state: {study._replay.restored}"


READ: dict[str, Callable[[autosearch.Study], Verdict]] = {
    "figures readable": _figures_readable,
    "weights loadable, best exported": _weights_loadable,
    "the controller replays exactly the stored results": _replays_stored,
    "the controller's saved state is whole": _saved_state_whole,
}


def check(
    url: str, settings: dict, recovered: dict[str, int], *, only: Collection[str] | None = None
) -> dict[str, dict[str, Any]]:
    """The invariants of a round, each ``{"held": bool, "detail": str}`` under
    ``STUDY: LABEL`` (``only``: these labels, unprefixed; all where None)."""

    def wanted(label: str) -> bool:
        return only is None or label in only

    results: dict[str, dict[str, Any]] = {}
    if wanted(RECOVERED):
        results[RECOVERED] = _verdict(all(c == 0 for c in recovered.values()), str(recovered))
    storage = open_storage(url, create=False, write=False)
    try:
        for name in studies(settings):
            study_id = storage.get_study_id_from_name(name)
            stored = Stored(
                name=name,
                trials=storage.get_all_trials(study_id, deepcopy=False),
                jobs=storage.get_all_trials(
                    storage.get_study_id_from_name(companion_name(name)), deepcopy=False
                ),
                told=stored_told(storage, study_id),
                settings=settings,
            )
            for label, (scope, rule) in STORED.items():
                if label == "the population trained once, every member whole" and (
                    "population" not in settings
                ):
                    continue
                if wanted(label) and (scope is None or name in scope):
                    results[f"{name}: {label}"] = _verdict(*rule(stored))
    finally:
        close_storage(storage)
    for name in studies(settings):
        labels = [label for label in READ if wanted(label)]
        if not labels:
            continue
        study = autosearch.load_study(name, storage=url)
        for label in labels:
            results[f"{name}: {label}"] = _verdict(*READ[label](study))
    return results


def _verdict(held: bool, detail: str) -> dict[str, Any]:
    return {"held": bool(held), "detail": detail}
