"""A study's jobs (the supernet's training) are claimed through the storage: whatever
order the workers' steps run in, whoever dies or stalls, exactly one claim finishes a
job, and every worker that gets a result gets that one (hypothesis over interleavings
of the claim protocol's steps, on a storage with a clock the test moves)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from autosearch.study.jobs import Done, Held, JobClaim, Jobs, companion_name
from autosearch.workers._heartbeat import HEARTBEAT

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
    Jobs(study._storage, "kept", grace=GRACE).study_id  # noqa: B018
    with pytest.raises(StorageError, match=r"Studies there: kept$"):
        autosearch.load_study("kep", storage=study.storage_url)


# Stored claims are data (issue 43: J9, J11, J13, J15) --------------------------------------
class Clocks:
    """The wall clock and the monotonic clock, moved together by the test (a worker's
    wall clock may also run ahead of the others')."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_000_000.0, 500.0

    def tick(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@pytest.fixture
def clocks():
    found = Clocks()
    with (
        mock.patch("time.time", lambda: found.wall),
        mock.patch("time.monotonic", lambda: found.mono),
    ):
        yield found


def _storages(tmp_path):
    from autosearch.storage._urls import open_storage

    return [optuna.storages.InMemoryStorage(), open_storage(f"sqlite:///{tmp_path}/j.db")]


def test_the_companion_study_deleted_while_a_worker_waits_starts_the_claims_afresh(tmp_path):
    """J9: a KeyError traceback before."""
    for storage in _storages(tmp_path):
        holder, waiter = Jobs(storage, "s", grace=GRACE), Jobs(storage, "s", grace=GRACE)
        claim = holder.start(JOB)
        assert holder.check(claim)
        assert isinstance(waiter.look(JOB), Held)
        storage.delete_study(storage.get_study_id_from_name(companion_name("s")))
        assert waiter.look(JOB) is None  # free: the claims are gone
        assert holder.taken_over(claim) == "its claim was deleted from the storage"
        assert not holder.finish(claim, {"trained_by": "holder"})
        mine = waiter.start(JOB)
        assert waiter.check(mine) and waiter.finish(mine, {"trained_by": "waiter"})
        assert holder.look(JOB) == Done(number=mine.number, result={"trained_by": "waiter"})


@pytest.mark.parametrize("ahead", [3600.0, 10 * 365 * 86400.0])
def test_a_heartbeat_in_the_future_is_silent_once_it_stops_changing(clocks, ahead):
    """J11: a waiter waited until the stamp's time (years) before."""
    storage = optuna.storages.InMemoryStorage()
    holder, waiter = Jobs(storage, "s", grace=GRACE), Jobs(storage, "s", grace=GRACE)
    claim = holder.start(JOB)
    assert holder.check(claim)
    storage.set_trial_system_attr(claim.trial_id, HEARTBEAT, clocks.wall + ahead)
    assert isinstance(waiter.look(JOB), Held)
    clocks.tick(GRACE * 0.9)
    assert isinstance(waiter.look(JOB), Held)  # not silent for the grace yet
    clocks.tick(GRACE * 0.2)
    assert waiter.look(JOB) is None  # the same stamp for longer than the grace: dead
    assert holder.taken_over(claim) is not None


def test_a_worker_whose_clock_runs_ahead_stays_alive_while_it_beats(clocks):
    storage = optuna.storages.InMemoryStorage()
    holder, waiter = Jobs(storage, "s", grace=GRACE), Jobs(storage, "s", grace=GRACE)
    claim = holder.start(JOB)
    assert holder.check(claim)
    for _ in range(20):  # 20 graces long, beating every half grace, its clock an hour ahead
        storage.set_trial_system_attr(claim.trial_id, HEARTBEAT, clocks.wall + 3600)
        assert isinstance(waiter.look(JOB), Held)
        clocks.tick(GRACE / 2)
    assert holder.taken_over(claim) is None


@pytest.mark.parametrize("stamp", ["soon", None, [1], {"t": 1}, float("nan"), True, "1e308"])
def test_a_heartbeat_that_is_not_a_number_is_no_stamp(clocks, stamp):
    """J13: a ValueError traceback on every run before."""
    storage = optuna.storages.InMemoryStorage()
    holder, waiter = Jobs(storage, "s", grace=GRACE), Jobs(storage, "s", grace=GRACE)
    claim = holder.start(JOB)
    assert holder.check(claim)
    storage.set_trial_system_attr(claim.trial_id, HEARTBEAT, stamp)
    assert isinstance(waiter.look(JOB), Held)  # its start stands for its stamp
    clocks.tick(GRACE + 1)
    assert waiter.look(JOB) is None


STAMPS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=10),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    stamps=st.lists(STAMPS, min_size=1, max_size=6), ticks=st.lists(st.floats(0, 200), max_size=6)
)
def test_whatever_a_claim_stamp_holds_a_waiter_takes_over_within_the_grace(stamps, ticks):
    """Any stamp (a string, a future time, NaN, a list) is read without an error, and a
    claim whose stamp stops changing is given up within the grace of the waiter's own
    clock, however the wall clock moved."""
    found = Clocks()
    with (
        mock.patch("time.time", lambda: found.wall),
        mock.patch("time.monotonic", lambda: found.mono),
    ):
        storage = optuna.storages.InMemoryStorage()
        holder, waiter = Jobs(storage, "s", grace=GRACE), Jobs(storage, "s", grace=GRACE)
        claim = holder.start(JOB)
        assert holder.check(claim)
        for stamp, tick in zip(stamps, [*ticks, *[0.0] * len(stamps)], strict=False):
            with contextlib.suppress(UpdateFinishedTrialError):  # given up already
                storage.set_trial_system_attr(claim.trial_id, HEARTBEAT, stamp)
            waiter.look(JOB)
            found.tick(tick)
        waiter.look(JOB)
        found.tick(GRACE + 1)  # the stamp stopped changing
        assert waiter.look(JOB) is None


def test_a_finished_job_of_another_supernet_is_refused_and_retrain_gets_out(tmp_path, capsys):
    """J15: a COMPLETE claim of another fingerprint with weights 'deadbeef' was adopted
    ("trained 0 epochs", then "the supernet is not trained")."""
    import textwrap

    from autosearch.cli import main
    from autosearch.weight_sharing.job import SupernetJob

    (tmp_path / "job.py").write_text(
        textwrap.dedent(
            """
            from autosearch import StudySpec, SupernetConfig, TrainConfig
            from controllers import RandomSearch
            from search_spaces import ResNetSpace

            space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(8,), stem_widths=(8,))
            study = StudySpec(
                name="forged",
                controller=RandomSearch(space.supernet(fixed={"stages": 2}), seed=0),
                train=TrainConfig(epochs=1, batch_size=128, lr=0.05),
                supernet=SupernetConfig(sandwich=1, latency=False, test_accuracy=False),
                storage="sqlite:///forged.db",
                n_trials=1,
            )
            """
        )
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        from autosearch.studyfile import load_spec

        study = load_spec("job.py").create()
        job: SupernetJob = study.supernet._job
        name = job._job(job.fingerprint(study.data), 0)
        forged = job.jobs.start(name)
        assert job.jobs.finish(
            forged,
            {"status": "complete", "fingerprint": "other", "weights": "deadbeef", "epochs": 0},
        )
        assert main(["supernet", "job.py"]) == 2
        err = capsys.readouterr().err.strip()
        assert "cannot be used: it is another supernet's" in err and "--retrain" in err, err
        assert len(err.splitlines()) == 1
        assert main(["supernet", "job.py", "--retrain"]) == 0
        assert "trained 1 epochs" in capsys.readouterr().out
        assert main(["run", "job.py", "--no-export"]) == 0


def test_a_dead_workers_claim_on_a_job_no_one_asks_for_again_is_given_up(tmp_path):
    """Found by the chaos soak: a worker died measuring a point that then left the
    front; no one acquired that job again, and its claim stayed running for ever. The
    end of a run gives up dead workers' claims on any job (Jobs.tidy)."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path}/j.db"
    storage = optuna.storages.get_storage(url)
    optuna.create_study(study_name="s", storage=storage)
    code = (
        "import optuna\nfrom autosearch.study.jobs import Jobs\n"
        f"Jobs(optuna.storages.get_storage({url!r}), 's', grace=60).start('measure:3:int8:0')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=1800)  # it is gone now
    jobs = Jobs(storage, "s", grace=GRACE)
    held = jobs.start(JOB)  # this process's own claim: alive, kept
    jobs.tidy()
    claims = {t.user_attrs["job"]: t for t in jobs._all()}
    assert claims["measure:3:int8:0"].state == TrialState.FAIL
    assert "its process is gone" in claims["measure:3:int8:0"].user_attrs["gave_up"]
    assert claims[JOB].state == TrialState.RUNNING and jobs.taken_over(held) is None
