"""Workers placed by engines users already run: a Slurm job array (submitit's local
executor: no Slurm here) and a real Ray cluster of two nodes on 127.0.0.1, with
PostgreSQL and S3 artifacts, one node's worker killed mid-trial."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _hermetic
import pytest
from _trials import the_resume
from optuna.trial import TrialState

import autosearch
from autosearch import RayExecutor, SlurmExecutor, TrainConfig
from autosearch.errors import ConfigError

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _complete_once(study: autosearch.Study, n: int) -> list:
    """The study's trials: ``n`` complete, no architecture completed twice."""
    trials = study.optuna_study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == n, [(t.number, t.state, t.user_attrs.get("superseded")) for t in trials]
    assert len({t.user_attrs["arch_id"] for t in done}) == n
    return trials


def test_an_unknown_executor_says_which_exist(make_study):
    with pytest.raises(ConfigError, match="unknown executor 'dask'; use one of process, ray"):
        make_study("x").optimize(2, n_workers=2, executor="dask")


def test_a_slurm_job_array_runs_the_workers(tmp_path, tiny_space):
    pytest.importorskip("submitit", reason="the Slurm executor is an extra: autosearch-nas[slurm]")
    from controllers import RandomSearch

    study = autosearch.create_study(
        "slurm",
        controller=RandomSearch(tiny_space, seed=0),
        storage=f"sqlite:///{tmp_path}/s.db",
        artifacts=str(tmp_path / "artifacts"),
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
        **_tracked(tmp_path),
    )
    jobs = SlurmExecutor(folder=str(tmp_path / "jobs"), cluster="local", timeout_min=30)
    records = study.optimize(4, n_workers=2, executor=jobs)
    assert len(records) == 4 and all(r.state == "complete" for r in records)
    trials = _complete_once(study, 4)
    assert {t.user_attrs["pool_slot"] for t in trials} == {0, 1}  # both jobs worked
    assert len(list((tmp_path / "jobs").glob("*_result.pkl"))) == 2  # submitit's own record
    # The jobs tracked their trials: the study's setting, read by every worker.
    assert _trial_runs(tmp_path, "slurm") == {
        t.number for t in trials if t.state == TrialState.COMPLETE
    }
    assert len(list((tmp_path / "tb" / "slurm").glob("trial-*"))) == 4


def _tracked(tmp_path: Path) -> dict[str, str]:
    """MLflow (a SQLite store) and TensorBoard (both in the dev extras), where the
    test's workers write."""
    return {"mlflow": f"sqlite:///{tmp_path}/mlflow.db", "tensorboard": str(tmp_path / "tb")}


def _trial_runs(tmp_path: Path, study: str) -> set[int]:
    """The trial numbers of the study's trial runs in MLflow, each checked FINISHED."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name(study)
    runs = client.search_runs([experiment.experiment_id], "tags.`autosearch.trial` != ''")
    assert all(run.info.status == "FINISHED" for run in runs), runs
    return {int(run.data.tags["autosearch.trial"]) for run in runs}


@pytest.fixture(scope="module")
def ray_cluster():
    """A head and a second node on 127.0.0.1, one CPU each, in a temp folder of their
    own (RAY_TMPDIR; short: Ray's sockets live there), their processes tagged so that
    exactly they are stopped afterwards (never `ray stop`, which stops every Ray
    cluster of the machine, a user's too)."""
    pytest.importorskip("ray", reason="the Ray executor is an extra: autosearch-nas[ray]")
    tag = _hermetic.new_tag()
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = {**os.environ, _hermetic.TAG: tag, "RAY_TMPDIR": temp}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    ray_cli = str(Path(sys.executable).with_name("ray"))

    def ray(*args: str) -> None:
        subprocess.run([ray_cli, *args], check=True, capture_output=True, env=env, timeout=1800)

    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp  # the driver (this process) finds the session there
    try:
        ray("start", "--head", "--port", str(port), "--include-dashboard", "false", *common)
        ray("start", "--address", address, *common)
        yield address
    finally:
        import ray as ray_module

        ray_module.shutdown()
        _hermetic.stop_tagged(tag, folder=temp)
        os.environ.pop("RAY_TMPDIR") if saved is None else os.environ.update(RAY_TMPDIR=saved)
        shutil.rmtree(temp, ignore_errors=True)


def _wait_for(predicate, what: str, bound: float = 1800.0) -> None:
    """Wait on the storage's state; the bound only keeps a broken test from hanging."""
    deadline = time.monotonic() + bound
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never saw: {what}")
        time.sleep(0.1)


def test_a_dead_ray_head_is_named_in_one_line(make_study, tmp_path):
    """A --ray-address where no head answers: refused at once (a closed port) or within
    the probe's few seconds, never after Ray's minutes of retries."""
    pytest.importorskip("ray", reason="the Ray executor is an extra: autosearch-nas[ray]")
    import ray

    from autosearch.errors import PlatformError

    ray.shutdown()  # this process joins no cluster before the probe
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    study = make_study("dead")
    with pytest.raises(PlatformError, match=f"no Ray head answers at 127.0.0.1:{port}"):
        study.optimize(2, n_workers=2, executor=RayExecutor(address=f"127.0.0.1:{port}"))
    assert study.optuna_study.get_trials() == []


def test_workers_no_ray_node_can_run_are_refused(ray_cluster, make_study):
    """Each worker asking for more than any node has would wait for ever: refused."""
    study = make_study("big")
    executor = RayExecutor(
        address=ray_cluster, num_cpus=4, num_gpus=0.5, init={"_node_ip_address": "127.0.0.1"}
    )
    with pytest.raises(ConfigError, match=r"asks Ray for 4 CPUs and 0\.5 GPUs.*1 CPUs and 0 GPUs"):
        study.optimize(2, n_workers=2, executor=executor)
    assert study.optuna_study.get_trials() == []


def test_a_table_study_through_ray_stores_what_the_local_pool_stores(ray_cluster, tmp_path):
    from autosearch import Table
    from controllers import RandomSearch
    from search_spaces import NB201Space

    table = tmp_path / "nb201.csv"
    maker = ROOT / "benchmarks" / "make_nb201_table.py"
    subprocess.run([sys.executable, str(maker), str(table)], check=True, timeout=1800)
    # "auto": the placement rule's GPU fraction, none on this cluster of CPUs
    on_ray = RayExecutor(
        address=ray_cluster, num_gpus="auto", init={"_node_ip_address": "127.0.0.1"}
    )
    stored = {}
    for label, executor in (("pool", "process"), ("ray", on_ray)):
        study = autosearch.create_study(
            label,
            controller=RandomSearch(NB201Space(), seed=0),
            table=Table(path=str(table)),
            storage=f"sqlite:///{tmp_path}/{label}.db",
            **(_tracked(tmp_path) if label == "ray" else {}),
        )
        study.optimize(8, n_workers=2, executor=executor)
        stored[label] = {(r.arch.arch_id, r.accuracy, r.test_accuracy) for r in study.records()}
    assert len(stored["pool"]) == 8 and stored["ray"] == stored["pool"]
    assert on_ray.gpus_per_worker == 0.0
    # Ray's tasks tracked the trials they ran, in the study's experiment.
    trials = {r.trial for r in study.records()}
    assert _trial_runs(tmp_path, "ray") == trials and len(trials) == 8


def test_a_users_evaluator_trains_on_ray_workers(ray_cluster, make_study):
    """Ray's workers get the evaluator with their call (cloudpickle: a script's
    functions by value; a module's by reference, or by value where registered so); a
    module no node can import is said in one line."""
    import _evaluators
    from ray import cloudpickle

    executor = RayExecutor(address=ray_cluster, init={"_node_ip_address": "127.0.0.1"})
    study = make_study("own-on-ray", evaluator=_evaluators.fixed)
    with pytest.raises(ConfigError, match="a Ray worker cannot import module '_evaluators'"):
        study.optimize(2, n_workers=2, executor=executor)
    cloudpickle.register_pickle_by_value(_evaluators)
    try:
        records = study.optimize(4, n_workers=2, executor=executor)
    finally:
        cloudpickle.unregister_pickle_by_value(_evaluators)
    assert len(records) == 4 and {r.state for r in records} == {"complete"}
    for record in records:
        expected = _evaluators.fixed(_Arch(record.arch))["accuracy"]
        assert record.accuracy == pytest.approx(expected)


class _Arch:
    """What ``_evaluators.fixed`` reads of a candidate."""

    def __init__(self, arch) -> None:
        self.arch = arch


@pytest.mark.service
def test_a_ray_cluster_of_two_nodes_survives_a_killed_worker(
    ray_cluster, postgres_url, bucket, tiny_space, tmp_path
):
    """A worker killed one epoch into whichever trial it holds: Ray runs it again, and
    its trial is taken up at once from its checkpoint (its process is gone: no heartbeat
    grace a loaded machine could exceed decides it; the default 60 s stays). The
    driver's print is still Python's after Ray reported the dead worker."""
    import builtins
    import threading

    from controllers import RandomSearch

    printing = builtins.print
    name, _ = bucket
    aws = {k: os.environ[k] for k in os.environ if k.startswith("AWS_")}
    study = autosearch.create_study(
        "ray",
        controller=RandomSearch(tiny_space, seed=0),
        storage=postgres_url,
        artifacts=f"s3://{name}/ray",
        train=TrainConfig(epochs=8, batch_size=32, lr=0.05),  # seconds left after one epoch
    )
    executor = RayExecutor(
        address=ray_cluster,
        num_cpus=1,
        max_retries=3,
        env_vars=aws,
        init={"_node_ip_address": "127.0.0.1"},
    )
    killed: dict[str, int] = {}

    def running_one_epoch_in() -> list:
        return [
            t
            for t in study.optuna_study.get_trials(deepcopy=False)
            if t.state == TrialState.RUNNING and len(t.intermediate_values) >= 1
        ]

    def kill_one_worker() -> None:  # a trial one epoch in, whichever: SIGKILL its process
        _wait_for(running_one_epoch_in, "a running trial one epoch in")
        first = running_one_epoch_in()[0]
        pid = int(first.user_attrs["worker"].rsplit(":", 1)[1])
        killed.update(number=first.number, pid=pid)
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_one_worker, daemon=True)
    killer.start()
    records = study.optimize(4, n_workers=2, executor=executor)
    killer.join(timeout=1800)
    assert killed, "no worker was killed"
    assert len(records) == 4
    assert builtins.print is printing, builtins.print  # not Ray's progress-bar print
    trials = _complete_once(study, 4)
    cut = trials[killed["number"]]
    assert "died" in cut.user_attrs["superseded"] and cut.user_attrs["resume"]
    resumed = the_resume(trials, cut)
    assert resumed.state == TrialState.COMPLETE
    assert resumed.user_attrs["arch_id"] == cut.user_attrs["arch_id"]
    assert resumed.user_attrs["result"]["resumed_from_epoch"] >= 1  # not from scratch
    hosts = {t.user_attrs["worker"] for t in trials}
    assert len(hosts) >= 3  # two workers, and the one Ray started again
    shutil.rmtree(tmp_path, ignore_errors=True)


_TOKEN_STUDY = """from autosearch import StudySpec, TrainConfig
from controllers import RandomSearch
from search_spaces import ResNetSpace

study = StudySpec(
    name="token",
    controller=RandomSearch(ResNetSpace(max_stages=2, depths=(1,), widths=(4,)), seed=0),
    train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
    storage="sqlite:///token.db",
    n_trials=1,
)
"""


def test_a_ray_head_that_asks_for_a_token_gets_this_machines_or_is_named_in_one_line(
    tmp_path,
):
    """A user's ~/.ray/auth_token makes `ray start --head` ask every driver for a token,
    which Ray's driver sends to an explicit address only under RAY_AUTH_MODE=token. A
    head on this machine gets this machine's token, and the study runs; a driver that
    has no token gets one line that says what to do, not Ray's traceback, and nothing
    stored runs."""
    pytest.importorskip("ray", reason="the Ray executor is an extra: autosearch-nas[ray]")
    home, stranger = tmp_path / "home", tmp_path / "stranger"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("a" * 64)
    stranger.mkdir()
    tag, temp = _hermetic.new_tag(), tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    env = {**os.environ, "HOME": str(home), _hermetic.TAG: tag, "RAY_TMPDIR": temp}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    head = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--port", str(port)]
    local = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    (tmp_path / "s.py").write_text(_TOKEN_STUDY)
    cli = [str(Path(sys.executable).with_name("autosearch")), "run", "s.py", "--workers", "1"]
    cli += ["--executor", "ray", "--ray-address", f"127.0.0.1:{port}", "--no-export"]

    def run(home: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cli,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**env, "HOME": str(home)},
            timeout=1800,
        )

    try:
        subprocess.run(
            [*head, "--include-dashboard", "false", *local],
            check=True,
            capture_output=True,
            env=env,
            timeout=1800,
        )
        refused = run(stranger)
        study = autosearch.load_study("token", storage=f"sqlite:///{tmp_path}/token.db")
        stored_when_refused = study.optuna_study.get_trials()
        ran = run(home)
    finally:
        _hermetic.stop_tagged(tag, folder=temp)
        shutil.rmtree(temp, ignore_errors=True)
    assert refused.returncode == 2, refused.stderr[-3000:]
    (line,) = refused.stderr.strip().splitlines()  # one line, and only that
    assert "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert f"the Ray cluster at 127.0.0.1:{port} refused this process: it asks for a token" in line
    assert "Set RAY_AUTH_MODE=token here" in line
    assert stored_when_refused == []
    assert ran.returncode == 0, ran.stderr[-3000:]
    study = autosearch.load_study("token", storage=f"sqlite:///{tmp_path}/token.db")
    assert [t.state.name for t in study.optuna_study.get_trials()] == ["COMPLETE"]
