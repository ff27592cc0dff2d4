"""A study's jobs (the supernet's training) are claimed through the storage: whatever
order the workers' steps run in, whoever dies or stalls, exactly one claim finishes a
job, and every worker that gets a result gets that one (hypothesis over interleavings
of the claim protocol's steps, on a storage with a clock the test moves)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from autosearch._heartbeat import HEARTBEAT
from autosearch.study.jobs import Done, Held, JobClaim, Jobs, companion_name

GRACE = 60.0
JOB = "supernet-abc-r0"


@dataclass
class Worker:
    """One worker's place in the protocol: idle (looking), started (claim made, not
    checked), holding (training), finished (has a result)."""

    jobs: Jobs
    state: str = "idle"
    claim: JobClaim | None = None
    result: Any = None
    finished_it: bool = False
    waits: int = field(default=0)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _step(worker: Worker, name: int) -> None:
    """Advance ``worker`` by one step of Jobs.acquire / finish."""
    jobs = worker.jobs
    if worker.state == "idle":
        seen = jobs.look(JOB)
        if isinstance(seen, Done):
            worker.state, worker.result = "finished", seen.result
        elif isinstance(seen, Held):
            worker.waits += 1
        else:
            worker.claim, worker.state = jobs.start(JOB), "started"
    elif worker.state == "started":
        assert worker.claim is not None
        worker.state = "holding" if jobs.check(worker.claim) else "idle"
    elif worker.state == "holding":
        assert worker.claim is not None
        if jobs.finish(worker.claim, {"trained_by": name}):
            worker.state, worker.result, worker.finished_it = "finished", {"trained_by": name}, True
        else:  # taken over while it trained: it looks again (and waits, or adopts)
            worker.state = "idle"


def _beat(storage, worker: Worker, clock: Clock) -> None:
    if worker.state in ("started", "holding") and worker.claim is not None:
        try:
            storage.set_trial_system_attr(worker.claim.trial_id, HEARTBEAT, clock.now)
        except UpdateFinishedTrialError:
            pass  # its claim was given up: the beat has nothing to stamp


def _check(storage, workers: list[Worker]) -> None:
    companion = storage.get_study_id_from_name(companion_name("s"))
    claims = [t for t in storage.get_all_trials(companion) if t.user_attrs.get("job") == JOB]
    complete = [t for t in claims if t.state == TrialState.COMPLETE]
    assert len(complete) <= 1, "two claims finished the job"
    assert sum(w.finished_it for w in workers) == len(complete)
    running_held = [
        w
        for w in workers
        if w.state == "holding" and storage.get_trial(w.claim.trial_id).state == TrialState.RUNNING
    ]
    assert len(running_held) <= 1, "two workers hold running claims at once"
    results = {str(w.result) for w in workers if w.state == "finished"}
    assert len(results) <= 1, results
    if complete and results:
        assert results == {str(complete[0].user_attrs["job_result"])}


ACTIONS = st.lists(
    st.tuples(
        st.integers(0, 2),  # which worker
        st.sampled_from(["step", "step", "step", "beat", "tick", "long tick"]),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(actions=ACTIONS)
def test_whatever_the_interleaving_one_claim_finishes_the_job(actions):
    storage = optuna.storages.InMemoryStorage()
    clock = Clock()
    with mock.patch("time.time", clock):
        workers = [Worker(Jobs(storage, "s", grace=GRACE)) for _ in range(3)]
        workers[0].jobs.study_id  # noqa: B018  # the companion study, as the first use makes it
        for index, action in actions:
            worker = workers[index]
            if action == "step":
                _step(worker, index)
            elif action == "beat":
                _beat(storage, worker, clock)
            else:
                clock.now += GRACE * (3 if action == "long tick" else 0.4)
            _check(storage, workers)
        # Then every worker runs on, beating, until all have the result: the job ends.
        for _ in range(40):
            for index, worker in enumerate(workers):
                _beat(storage, worker, clock)
                _step(worker, index)
                _check(storage, workers)
            if all(w.state == "finished" for w in workers):
                break
            clock.now += GRACE * 0.1
        assert all(w.state == "finished" for w in workers)


def test_a_claim_given_up_for_dead_cannot_finish():
    """The reported fault's root: a stalled trainer that wakes after another took over
    must not store its weights as the job's."""
    storage = optuna.storages.InMemoryStorage()
    clock = Clock()
    with mock.patch("time.time", clock):
        first, second = Jobs(storage, "s", grace=GRACE), Jobs(storage, "s", grace=GRACE)
        stalled = first.start(JOB)
        assert first.check(stalled)
        assert isinstance(second.look(JOB), Held)  # alive: the other waits
        clock.now += GRACE + 1
        assert second.look(JOB) is None  # silent past the grace: given up
        assert first.taken_over(stalled) is not None
        successor = second.start(JOB)
        assert second.check(successor)
        assert not first.finish(stalled, {"trained_by": "stalled"})
        assert second.finish(successor, {"trained_by": "successor"})
        seen = first.look(JOB)
        assert isinstance(seen, Done) and seen.result == {"trained_by": "successor"}


def test_the_companion_study_stays_out_of_the_study_listing(make_study):
    import autosearch
    from autosearch.errors import StorageError

    study = make_study("kept")
    Jobs(study.storage, "kept", grace=GRACE).study_id  # noqa: B018
    with pytest.raises(StorageError, match=r"Studies there: kept$"):
        autosearch.load_study("kep", storage=study.storage_url)
