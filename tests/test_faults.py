"""Nothing lost, nothing run twice: a stalled worker that wakes up after its trial was
taken over, I/O faults (a read-only or full disk under the artifacts), and a worker
killed between training and COMPLETE. Every wait is on a state of the storage or of a
file, bounded only against a broken test hanging CI."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from optuna.trial import TrialState

import autosearch
from autosearch import Compression, PlatformError, TrainConfig
from autosearch.study.records import result_facts, weights_id
from autosearch.workers._heartbeat import last_beat
from controllers import RandomSearch

# A trial stopped "one epoch in" must still be running when the signal lands: eleven
# epochs left, not three, between seeing it and stopping it on a loaded machine.
INTERRUPTED_TRAIN = TrainConfig(epochs=12, batch_size=32, lr=0.05)


def _wait_for(predicate, what: str, bound: float = 1800.0) -> None:
    deadline = time.monotonic() + bound
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw: {what}")
        time.sleep(0.05)


def _trials(study: autosearch.Study):
    return study.optuna_study.get_trials(deepcopy=False)


def _epochs(study: autosearch.Study, number: int) -> int:
    trials = _trials(study)
    return len(trials[number].intermediate_values) if len(trials) > number else 0


def _worker(url: str, name: str, n: int, env: dict[str, str], *options: str) -> subprocess.Popen:
    cli = Path(sys.executable).with_name("autosearch")
    return subprocess.Popen(
        [
            str(cli),
            "-v",
            "worker",
            "--study",
            name,
            "--storage",
            url,
            "--n-trials",
            str(n),
            *options,
        ],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop_outside_a_write(worker: subprocess.Popen, db: Path) -> None:
    """SIGSTOP the worker at a moment it holds no SQLite write lock (a worker stopped
    inside a write would block every other writer, which no stall detector can help)."""
    while True:
        worker.send_signal(signal.SIGSTOP)
        probe = sqlite3.connect(db, timeout=0.2)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.rollback()
            return
        except sqlite3.OperationalError:  # locked: let it finish that write first
            worker.send_signal(signal.SIGCONT)
            time.sleep(0.02)
        finally:
            probe.close()


@pytest.mark.slow
def test_a_stalled_worker_that_wakes_up_drops_its_taken_over_trial(
    tmp_path, tiny_space, monkeypatch
):
    beats = {"AUTOSEARCH_HEARTBEAT_INTERVAL": "0.3", "AUTOSEARCH_HEARTBEAT_GRACE": "2"}
    for key, value in beats.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "stall.db"
    url = f"sqlite:///{db}"
    study = autosearch.create_study(
        "stall",
        controller=RandomSearch(tiny_space, seed=0),
        storage=url,
        train=INTERRUPTED_TRAIN,
        artifacts=str(tmp_path / "artifacts"),
    )
    worker = _worker(url, "stall", 2, beats)
    try:
        _wait_for(lambda: _epochs(study, 0) >= 1, "trial 0 one epoch in")
        _stop_outside_a_write(worker, db)
        _wait_for(
            lambda: time.time() - last_beat(_trials(study)[0]) > study._heartbeat[1],
            "the stopped worker's trial silent past the grace period",
        )
        again = autosearch.load_study("stall", storage=url)
        (taken,) = again.optimize(1)  # reaps trial 0 and resumes its architecture
        worker.send_signal(signal.SIGCONT)
        out, _ = worker.communicate(timeout=1800)
    finally:
        worker.kill()
    assert worker.returncode == 0, out[-3000:]
    assert "trial 0 was taken over by another worker" in out and "Traceback" not in out
    assert "worker finished 2 trials" in out  # it went on with other trials
    stalled = _trials(again)[0]
    assert stalled.state == TrialState.FAIL and "no heartbeat" in stalled.user_attrs["superseded"]
    assert taken.arch.arch_id == stalled.user_attrs["arch_id"] and taken.state == "complete"
    records = autosearch.load_study("stall", storage=url).records()
    assert len(records) == 3 and all(r.state == "complete" for r in records)
    assert len({r.arch.arch_id for r in records}) == 3  # nothing trained twice to the end
    assert not list((tmp_path / "artifacts" / "checkpoints").rglob("*.pt"))  # none left


@pytest.fixture
def tmpfs(tmp_path):
    """A small memory file system of its own (to make read-only or fill), unmounted
    afterwards."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root (CI runs as root): {made.stderr!r}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _remount(mount: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mount)], check=True)


def _io_study(tmp_path: Path, artifacts: Path, tiny_space) -> autosearch.Study:
    return autosearch.create_study(
        "io",
        controller=RandomSearch(tiny_space, seed=0),
        storage=f"sqlite:///{tmp_path}/io.db",
        artifacts=str(artifacts),
        train=TrainConfig(epochs=3, batch_size=128, lr=0.1),
    )


def _assert_nothing_failed_or_told(study: autosearch.Study, told: set[int]) -> None:
    assert not [r for r in study.records() if r.state == "failed"]
    from autosearch.study.replay import stored_told

    assert stored_told(study._storage, study._study_id) == told  # the cut trial was not told


def test_a_disk_turned_read_only_mid_run_stops_the_worker_and_loses_nothing(
    tmp_path, tmpfs, tiny_space
):
    study = _io_study(tmp_path, tmpfs, tiny_space)
    study.optimize(1)

    def read_only_after_one_epoch(trial: int, epoch) -> None:
        if trial == 1 and epoch.epoch == 1:
            _remount(tmpfs, "ro")

    with pytest.raises(PlatformError, match=r"cannot write checkpoint .*mnt/.*Read-only file"):
        study.optimize(2, epoch_callbacks=[read_only_after_one_epoch])
    cut = _trials(study)[1]
    assert "platform failure" in cut.user_attrs["superseded"] and cut.user_attrs["resume"]
    _assert_nothing_failed_or_told(study, {0})
    _remount(tmpfs, "rw")
    (resumed,) = study.optimize(1)
    assert resumed.arch.arch_id == cut.user_attrs["arch_id"] and resumed.state == "complete"
    assert result_facts(_trials(study)[resumed.trial])["resumed_from_epoch"] == 1
    assert [r.state for r in study.records()] == ["complete", "complete"]


def test_a_full_disk_stops_the_worker_and_the_trial_resumes_once_there_is_room(
    tmp_path, tmpfs, tiny_space
):
    study = _io_study(tmp_path, tmpfs, tiny_space)
    filler = tmpfs / "filler"
    with filler.open("wb") as out:  # fill the disk but for a few kB
        out.write(b"\0" * (2 * 1024 * 1024 - 8 * 1024))
    with pytest.raises(PlatformError, match=r"mnt/.*No space left on device"):
        study.optimize(1)
    assert _trials(study)[0].user_attrs["resume"] is True
    _assert_nothing_failed_or_told(study, set())
    filler.unlink()
    (done,) = study.optimize(1)
    assert done.state == "complete" and done.arch.arch_id == _trials(study)[0].user_attrs["arch_id"]


@pytest.mark.slow
def test_a_kill_after_training_keeps_the_training_and_the_variants_derived(
    tmp_path, tiny_space, monkeypatch
):
    import autosearch.evaluation.runner

    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path}/k.db"
    study = autosearch.create_study(
        "k",
        controller=RandomSearch(tiny_space, seed=0),
        storage=url,
        train=TrainConfig(epochs=2, batch_size=64, lr=0.1),
        variants=("base", "prune-l1@0.5", "int8"),
        compression=Compression(finetune_epochs=1),
        artifacts=str(tmp_path / "artifacts"),
    )
    worker = _worker(url, "k", 1, {})
    derived = tmp_path / "artifacts" / "checkpoints"
    try:  # kill it once one variant is derived: training is over, int8 is under way
        _wait_for(lambda: any(derived.rglob("prune-l1@0.5.json")), "the first variant derived")
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=1800)
    finally:
        worker.kill()
    assert _trials(study)[0].state == TrialState.RUNNING  # killed before COMPLETE
    again_derived: list[tuple[str, bool]] = []
    real = autosearch.evaluation.runner.derive

    def counting(spec, *args, **kwargs):
        again_derived.append((str(spec), kwargs.get("estimate", False)))
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(autosearch.evaluation.runner, "derive", counting)
    again = autosearch.load_study("k", storage=url)
    (done,) = again.optimize(1)
    facts = result_facts(_trials(again)[done.trial])
    assert facts["resumed_from_epoch"] == 2  # no epoch trained again
    # prune-l1@0.5 was not derived again: the trial estimated int8, and the front's
    # measurement lowered it for real if that point is on the front.
    assert again_derived[0] == ("int8", True) and again_derived[1:] in ([], [("int8", False)])
    assert {r.variant for r in again.records()} == {"base", "prune-l1@0.5", "int8"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind", ["sqlite", "journal", pytest.param("postgresql", marks=pytest.mark.service)]
)
@pytest.mark.parametrize("point", ["end_trial.inside", "end_trial.after", "store.weights"])
def test_a_worker_killed_inside_the_end_of_a_trial_stores_it_once(
    kind, point, tmp_path, request, tiny_space, monkeypatch
):
    """The kill a random signal seldom lands: inside the transaction that ends a trial
    (a failpoint, autosearch/workers/_failpoints.py). A database keeps all of it or none;
    a journal may hold half (the result, not the state), which is never read as a
    result. The next worker takes the trial up at once, and it is stored exactly once."""
    from autosearch.study.records import RESULT

    monkeypatch.chdir(tmp_path)
    url = (
        request.getfixturevalue("postgres_url")
        if kind == "postgresql"
        else {"sqlite": f"sqlite:///{tmp_path}/f.db", "journal": f"journal:{tmp_path}/f.log"}[kind]
    )
    study = autosearch.create_study(
        "f",
        controller=RandomSearch(tiny_space, seed=0),
        storage=url,
        train=TrainConfig(epochs=2, batch_size=64, lr=0.1),
        artifacts=str(tmp_path / "artifacts"),
    )
    worker = _worker(url, "f", 1, {"AUTOSEARCH_FAILPOINTS": f"{point}=kill@1"})
    out, _ = worker.communicate(timeout=1800)
    assert worker.returncode == -signal.SIGKILL, out[-3000:]
    assert f"autosearch failpoint {point}: kill" in out
    cut = _trials(study)[0]
    if point == "end_trial.after":  # committed before the kill: complete, once
        assert cut.state == TrialState.COMPLETE
    else:
        assert cut.state == TrialState.RUNNING
        assert (RESULT in cut.user_attrs) == (kind == "journal" and point == "end_trial.inside")
    read = autosearch.load_study("f", storage=url).records()
    assert [r.state for r in read] == ["complete" if cut.state.is_finished() else "running"]
    again = autosearch.load_study("f", storage=url)
    again.optimize(1)
    records = again.records()
    trials = _trials(again)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len({t.user_attrs["arch_id"] for t in done}) == len(done) == len(records)
    assert cut.user_attrs["arch_id"] in {t.user_attrs["arch_id"] for t in done}
    if cut.state == TrialState.RUNNING:  # taken up, from its last epoch's checkpoint
        assert "its process is gone" in trials[0].user_attrs["superseded"]
        assert result_facts(done[0])["resumed_from_epoch"] == 2
    # F9: what the kill left that no trial needs is swept when the search ends: weights
    # uploaded by the killed attempt, the work of an architecture stored complete.
    referred = {w for t in trials if (w := weights_id(t))}
    assert again._artifacts.stored_weights() == referred
    assert again._artifacts.checkpointed() == set()


def test_failpoints_are_off_unless_armed_and_a_wrong_name_is_refused(monkeypatch):
    from autosearch.workers import _failpoints

    _failpoints._armed.cache_clear()
    try:
        _failpoints.failpoint("end_trial.inside")  # unarmed: nothing happens
        monkeypatch.setenv(_failpoints.ENV, "end_trial.insde=kill@1")
        _failpoints._armed.cache_clear()
        with pytest.raises(ValueError, match="'end_trial.insde=kill@1' is not NAME=ACTION"):
            _failpoints.failpoint("end_trial.inside")
    finally:
        monkeypatch.delenv(_failpoints.ENV)
        _failpoints._armed.cache_clear()


def test_a_misspelt_failpoint_stops_a_worker_before_its_first_trial(tmp_path, tiny_space):
    """FPb: refused only at its first pass (after an epoch), with a traceback, leaving
    the trial RUNNING; now before the worker claims anything, in one line."""
    url = f"sqlite:///{tmp_path}/fp.db"
    study = autosearch.create_study(
        "fp", controller=RandomSearch(tiny_space, seed=0), storage=url, train=INTERRUPTED_TRAIN
    )
    worker = _worker(url, "fp", 1, {"AUTOSEARCH_FAILPOINTS": "epoch.saved=kil@1"})
    out, _ = worker.communicate(timeout=1800)
    assert worker.returncode == 2 and "Traceback" not in out, out[-3000:]
    refused = "AUTOSEARCH_FAILPOINTS: 'epoch.saved=kil@1' is not NAME=ACTION@CHANCE"
    assert out.strip().splitlines()[-1].startswith(f"autosearch: error: {refused}")
    assert _trials(study) == []


def test_a_supersede_cut_between_its_two_writes_on_a_journal_is_finished(tmp_path, tiny_space):
    """Found by the chaos soak: on a journal a trial is ended in two writes (its reason,
    then its state); a worker killed between them while giving up a dead worker's trial
    left it running for ever, marked superseded (so no reaper looked at it again). The
    next look finishes what was begun."""
    from autosearch.study.records import FAIL_REASON, RESUME, SUPERSEDED

    url = f"journal:{tmp_path}/j.log"
    study = autosearch.create_study(
        "j",
        controller=RandomSearch(tiny_space, seed=0),
        storage=url,
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
    )
    study.optimize(1)
    arch = study.space.sample(np.random.default_rng(5))
    cut = study._claims.start(arch, {"arch_id": arch.arch_id, "worker": "gone:1"})
    reason = "its worker gone:1 died (its process is gone); it resumes from its checkpoint"
    for key, value in ((RESUME, True), (FAIL_REASON, reason), (SUPERSEDED, reason)):
        study._storage.set_trial_user_attr(cut, key, value)  # the first write; not the state
    again = autosearch.load_study("j", storage=url)
    assert again.optimize(0) == [] and again.trials.count("running") == 0
    ended = again._storage.get_trial(cut)
    assert ended.state == TrialState.FAIL and ended.user_attrs[SUPERSEDED] == reason
    (resumed,) = again.optimize(1)  # its architecture is taken up, once
    assert resumed.arch == arch and resumed.state == "complete"


def test_a_lost_database_connection_is_named_as_such_not_as_invalid_data():
    """Found by the chaos soak (PostgreSQL, pg_terminate_backend): Optuna wraps a cut
    connection as "an exception is raised during the commit ... invalid data"; the line a
    worker exits with says the connection was lost, and that running again goes on."""
    import sqlalchemy
    from optuna.exceptions import StorageInternalError

    from autosearch.study.loop import platform_error

    class AdminShutdown(Exception):
        pass

    cause = AdminShutdown("terminating connection due to administrator command")
    wrapped = sqlalchemy.exc.OperationalError("COMMIT", {}, cause, connection_invalidated=True)
    try:
        try:
            raise wrapped
        except sqlalchemy.exc.OperationalError as exc:
            raise StorageInternalError("An exception is raised during the commit.") from exc
    except StorageInternalError as exc:
        line = str(platform_error(exc, "postgresql://h/db"))
    assert line.startswith("storage postgresql://h/db: the connection to the database was lost")
    assert "run the same command again" in line and "invalid data" not in line
    plain = str(platform_error(StorageInternalError("disk I/O error"), "sqlite:///x.db"))
    assert plain == "storage sqlite:///x.db failed: StorageInternalError: disk I/O error"

    def wrapped_by_optuna(error: BaseException) -> StorageInternalError:
        try:
            try:
                raise error
            except Exception as exc:
                raise StorageInternalError("An exception is raised during the commit.") from exc
        except StorageInternalError as exc:
            return exc

    # Seen in a later soak: the next statement on a connection invalidated mid-transaction.
    pending = sqlalchemy.exc.PendingRollbackError(
        "Can't reconnect until invalid transaction is rolled back. Please rollback() fully"
    )
    line = str(platform_error(wrapped_by_optuna(pending), "postgresql://h/db"))
    assert line.startswith("storage postgresql://h/db: the connection to the database was lost")
    # Anything else Optuna wraps is named by its own error, not "invalid data in the commit".
    other = sqlalchemy.exc.DataError("INSERT", {}, ValueError("value too long for varchar(512)"))
    line = str(platform_error(wrapped_by_optuna(other), "postgresql://h/db"))
    assert line.startswith("storage postgresql://h/db failed: DataError: (builtins.ValueError)")
    assert "value too long" in line and "invalid data" not in line


def test_a_connection_cut_while_the_storage_opens_is_opened_again(tmp_path, monkeypatch):
    """Seen in the chaos soak: a worker whose connection was cut while it opened the
    storage exited with "cannot open storage ...: AdminShutdown: terminating connection".
    A cut while opening is opened again; cut every time, one line says so."""
    import sqlalchemy

    from autosearch.storage import _urls

    class AdminShutdown(Exception):
        pass

    real, cuts = _urls.RDBStorage, []

    def cut_twice(url, **options):
        if len(cuts) < cuts_wanted:
            cuts.append(url)
            cause = AdminShutdown("terminating connection due to administrator command")
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, cause)
        return real(url, **options)

    monkeypatch.setattr(_urls, "RDBStorage", cut_twice)
    monkeypatch.setattr(_urls.time, "sleep", lambda seconds: None)
    url = f"sqlite:///{tmp_path}/s.db"
    cuts_wanted = 2
    storage = _urls._rdb(url, create=True)
    assert len(cuts) == 2 and storage.get_all_studies() == []
    cuts.clear()
    cuts_wanted = 100
    with pytest.raises(autosearch.StorageError) as caught:
        _urls._rdb(url, create=False)
    line = str(caught.value)
    assert "the connection to the database was lost 8 times while opening it" in line
    assert "run the same command again" in line and "\n" not in line


def _stopped(process: subprocess.Popen) -> bool:
    """Whether ``process`` is stopped (SIGSTOP): its state in /proc is T."""
    stat = Path(f"/proc/{process.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow
@pytest.mark.service
def test_a_worker_paused_inside_its_end_of_a_trial_does_not_hang_the_one_taking_over(
    tmp_path, tiny_space, monkeypatch, postgres_url
):
    """X2: a worker SIGSTOPped inside its end-of-trial transaction kept its row lock
    (idle in transaction); the worker taking its trial over blocked on it for minutes,
    deaf to SIGTERM. The server now ends the paused session after the heartbeat's
    grace, the takeover waits at most a bounded time each look, and the paused worker's
    late commit is refused in one line."""
    monkeypatch.chdir(tmp_path)
    beats = {"AUTOSEARCH_HEARTBEAT_INTERVAL": "0.5", "AUTOSEARCH_HEARTBEAT_GRACE": "3"}
    monkeypatch.setenv("AUTOSEARCH_HEARTBEAT_GRACE", "3")
    monkeypatch.setenv("AUTOSEARCH_HEARTBEAT_INTERVAL", "0.5")
    autosearch.create_study(
        "x2",
        controller=RandomSearch(tiny_space, seed=0),
        storage=postgres_url,
        train=TrainConfig(epochs=2, batch_size=64, lr=0.1),
        artifacts=str(tmp_path / "artifacts"),
    )
    paused = _worker(
        postgres_url, "x2", 1, {**beats, "AUTOSEARCH_FAILPOINTS": "end_trial.inside=stop@1"}
    )
    try:
        _wait_for(lambda: paused.poll() is None and _stopped(paused), "the worker paused")
        # The study's one trial is the paused worker's: nothing else to claim. A worker
        # started while it still counts as alive finds the study full and leaves; the
        # next, once its heartbeat has lapsed, takes it over (without waiting on its row
        # for as long as it is paused).
        study = autosearch.load_study("x2", storage=postgres_url, read_only=True)
        while not any(t.state == TrialState.COMPLETE for t in _trials(study)):
            taking_over = _worker(postgres_url, "x2", 1, beats, "--total", "1")
            out, _ = taking_over.communicate(timeout=1800)
            assert taking_over.returncode == 0, out[-3000:]
        # Going on, it may stop at the failpoint again (giving its trial up is another
        # end of it): let it go each time, until it has said its last line.
        late = None
        while late is None:
            if paused.poll() is None and _stopped(paused):
                paused.send_signal(signal.SIGCONT)
            try:
                late, _ = paused.communicate(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue
    finally:
        paused.kill()
    assert paused.returncode == 2, late[-3000:]
    assert "Traceback" not in late
    assert "the connection to the database was lost" in late.strip().splitlines()[-1]
    trials = _trials(autosearch.load_study("x2", storage=postgres_url))
    assert trials[0].state == TrialState.FAIL and "superseded" in trials[0].user_attrs
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert [t.user_attrs["arch_id"] for t in done] == [trials[0].user_attrs["arch_id"]]
