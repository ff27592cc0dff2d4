"""Many workers on one study (SQLite, journal, PostgreSQL), heartbeats, a worker killed
mid-trial and resumed from its checkpoint, Ctrl-C, and exact reruns."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _trials import the_resume
from optuna.trial import TrialState

import autosearch
from autosearch import TrainConfig
from autosearch.evaluation.runner import TrialPlan, train_candidate
from autosearch.study import trial_seed
from autosearch.study.records import architecture


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "postgresql":
        return request.getfixturevalue("postgres_url")
    return {"sqlite": f"sqlite:///{tmp_path}/s.db", "journal": f"journal:{tmp_path}/s.log"}[kind]


@pytest.mark.slow
@pytest.mark.parametrize(  # the journal's claims are raced by the killed-worker test below
    "kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.service)]
)
def test_four_workers_share_a_study_without_losing_or_repeating_trials(
    kind, tmp_path, request, tiny_space, monkeypatch
):
    from controllers import RandomSearch

    monkeypatch.chdir(tmp_path)
    study = autosearch.create_study(
        f"four-{kind}",
        controller=RandomSearch(tiny_space, seed=0),
        storage=_url(kind, tmp_path, request),
        artifacts=str(tmp_path / "artifacts"),
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
    )
    records = study.optimize(8, n_workers=4)
    assert len(records) == 8
    stored = study.records()
    assert len(stored) == 8 and all(r.state == "complete" for r in stored)
    assert len({r.arch.arch_id for r in stored}) == 8  # no architecture trained twice
    assert study.trials.count("complete") == 8
    trials = study.optuna_study.get_trials(deepcopy=False)
    workers = {t.user_attrs["worker"] for t in trials if "superseded" not in t.user_attrs}
    assert len(workers) == 4  # four processes shared the work
    for t in trials:  # every other trial is a duplicate claim that yielded, and says so
        if "superseded" in t.user_attrs:
            assert t.state == TrialState.FAIL and "duplicate" in t.user_attrs["superseded"]
    assert all(t.user_attrs["data_hash"] == study.data.content_hash() for t in trials)


def test_of_two_racing_claims_the_later_one_yields(make_study, tiny_space):
    import numpy as np

    first = make_study("race")
    second = autosearch.load_study("race", storage=first.storage_url)
    arch = tiny_space.sample(np.random.default_rng(0))
    a, b = first._claims.start(arch, {}), second._claims.start(arch, {})
    assert second._claims.holds(b, arch) is False and first._claims.holds(a, arch) is True
    loser = first.optuna_study.get_trials()[1]
    assert loser.state == TrialState.FAIL and "duplicate: trial 0" in loser.user_attrs["superseded"]
    assert [r.trial for r in first.records()] == [0]  # the yielded claim is not a result


def _wait_for(predicate, what: str, bound: float = 1800.0) -> None:
    """Wait for a state of the storage or a process. The bound only keeps a broken test
    from hanging CI; it is far beyond any loaded machine's time for these waits."""
    deadline = time.monotonic() + bound
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw: {what}")
        time.sleep(0.05)


def _epochs(study: autosearch.Study, number: int) -> int:
    trials = study.optuna_study.get_trials(deepcopy=False)
    return len(trials[number].intermediate_values) if len(trials) > number else 0


# A trial stopped "n epochs in" must still be running when the signal lands: ten epochs
# or more left, not two, between seeing it and stopping it on a loaded machine.
INTERRUPTED_TRAIN = TrainConfig(epochs=12, batch_size=32, lr=0.05)


def _worker(storage: str, name: str, n: int, env: dict[str, str]) -> subprocess.Popen:
    cli = Path(sys.executable).with_name("autosearch")
    return subprocess.Popen(
        [str(cli), "worker", "--study", name, "--storage", storage, "--n-trials", str(n)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


_UNINTERRUPTED: dict[tuple[str, int], dict[str, float]] = {}


def _uninterrupted(study: autosearch.Study, arch) -> dict[str, float]:
    """The metrics of ``arch`` trained straight through with INTERRUPTED_TRAIN and its
    trial's seed on the study's data: the same studies on every storage, so trained once
    for the module."""
    seed = trial_seed(study.definition.seed, arch)
    key = (arch.arch_id, study.definition.seed)  # the study seed: its data split and trial seeds
    if key not in _UNINTERRUPTED:
        plan = TrialPlan(space=study.space, arch=arch, train=INTERRUPTED_TRAIN, seed=seed)
        _UNINTERRUPTED[key] = dict(train_candidate(plan, study.data).metrics)
    return _UNINTERRUPTED[key]


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind", ["sqlite", "journal", pytest.param("postgresql", marks=pytest.mark.service)]
)
def test_a_worker_killed_mid_trial_is_resumed_from_its_checkpoint(
    kind, tmp_path, request, tiny_space, monkeypatch
):
    """The killed worker's trial is taken up at once: its process is gone (a grace a
    loaded machine could exceed plays no part; the default 60 s stays)."""
    from controllers import RandomSearch

    monkeypatch.chdir(tmp_path)
    url = _url(kind, tmp_path, request)
    study = autosearch.create_study(
        "chaos",
        controller=RandomSearch(tiny_space, seed=0),
        storage=url,
        train=INTERRUPTED_TRAIN,
        artifacts=str(tmp_path / "shared-artifacts"),  # where every worker finds checkpoints
    )
    worker = _worker(url, "chaos", 3, {})
    try:  # let it finish trial 0, then kill it two epochs into trial 1
        _wait_for(lambda: _epochs(study, 1) >= 2, "trial 1 two epochs in")
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=1800)
    finally:
        worker.kill()
    killed = study.optuna_study.get_trials(deepcopy=False)[1]
    assert killed.state == TrialState.RUNNING  # as a dead worker leaves it
    attempt = study._artifacts.attempt(architecture(killed), 1)
    assert (attempt / "train.pt").is_file()

    again = autosearch.load_study("chaos", storage=url)
    again.optimize(1)
    records = again.records()
    assert [r.state for r in records] == ["complete"] * 2  # trial 0 kept, nothing lost
    resumed = next(r for r in records if r.arch.arch_id == killed.user_attrs["arch_id"])
    attrs = again.optuna_study.get_trials()[resumed.trial].user_attrs
    assert attrs["resumes"] == 1 and attrs["result"]["resumed_from_epoch"] >= 2
    dead = again.optuna_study.get_trials()[1]
    assert dead.state == TrialState.FAIL
    assert "died (its process is gone)" in dead.user_attrs["superseded"]
    # The resumed trial ends exactly where an uninterrupted run does (CPU, fixed seed).
    straight = _uninterrupted(again, resumed.arch)
    assert straight["accuracy"] == resumed.metrics["accuracy"]
    assert straight["test_accuracy"] == resumed.metrics["test_accuracy"]
    assert len(again.trials.curves()[resumed.trial]) == INTERRUPTED_TRAIN.epochs  # the whole curve


@pytest.mark.slow
def test_ctrl_c_finishes_the_epoch_checkpoint_and_the_trial_resumes(tmp_path, tiny_space):
    from controllers import RandomSearch

    url = f"sqlite:///{tmp_path}/int.db"
    study = autosearch.create_study(
        "int", controller=RandomSearch(tiny_space, seed=0), storage=url, train=INTERRUPTED_TRAIN
    )
    worker = _worker(url, "int", 2, {})
    try:
        _wait_for(lambda: _epochs(study, 0) >= 1, "trial 0 one epoch in")
        worker.send_signal(signal.SIGINT)
        out, _ = worker.communicate(timeout=1800)
    finally:
        worker.kill()
    assert worker.returncode == 130, out[-2000:]  # as a shell reports Ctrl-C
    assert "finishing this epoch's checkpoint" in out and "worker interrupted (SIGINT)" in out
    study = autosearch.load_study("int", storage=url)
    stopped = study.optuna_study.get_trials()[0]
    assert "interrupted by the user" in stopped.user_attrs["superseded"]
    assert study.records() == []  # nothing half-done shows as a result
    done = study.optimize(1)
    attrs = study.optuna_study.get_trials()[done[0].trial].user_attrs
    assert done[0].arch.arch_id == stopped.user_attrs["arch_id"] and attrs["resumes"] == 0
    assert attrs["result"]["resumed_from_epoch"] >= 1


def test_rerun_reproduces_a_trial_exactly(make_study, capsys):
    from autosearch.cli import main

    study = make_study("again")
    study.optimize(2)
    code = main(["rerun", "--study", "again", "--storage", study.storage_url, "--trial", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "reproduced exactly" in out
    trial = study.optuna_study.get_trials()[1].user_attrs
    assert trial["seed"] == trial_seed(study.definition.seed, study.record(1).arch)
    assert trial["provenance"]["packages"]["torch"].startswith("2.")
    assert trial["data_hash"] == study.data.content_hash()


@pytest.mark.slow
def test_callbacks_are_called_here_as_the_workers_trials_finish(make_study):
    study = make_study("calls")
    seen: list[int] = []
    records = study.optimize(4, n_workers=2, callbacks=[lambda s, r: seen.append(r.trial)])
    assert sorted(seen) == sorted(r.trial for r in records) and len(seen) == 4
    with pytest.raises(autosearch.ConfigError, match="epoch_callbacks .* need"):
        study.optimize(2, n_workers=2, epoch_callbacks=[lambda trial, epoch: None])


_STUDY = """import autosearch
from controllers import RandomSearch
from search_spaces import ResNetSpace

space = ResNetSpace(max_stages=2, depths=(1,), widths=(4,), stem_widths=(4,))
study = autosearch.create_study(
    "guard", controller=RandomSearch(space, seed=0), storage="sqlite:///guard.db"
)
"""


def test_workers_from_a_script_without_the_main_guard_are_refused(tmp_path):
    """Spawned workers run the script again: without `if __name__ == "__main__":` the
    study would start again in each. Refused in the parent, before any process starts."""
    (tmp_path / "search.py").write_text(_STUDY + "study.optimize(2, n_workers=2)\n")
    done = subprocess.run(
        [sys.executable, "search.py"], cwd=tmp_path, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "search.py line 9 starts worker processes from the top level" in last
    assert 'under `if __name__ == "__main__":`' in last and "already exists" not in done.stderr
    study = autosearch.load_study("guard", storage=f"sqlite:///{tmp_path}/guard.db")
    assert study.records() == []  # no trial was started


def test_the_main_guard_is_recognised(tmp_path):
    from autosearch.workers.pool import check_main_guard

    check_main_guard()  # under pytest: its own entry point is guarded
    guarded = "\n".join(
        ['if "__main__" == __name__:', *(f"    {line}" for line in _STUDY.splitlines())]
    )
    call = "    from autosearch.workers.pool import check_main_guard\n    check_main_guard()\n"
    # Run itself, and under a profiler that runs it as "__main__" from its own module
    # (whose lines are not the script's; a spawned worker imports the profiler's).
    for runner in ([], ["-m", "cProfile", "-o", "search.prof"]):
        folder = tmp_path / ("profiled" if runner else "plain")
        folder.mkdir()
        (folder / "search.py").write_text(guarded + "\n" + call + "    print('ok')\n")
        done = subprocess.run(
            [sys.executable, *runner, "search.py"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert done.returncode == 0 and done.stdout.strip() == "ok", (runner, done.stderr)


# Workers started together (issue 43: J20) ---------------------------------------------------
RUN_TO_SIX = """
from autosearch import StudySpec, TrainConfig
from controllers import RandomSearch
from search_spaces import ResNetSpace

study = StudySpec(
    name="six",
    controller=RandomSearch(
        ResNetSpace(max_stages=2, depths=(1, 2), widths=(4, 8), stem_widths=(4, 8)), seed=0
    ),
    train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
    storage="sqlite:///six.db",
    n_trials=6,
)
"""


@pytest.mark.slow
def test_two_runs_of_one_study_file_run_the_study_to_its_total(tmp_path):
    """J20: two `autosearch run` of one file, started together, each ran the whole
    n_trials (12 trials for a study of 6), while each said "0 of 6 trials done"."""
    (tmp_path / "six.py").write_text(RUN_TO_SIX)
    cli = Path(sys.executable).with_name("autosearch")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = [
        subprocess.Popen(
            [str(cli), "run", "six.py", "--out", f"out{i}", "--no-export"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [run.communicate(timeout=1800)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    study = autosearch.load_study("six", storage=f"sqlite:///{tmp_path}/six.db", read_only=True)
    assert study.trials.count() == study.trials.count("complete") == 6, outputs
    assert len({r.arch.arch_id for r in study.records(variants=False)}) == 6
    # Two workers of one study: neither wrote best/, each said how to (--no-export).
    assert not any((tmp_path / f"out{i}" / "best").exists() for i in range(2))
    assert all("`autosearch export --study six --storage sqlite:///six.db`" in o for o in outputs)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind", ["sqlite", "journal", pytest.param("postgresql", marks=pytest.mark.service)]
)
def test_a_study_deleted_under_a_running_worker_stops_it_in_one_line(
    kind, tmp_path, request, tiny_space, monkeypatch
):
    """A KeyError 'Record does not exist.' traceback, or once "worker finished 8 trials"
    with exit 0 and nothing stored: the worker now stops, says why, exits non-zero."""
    import optuna

    from controllers import RandomSearch

    monkeypatch.chdir(tmp_path)  # a database's default artifacts (runs/gone/) land here
    url = _url(kind, tmp_path, request)
    study = autosearch.create_study(
        "gone", controller=RandomSearch(tiny_space, seed=0), storage=url, train=INTERRUPTED_TRAIN
    )
    # More trials than it could run while the deletion lands: the deletion stops it, never
    # the end of its trials.
    worker = _worker(url, "gone", 1000, {})
    try:
        _wait_for(lambda: _epochs(study, 1) >= 1, "trial 1 one epoch in")
        _wait_for(lambda: _deleted("gone", url), "the study deleted")
        out, _ = worker.communicate(timeout=1800)
    finally:
        worker.kill()
    assert worker.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "worker finished" not in out, out[-3000:]
    assert out.strip().splitlines()[-1] == (
        f"autosearch: error: study 'gone' was deleted from {url} while this worker ran (its "
        "trials with it); the worker stops and stores nothing more"
    )
    from autosearch.storage._urls import open_storage

    stored = optuna.get_all_study_names(open_storage(url, create=False))
    assert "gone" not in stored  # nothing was made again


@pytest.mark.slow
def test_a_journal_cut_short_under_a_running_worker_stops_it_in_one_line(
    tmp_path, tiny_space, monkeypatch
):
    """J3: a journal truncated to half, mid-line, while a worker runs. The worker went
    on, said "worker finished 3 trials" with exit 0, and left a journal no one could
    read; it now stops at its next read or write, names the file, stores nothing."""
    from controllers import RandomSearch

    monkeypatch.chdir(tmp_path)
    journal = tmp_path / "s.log"
    url = f"journal:{journal}"
    study = autosearch.create_study(
        "cut", controller=RandomSearch(tiny_space, seed=0), storage=url, train=INTERRUPTED_TRAIN
    )
    worker = _worker(url, "cut", 1000, {})
    try:
        _wait_for(lambda: _epochs(study, 1) >= 1, "trial 1 one epoch in")
        data = journal.read_bytes()
        half = len(data) // 2
        assert data[half - 1 : half] != b"\n"  # mid-line: nothing whole ends there
        with journal.open("r+b") as file:
            file.truncate(half)
        out, _ = worker.communicate(timeout=1800)
    finally:
        worker.kill()
    assert worker.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "worker finished" not in out, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"autosearch: error: journal {journal} shrank from "), last
    assert last.endswith("restore the journal from a copy and run again"), last
    assert len(journal.read_bytes()) == half  # nothing appended after the cut


def _deleted(name: str, url: str) -> bool:
    """Delete the study; whether it is gone. Optuna's delete_study does nothing, and says
    nothing, when it collides with a running worker's write (it ignores the database's
    IntegrityError): the study is still there, and the worker rightly goes on."""
    import optuna

    from autosearch.storage._urls import open_storage

    storage = open_storage(url, create=False)
    optuna.delete_study(study_name=name, storage=storage)
    return name not in optuna.get_all_study_names(open_storage(url, create=False))


def _running_one_epoch_in(study: autosearch.Study) -> list:
    return [
        t
        for t in study.optuna_study.get_trials(deepcopy=False)
        if t.state == TrialState.RUNNING and len(t.intermediate_values) >= 1
    ]


@pytest.mark.slow
def test_a_pool_worker_killed_is_started_again_and_the_run_finishes(tmp_path, tiny_space):
    """A local pool's worker process killed mid-trial broke the whole pool: the run
    ended in a BrokenProcessPool traceback. It is started again (as Ray starts a lost
    task again), runs what its share still owes, and its trial resumes."""
    import threading

    from controllers import RandomSearch

    study = autosearch.create_study(
        "pool",
        controller=RandomSearch(tiny_space, seed=0),
        storage=f"sqlite:///{tmp_path}/p.db",
        train=TrainConfig(epochs=8, batch_size=32, lr=0.05),
        artifacts=str(tmp_path / "artifacts"),
    )
    killed: dict[str, int] = {}

    def kill_one() -> None:
        _wait_for(lambda: _running_one_epoch_in(study), "a pool trial one epoch in")
        trial = _running_one_epoch_in(study)[0]
        killed.update(number=trial.number, pid=int(trial.user_attrs["worker"].split(":")[-1]))
        os.kill(killed["pid"], signal.SIGKILL)

    killer = threading.Thread(target=kill_one, daemon=True)
    killer.start()
    records = study.optimize(4, n_workers=2)
    killer.join(timeout=1800)
    assert killed and len(records) == 4 and all(r.state == "complete" for r in records)
    trials = study.optuna_study.get_trials(deepcopy=False)
    cut = trials[killed["number"]]
    assert "its process is gone" in cut.user_attrs["superseded"]
    resumed = the_resume(trials, cut)
    assert resumed.state == TrialState.COMPLETE
    assert resumed.user_attrs["result"]["resumed_from_epoch"] >= 1
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len({t.user_attrs["arch_id"] for t in done}) == len(done) == 4


POOL_FILE = """
from autosearch import StudySpec, TrainConfig
from controllers import RandomSearch
from search_spaces import ResNetSpace

study = StudySpec(
    name="orphans",
    controller=RandomSearch(ResNetSpace(max_stages=2, depths=(1, 2), widths=(4, 8)), seed=0),
    train=TrainConfig(epochs=12, batch_size=16, lr=0.05),
    storage="sqlite:///orphans.db",
    n_trials=6,
)
"""


# A study whose definition is stored: whole (the study's row comes first, its definition
# last, in their own commits; a test that opens it between them finds no definition).
_DEFINED = (
    "SELECT 1 FROM studies JOIN study_user_attributes USING (study_id)"
    " WHERE study_name = ? AND key = 'autosearch'"
)


@pytest.mark.slow
def test_a_pools_workers_stop_when_its_parent_dies(tmp_path):
    """`autosearch run --workers 2` killed: its workers went on as orphans to the end of
    their shares. Now each is sent SIGTERM when its parent dies and stops after its
    epoch's checkpoint, its trial marked to resume."""
    (tmp_path / "pool.py").write_text(POOL_FILE)
    cli = Path(sys.executable).with_name("autosearch")
    run = subprocess.Popen(
        [str(cli), "run", "pool.py", "--workers", "2"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url, study = f"sqlite:///{tmp_path}/orphans.db", None

    def running() -> None:
        assert run.poll() is None, run.communicate()[0][-3000:]  # it ended by itself

    def created() -> bool:  # read only: opening it with Optuna would race its creation
        import sqlite3

        running()
        try:
            with contextlib.closing(
                sqlite3.connect(f"file:{tmp_path / 'orphans.db'}?mode=ro", uri=True)
            ) as db:
                return bool(db.execute(_DEFINED, ("orphans",)).fetchall())
        except sqlite3.Error:
            return False  # not there yet, or its tables still being made

    try:
        _wait_for(created, "the study created")
        study = autosearch.load_study("orphans", storage=url)
        _wait_for(
            lambda: running() or len(_running_one_epoch_in(study)) == 2, "both workers one epoch in"
        )
        workers = [int(t.user_attrs["worker"].split(":")[-1]) for t in _running_one_epoch_in(study)]
        run.kill()
        run.wait(timeout=1800)
    finally:
        run.kill()
    _wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), "no orphan")
    trials = study.optuna_study.get_trials(deepcopy=False)
    cut = [t for t in trials if "superseded" in t.user_attrs]
    assert len(cut) == 2 and all("interrupted" in t.user_attrs["superseded"] for t in cut)
    assert all(t.state != TrialState.RUNNING for t in trials)


def test_a_dead_workers_trial_past_the_total_is_given_up_though_nothing_claims(
    make_study, tmp_path
):
    """Found by the chaos soak: a worker killed between creating a trial past the
    study's total and giving it up left it running for ever (a study at its total is
    claimed no more, and claims were what gave up dead workers' trials)."""
    study = make_study("full")
    study.optimize(2)
    code = (
        "import autosearch, numpy as np\n"
        f"s = autosearch.load_study('full', storage={study.storage_url!r})\n"
        "arch = s.space.sample(np.random.default_rng(7))\n"
        "s._claims.start(arch, {'arch_id': arch.arch_id, 'worker': 'gone:1'})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=1800)  # then it is gone
    assert study.trials.count("running") == 1
    assert study.optimize(0) == []
    (dead,) = [t for t in study.optuna_study.get_trials() if "superseded" in t.user_attrs]
    assert dead.state == TrialState.FAIL and "its process is gone" in dead.user_attrs["superseded"]
    assert study.trials.count("running") == 0 and study.trials.count("complete") == 2


def _dies(marks: str, **_: object) -> None:
    """A pool worker that is killed each time it runs (leaving a mark each time)."""
    with open(marks, "a") as f:
        f.write("x")
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_pool_worker_that_keeps_dying_stops_the_run_in_one_line(tmp_path):
    from autosearch import PlatformError, ProcessExecutor

    marks = tmp_path / "marks"
    executor = ProcessExecutor(max_retries=1)
    with pytest.raises(PlatformError, match=r"worker 0 died 2 times \(its process ended"):
        executor.map(_dies, [{"marks": str(marks), "worker": 0}], lambda: None)
    assert marks.read_text() == "xx"  # run, and started again once


def _returns(**_: object) -> str:
    return "ran"


def _gone_or_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_fork_server_that_dies_as_it_starts_a_worker_is_started_again(monkeypatch, caplog):
    """Seen in the chaos soak: a pool's fork server killed just after the pool found it
    alive, as the pool asked it for a worker; the run stopped with a traceback
    (EOFError from multiprocessing). That worker is started again, the fork server with
    it; a worker that never starts stops the run in one line."""
    from multiprocessing import forkserver

    from autosearch import PlatformError, ProcessExecutor

    server = forkserver._forkserver
    checked, connect = server.ensure_running, forkserver.connect_to_new_process
    killed: list[int] = []
    always = False

    def connect_after_its_death(fds):
        checked()  # alive now; then killed before the pool connects to it
        if always or not killed:
            pid = server._forkserver_pid
            os.kill(pid, signal.SIGKILL)
            for _ in range(6000):  # a state to wait on, generously bounded (60 s)
                if _gone_or_zombie(pid):
                    break
                time.sleep(0.01)
            killed.append(pid)
            monkeypatch.setattr(server, "ensure_running", lambda: None)  # checked already
        try:
            return connect(fds)
        finally:
            monkeypatch.setattr(server, "ensure_running", checked)

    monkeypatch.setattr(forkserver, "connect_to_new_process", connect_after_its_death)
    with caplog.at_level("WARNING"):
        ran = ProcessExecutor(max_retries=1).map(_returns, [{"worker": 0}], lambda: None)
    assert ran == ["ran"] and len(killed) == 1
    assert "worker 0 died (its process could not start (ConnectionRefusedError" in caplog.text

    always = True
    with pytest.raises(PlatformError, match=r"^worker 0 died 2 times \(its process could not "):
        ProcessExecutor(max_retries=1).map(_returns, [{"worker": 0}], lambda: None)
    assert len(killed) == 3


def _what_a_worker_sees(variable: str, **_: object) -> dict:
    """A worker's view: the variable's value, and its parent."""
    return {"value": os.environ.get(variable), "parent": os.getppid()}


def test_pool_workers_get_the_environment_of_the_pool_when_it_starts_them(monkeypatch):
    """Workers are forked from a fork server, whose environment is that of its own
    start; each still gets the environment the pool's process has when it starts them,
    as a spawned process would."""
    from autosearch import ProcessExecutor

    executor = ProcessExecutor(max_retries=0)
    monkeypatch.setenv("AUTOSEARCH_TEST_SEEN", "first")
    calls = [{"variable": "AUTOSEARCH_TEST_SEEN"}]
    (first,) = executor.map(_what_a_worker_sees, calls, lambda: None)
    monkeypatch.setenv("AUTOSEARCH_TEST_SEEN", "second")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    calls += [{"variable": "OMP_NUM_THREADS"}]
    second, gone = executor.map(_what_a_worker_sees, calls, lambda: None)
    assert first["value"] == "first" and second["value"] == "second" and gone["value"] is None
    assert {w["parent"] for w in (first, second, gone)} - {os.getpid()}  # the server's


_PRELOADED = """
import json, sys
from autosearch import ProcessExecutor

def imported(**_):
    import gc
    loaded = sorted(m for m in ("torch", "torch._dynamo", "autosearch") if m in sys.modules)
    return {"loaded": loaded, "frozen": gc.get_freeze_count() > 100_000}

if __name__ == "__main__":
    print(json.dumps(ProcessExecutor().map(imported, [{}, {}], lambda: None)))
"""


def test_pool_workers_start_with_torch_and_its_compiler_loaded(tmp_path):
    """A pool's fork server (the first of its process) loads torch, its compiler
    (imported by every optimizer's first step) and autosearch once, for every worker:
    not seconds of imports each on a slow CPU; each worker freezes what it was forked with
    (no collection scans it again)."""
    (tmp_path / "preloaded.py").write_text(_PRELOADED)
    run = subprocess.run(
        [sys.executable, "preloaded.py"], cwd=tmp_path, capture_output=True, text=True,
        timeout=1800,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    worker = {"loaded": ["autosearch", "torch", "torch._dynamo"], "frozen": True}
    assert json.loads(run.stdout) == [worker, worker], run.stdout
