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
import time
from pathlib import Path

import pytest
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
    pytest.importorskip("submitit", reason="the Slurm executor is an extra: autosearch[slurm]")
    from controllers import RandomSearch

    study = autosearch.create_study(
        "slurm",
        controller=RandomSearch(tiny_space, seed=0),
        storage=f"sqlite:///{tmp_path}/s.db",
        artifacts=str(tmp_path / "artifacts"),
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
    )
    jobs = SlurmExecutor(folder=str(tmp_path / "jobs"), cluster="local", timeout_min=30)
    records = study.optimize(4, n_workers=2, executor=jobs)
    assert len(records) == 4 and all(r.state == "complete" for r in records)
    trials = _complete_once(study, 4)
    assert {t.user_attrs["pool_slot"] for t in trials} == {0, 1}  # both jobs worked
    assert len(list((tmp_path / "jobs").glob("*_result.pkl"))) == 2  # submitit's own record


def _ray(*args: str) -> None:
    ray = Path(sys.executable).with_name("ray")
    subprocess.run([str(ray), *args], check=True, capture_output=True, timeout=1800)


@pytest.fixture(scope="module")
def ray_cluster():
    """A head and a second node on 127.0.0.1, one CPU each; stopped afterwards."""
    pytest.importorskip("ray", reason="the Ray executor is an extra: autosearch[ray]")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    try:
        _ray("start", "--head", "--port", str(port), "--include-dashboard", "false", *common)
        _ray("start", "--address", address, *common)
        yield address
    finally:
        import ray

        ray.shutdown()
        _ray("stop", "--force")


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
    pytest.importorskip("ray", reason="the Ray executor is an extra: autosearch[ray]")
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
        )
        study.optimize(8, n_workers=2, executor=executor)
        stored[label] = {(r.arch.arch_id, r.accuracy, r.test_accuracy) for r in study.records()}
    assert len(stored["pool"]) == 8 and stored["ray"] == stored["pool"]
    assert on_ray.gpus_per_worker == 0.0


@pytest.mark.service
def test_a_ray_cluster_of_two_nodes_survives_a_killed_worker(
    ray_cluster, postgres_url, bucket, tiny_space, tmp_path
):
    import threading

    from controllers import RandomSearch

    name, _ = bucket
    beats = {"AUTOSEARCH_HEARTBEAT_INTERVAL": "0.3", "AUTOSEARCH_HEARTBEAT_GRACE": "3"}
    aws = {k: os.environ[k] for k in os.environ if k.startswith("AWS_")}
    study = autosearch.create_study(
        "ray",
        controller=RandomSearch(tiny_space, seed=0),
        storage=postgres_url,
        artifacts=f"s3://{name}/ray",
        train=TrainConfig(epochs=4, batch_size=16, lr=0.05),
    )
    executor = RayExecutor(
        address=ray_cluster,
        num_cpus=1,
        max_retries=3,
        env_vars={**aws, **beats},
        init={"_node_ip_address": "127.0.0.1"},
    )
    killed: dict[str, int] = {}

    def kill_one_worker() -> None:  # the first trial one epoch in: SIGKILL its process
        def started() -> bool:
            trials = study.optuna_study.get_trials(deepcopy=False)
            return bool(trials) and len(trials[0].intermediate_values) >= 1

        _wait_for(started, "trial 0 one epoch in")
        first = study.optuna_study.get_trials(deepcopy=False)[0]
        pid = int(first.user_attrs["worker"].rsplit(":", 1)[1])
        killed.update(number=first.number, pid=pid)
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_one_worker, daemon=True)
    killer.start()
    records = study.optimize(4, n_workers=2, executor=executor)
    killer.join(timeout=1800)
    assert killed, "no worker was killed"
    assert len(records) == 4
    trials = _complete_once(study, 4)
    cut = trials[killed["number"]]
    assert "died" in cut.user_attrs["superseded"] and cut.user_attrs["resume"]
    (resumed,) = [t for t in trials if t.user_attrs.get("resumes") == cut.number]
    assert resumed.state == TrialState.COMPLETE
    assert resumed.user_attrs["arch_id"] == cut.user_attrs["arch_id"]
    assert resumed.user_attrs["result"]["resumed_from_epoch"] >= 1  # not from scratch
    hosts = {t.user_attrs["worker"] for t in trials}
    assert len(hosts) >= 3  # two workers, and the one Ray started again
    shutil.rmtree(tmp_path, ignore_errors=True)
