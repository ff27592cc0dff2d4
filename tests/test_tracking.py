"""A study shown live in MLflow and TensorBoard (autosearch/tracking): runs,
params, metrics and artifacts read back with MLflow's own client and TensorBoard's
event reader; a resumed trial continuing its run; a failed trial's run failed; two
workers; a tracker that refuses connections or hangs costing a trial nothing."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import pytest

import autosearch
from autosearch.errors import ConfigError
from autosearch.tracking import Tracking
from autosearch.tracking._sender import Sender

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")


def _client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(uri, study):
    client = _client(uri)
    experiment = client.get_experiment_by_name(study)
    assert experiment is not None, f"no experiment {study!r} at {uri}"
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    by_role = {}
    for run in runs:
        by_role.setdefault(run.data.tags.get("autosearch.role", "trial"), []).append(run)
    return by_role


def _scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def test_settings_are_checked_and_local_paths_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    made = Tracking.of(mlflow="sqlite:///mlflow.db", tensorboard="tb")
    assert made.mlflow == f"sqlite:///{tmp_path}/mlflow.db"
    assert made.tensorboard == str(tmp_path / "tb")
    assert Tracking.of(mlflow="http://127.0.0.1:5000").mlflow == "http://127.0.0.1:5000"
    assert Tracking.of(mlflow="runs/mlflow.db").mlflow == f"sqlite:///{tmp_path}/runs/mlflow.db"
    # MLflow 3 writes no more to a folder (its file store): refused, naming a database.
    for folder in ("runs/mlruns", f"file://{tmp_path}/mlruns", str(tmp_path)):
        with pytest.raises(ConfigError, match=r"is a folder .*use a database, e\.g\. sqlite"):
            Tracking.of(mlflow=folder)
    assert Tracking.of(mlflow=True).mlflow.startswith("sqlite:////")  # MLflow's default
    assert Tracking.from_json(made.to_json()) == made
    assert not Tracking.from_json("damaged").on
    with pytest.raises(ConfigError, match="expected a tracking URI"):
        Tracking.of(mlflow=5)
    with pytest.raises(ConfigError, match="expected a folder"):
        Tracking.of(tensorboard="")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "mlflow" else real(n, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'autosearch-nas\[mlflow\]'"):
        Tracking.of(mlflow="sqlite:///x.db")


def test_a_tracker_that_fails_or_hangs_never_holds_the_caller(caplog):
    sender = Sender("a tool")
    release = threading.Event()
    sender.send(release.wait)  # hangs until released
    for _ in range(1000):
        sender.send(lambda: None)  # returns at once: queued
    with caplog.at_level(logging.WARNING):
        assert sender.close(timeout=0.2) is False
    assert "did not answer within 0.2 s; 1001 update(s)" in caplog.text
    release.set()
    caplog.clear()
    # A first call that makes the client (imports, a new store's tables) may take longer
    # than later ones before the tool counts as stalled: it is waited for, and the rest.
    slow_start = Sender("a tool that starts slowly", setup=60)
    sent = []
    slow_start.send(time.sleep, 0.5)
    slow_start.send(sent.append, 1)
    assert slow_start.close(timeout=0.05) is True and sent == [1]
    failing = Sender("another tool")
    calls = []

    def broken():
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    failing.send(broken)
    failing.send(calls.append, 1)
    with caplog.at_level(logging.WARNING):
        assert failing.close(timeout=60) is False
    assert calls == [] and failing.down.startswith("ConnectionRefusedError")
    (said,) = caplog.records
    assert "another tool failed (ConnectionRefusedError" in said.getMessage()
    assert "the study goes on" in said.getMessage()


def test_a_tracker_at_work_is_waited_for_however_busy_the_machine(caplog):
    """The end of a run waits on the tracker's progress, not on the clock: a call that
    computes (importing the tool, making a store) for longer than the timeout is waited
    for; one that blocks without using CPU, or computes past the runaway bound, is not."""

    def compute(seconds, then=None):
        start = time.thread_time()
        while time.thread_time() - start < seconds:
            pass
        if then is not None:
            then.append(seconds)

    sent = []
    working = Sender("a tool at work")
    working.send(compute, 0.6)  # several windows of 0.1 s, each with CPU used
    working.send(compute, 0.0, sent)
    assert working.close(timeout=0.1) is True and sent == [0.0]
    release = threading.Event()
    runaway = Sender("a runaway tool", runaway=0.3)
    runaway.send(lambda: [compute(0.01) for _ in iter(release.is_set, True)])
    runaway.send(sent.append, "never")
    with caplog.at_level(logging.WARNING):
        assert runaway.close(timeout=0.1) is False
    release.set()
    assert "a runaway tool used over 0.3 CPU seconds on one call; 2 update(s)" in caplog.text
    assert sent == [0.0] and runaway.down.startswith("used over 0.3 CPU seconds")


_KILLED_MAKING = """
import os, signal, sys
from sqlalchemy import Table, event
# Killed the moment MLflow's migrations have made this table: the state of a process
# stopped midway through making a store (the rest of the tables and the schema's
# version not yet there).
event.listen(Table, "after_create", lambda table, *a, **k: table.name == sys.argv[2]
             and os.kill(os.getpid(), signal.SIGKILL))
if sys.argv[3] == "autosearch":  # the module alone (it needs only MLflow): no torch to load
    import importlib.util
    spec = importlib.util.spec_from_file_location("mlflow_runs", sys.argv[4])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.MLflowRuns(sys.argv[1], "s", "uid").client()
else:  # MLflow's own client, which makes a new store's tables in place
    from mlflow.tracking import MlflowClient
    MlflowClient(tracking_uri=sys.argv[1]).search_experiments()
"""


@pytest.mark.parametrize("maker", ["autosearch", "mlflow"])
def test_a_store_whose_maker_is_killed_midway_is_never_left_half_made(tmp_path, maker):
    import subprocess
    import sys

    from autosearch.tracking import mlflow_runs
    from autosearch.tracking.mlflow_runs import MLflowRuns

    store = tmp_path / "mlflow.db"
    uri = f"sqlite:///{store}"
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_MAKING, uri, "spans", maker, mlflow_runs.__file__],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    runs = MLflowRuns(uri, "s", "uid")
    if maker == "autosearch":
        # Its tables were made in a file of its own: the store is not there, and the
        # next process makes it whole.
        assert not store.exists() and len(list(tmp_path.glob(".mlflow.db.*.making"))) == 1
        runs.client()
        assert _client(uri).get_experiment_by_name("s").tags["autosearch.uid"] == "uid"
        assert _tables(store) >= {"spans", "alembic_version"}
    else:
        # MLflow's own making, stopped midway, is a store MLflow cannot open again:
        # named as such, with what to do.
        with pytest.raises(RuntimeError, match=rf"the MLflow store {store} is half made"):
            runs.client()
        with pytest.raises(Exception, match="already exists"):
            _client(uri).search_experiments()


def _tables(store):
    """The names of the tables in the SQLite file ``store``."""
    import sqlite3

    with sqlite3.connect(store) as db:
        return {
            name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }


def test_a_study_in_mlflow_and_tensorboard(make_study, tmp_path):
    """Each trial a run nested under the study's, its genes and settings as params,
    its epochs as step metrics, every variant's figures and its state at the end,
    ``arch.json`` as an artifact; TensorBoard's scalars and hparams per trial."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # Accuracy against bytes: the smallest point is an int8 estimate, on the front
    # whatever the two trials' accuracies, so one int8 is measured after the search.
    study = make_study(
        variants=("base", "int8"),
        objectives=("accuracy", "bytes"),
        mlflow=uri,
        tensorboard=str(tmp_path / "tb"),
    )
    done = study.optimize(2)
    runs = _runs(uri, "t")
    (parent,) = runs["study"]
    trials = sorted(runs["trial"], key=lambda r: int(r.data.tags["autosearch.trial"]))
    assert [int(r.data.tags["autosearch.trial"]) for r in trials] == [0, 1]
    client = _client(uri)
    measured = 0
    for run, record in zip(trials, [r for r in done if r.is_base], strict=True):
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        assert run.info.status == "FINISHED" and tags["autosearch.state"] == "complete"
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert tags["autosearch.controller"] == "random"
        assert tags["autosearch.arch_id"] == record.arch.arch_id
        for gene, value in record.arch.genes.items():
            assert params[gene] == str(value)
        assert params["train.epochs"] == str(study.definition.train.epochs)
        assert params["train.lr"] == str(study.definition.train.lr)
        assert metrics["accuracy"] == pytest.approx(record.accuracy)
        assert metrics["flops"] == record.metrics["flops"]
        int8 = study.trials.record(record.trial, "int8")
        assert metrics["int8.accuracy_estimate"] == pytest.approx(
            int8.metrics.get("accuracy_estimate", int8.accuracy)
        )
        if int8.metrics.get("accuracy_estimate") is not None:  # on the front: measured after
            assert metrics["int8.accuracy"] == pytest.approx(int8.accuracy)
            assert tags["autosearch.figures.int8"] == "measured"
            measured += 1
        else:
            assert tags["autosearch.figures.int8"] == "accuracy estimated (fake quantization)"
        history = client.get_metric_history(run.info.run_id, "val_accuracy")
        assert sorted(m.step for m in history) == list(range(1, study.definition.train.epochs + 1))
        arch = client.download_artifacts(run.info.run_id, "arch.json", str(tmp_path))
        assert autosearch.Architecture.from_json(open(arch).read()) == record.arch
    assert measured >= 1
    assert parent.data.params["controller"] == "random" and parent.info.status == "FINISHED"
    assert (tmp_path / "mlartifacts").is_dir()  # beside the SQLite store
    board = tmp_path / "tb" / "t"
    for record in done:
        if record.is_base:
            scalars = _scalars(board / f"trial-{record.trial:05d}")
            steps = [s for s, _ in scalars["val/accuracy"]]
            assert steps == list(range(1, study.definition.train.epochs + 1))
            assert scalars["hparam/accuracy"][0][1] == pytest.approx(record.accuracy)
    front = _scalars(board / "front")["front/accuracy"]
    assert sorted(front) == sorted(
        (round(r.flops), pytest.approx(r.accuracy)) for r in study.pareto()
    )


def test_a_resumed_trial_continues_its_run_and_a_failed_one_is_marked_failed(make_study, tmp_path):
    import os
    import signal

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    study = make_study(train=autosearch.TrainConfig(epochs=3, batch_size=128, lr=0.1), mlflow=uri,
                       tensorboard=str(tmp_path / "tb"))  # fmt: skip

    def ctrl_c(trial, epoch):
        if epoch.epoch == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        study.optimize(1, epoch_callbacks=[ctrl_c])
    (cut,) = _runs(uri, "t")["trial"]
    assert cut.info.status == "KILLED" and cut.data.tags["autosearch.state"] == "interrupted"
    (done,) = study.optimize(1)
    (run,) = _runs(uri, "t")["trial"]
    assert run.info.run_id == cut.info.run_id and run.info.status == "FINISHED"
    assert run.data.tags["autosearch.trial"] == str(done.trial) != "0"
    history = _client(uri).get_metric_history(run.info.run_id, "val_accuracy")
    assert sorted({m.step for m in history}) == [1, 2, 3]
    # One curve in the first attempt's folder: epoch 1 from it, 2 and 3 from the resume.
    assert sorted(p.name for p in (tmp_path / "tb" / "t").glob("trial-*")) == ["trial-00000"]
    scalars = _scalars(tmp_path / "tb" / "t" / "trial-00000")
    assert [s for s, _ in scalars["val/accuracy"]] == [1, 2, 3]

    from autosearch.evaluation import runner

    def broken(*args, **kwargs):
        raise RuntimeError("the candidate's loss is NaN")

    import unittest.mock

    with unittest.mock.patch.object(runner, "train_candidate", broken):
        (failed,) = study.optimize(1)
    assert failed.state == "failed"
    (run,) = [
        r for r in _runs(uri, "t")["trial"] if r.data.tags["autosearch.trial"] == str(failed.trial)
    ]
    assert run.info.status == "FAILED" and run.data.tags["autosearch.state"] == "failed"
    assert "the candidate's loss is NaN" in run.data.tags["autosearch.reason"]


@pytest.mark.slow
def test_a_killed_workers_unsent_epoch_reaches_the_resumed_run(make_study, tmp_path):
    """A worker SIGKILLed after an epoch was checkpointed but before its batched upload
    left: the resumed trial's run missed that epoch (59 of 60 steps). Its end now sends
    the epochs before the resume that the run lacks."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    study = make_study(train=autosearch.TrainConfig(epochs=3, batch_size=128, lr=0.1), mlflow=uri)
    worker = subprocess.run(
        [str(Path(sys.executable).with_name("autosearch")), "worker", "--study", "t",
         "--storage", study.storage_url, "--n-trials", "1"],
        env={**os.environ, "AUTOSEARCH_FAILPOINTS": "epoch.saved=kill@1"},
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert worker.returncode == -signal.SIGKILL, worker.stderr[-2000:]
    assert "autosearch failpoint epoch.saved: kill" in worker.stderr
    (done,) = study.optimize(1)
    assert done.state == "complete"
    (run,) = _runs(uri, "t")["trial"]
    assert run.info.status == "FINISHED"
    client = _client(uri)
    for name in ("val_accuracy", "train_loss", "val_loss"):
        history = client.get_metric_history(run.info.run_id, name)
        assert sorted(m.step for m in history) == [1, 2, 3], name  # each once


def test_a_tracker_that_refuses_connections_costs_the_study_one_line(make_study, tmp_path, caplog):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    study = make_study(mlflow=f"http://127.0.0.1:{port}")
    with caplog.at_level(logging.WARNING, logger="autosearch"):
        done = study.optimize(2)
    assert [r.state for r in done] == ["complete", "complete"]
    said = [r.getMessage() for r in caplog.records if "MLflow at" in r.getMessage()]
    assert len(said) == 1 and "does not answer" in said[0] and "the study goes on" in said[0]


def test_tracking_is_stored_with_the_study_and_switched_on_later(make_study, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    study = make_study()
    assert not study.tracking.on
    study.track(mlflow=uri)
    again = autosearch.load_study("t", storage=f"sqlite:///{tmp_path}/t.db")
    assert again.tracking == Tracking(mlflow=uri)
    again.optimize(1)
    assert len(_runs(uri, "t")["trial"]) == 1
    kept = make_study(load_if_exists=True)  # created again without tracking: it stays on
    assert kept.tracking.mlflow == uri
    with pytest.raises(ConfigError, match="is the study's own storage"):
        kept.track(mlflow=f"sqlite:///{tmp_path}/t.db")
    kept.track(mlflow=False)
    assert not autosearch.load_study("t", storage=f"sqlite:///{tmp_path}/t.db").tracking.on


@pytest.mark.slow
def test_two_workers_track_their_trials_into_one_experiment(tmp_path):
    import subprocess
    import sys
    import textwrap

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = textwrap.dedent(
        f"""
        import autosearch
        from autosearch import TrainConfig
        from controllers import RandomSearch
        from search_spaces import ResNetSpace
        space = ResNetSpace(min_stages=2, max_stages=2, depths=(1,), widths=(4,),
                            stem_widths=(4, 8), blocks=("basic",))
        study = autosearch.create_study(
            "p", controller=RandomSearch(space, seed=0), storage="sqlite:///{tmp_path}/p.db",
            train=TrainConfig(epochs=2, batch_size=128, lr=0.1), mlflow="{uri}",
            tensorboard="{tmp_path}/tb")
        study.optimize(4, n_workers=2)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "failed" not in done.stderr, done.stderr[-2000:]
    runs = _runs(uri, "p")
    assert len(runs["study"]) == 1
    trials = runs["trial"]
    assert sorted(int(r.data.tags["autosearch.trial"]) for r in trials) == [0, 1, 2, 3]
    assert all(r.info.status == "FINISHED" for r in trials)
    assert len({r.data.tags["autosearch.worker"] for r in trials}) == 2  # each worker's own
    assert {r.data.tags["mlflow.parentRunId"] for r in trials} == {runs["study"][0].info.run_id}
    assert runs["study"][0].info.status == "FINISHED"  # ended by the pool's parent
    boards = sorted(p.name for p in (tmp_path / "tb" / "p").iterdir())
    assert boards == ["front", "trial-00000", "trial-00001", "trial-00002", "trial-00003"]


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` on 127.0.0.1 (a SQLite store and an artifact folder of its
    own), its processes tagged so that exactly they are stopped afterwards."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    import _hermetic

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tag = _hermetic.new_tag()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path}/server.db",
         "--artifacts-destination", str(tmp_path / "server-artifacts")],
        # Without MLflow's job runner (its GenAI jobs' huey consumers: six more busy
        # processes), which nothing here uses.
        env={**os.environ, _hermetic.TAG: tag, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "server.log", "w"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # bounds a broken start only
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5):
                    break
            except OSError:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "mlflow server never answered"
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        finally:
            _hermetic.stop_tagged(tag)


@pytest.mark.slow
def test_a_tracking_server_and_its_web_page_list_the_studys_runs(
    make_study, mlflow_server, tmp_path
):
    """A study tracked to a real ``mlflow server``: its runs read back through MLflow's
    client over HTTP, and listed on MLflow's own web page (headless Chromium: the
    study's run, with its trials' nested under it, on the experiment's runs page)."""
    import shutil
    import subprocess

    import numpy as np
    from PIL import Image

    study = make_study("served", mlflow=mlflow_server)
    done = study.optimize(2)
    client = _client(mlflow_server)
    experiment = client.get_experiment_by_name("served")
    trials = [r for r in client.search_runs([experiment.experiment_id])
              if r.data.tags.get("autosearch.role") != "study"]  # fmt: skip
    assert sorted(r.info.run_name for r in trials) == [f"trial {r.trial}" for r in done]
    assert all(r.info.status == "FINISHED" for r in trials)
    (arch,) = client.list_artifacts(trials[0].info.run_id)
    assert arch.path == "arch.json"

    browser = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
    if browser is None:
        import os

        if os.environ.get("AUTOSEARCH_REQUIRE_BROWSER"):
            pytest.fail("Chromium is required here (.ci/run installs Debian's chromium)")
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    page = f"{mlflow_server}/#/experiments/{experiment.experiment_id}/runs"
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--disable-background-networking", "--no-first-run",
              f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=30000",
              "--window-size=1400,1000"]  # fmt: skip
    shot = tmp_path / "mlflow.png"  # one browser run: the page's DOM and its picture
    dom = subprocess.run(
        [*common, "--dump-dom", f"--screenshot={shot}", page],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    import re

    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))
    # The study's run, its trials nested under it (collapsed): all of them counted.
    assert "Training runs" in text and " served " in text, text[-3000:]
    assert re.search(rf"\b{len(done) + 1} matching runs", text), text[-3000:]
    pixels = np.asarray(Image.open(shot).convert("L"))
    assert pixels.shape == (1000, 1400) and pixels.std() > 10  # a drawn page, not a blank one


_STUDY_FILE = """
from autosearch import StudySpec, TrainConfig
from controllers import RandomSearch
from search_spaces import ResNetSpace

study = StudySpec(
    name="logged",
    controller=RandomSearch(
        ResNetSpace(max_stages=2, depths=(1,), widths=(4, 8), stem_widths=(4,)), seed=0
    ),
    train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
    n_trials=2,
)
"""

# In a fresh process where autosearch cannot be imported: the logged model needs only
# torch, numpy and MLflow. Prints the pyfunc's logits on the images given.
_LOAD_WITHOUT_AUTOSEARCH = """
import sys, json
sys.modules["autosearch"] = None  # any import of it fails
import mlflow, numpy as np
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
images = np.load(sys.argv[3])
print(json.dumps(model.predict(images).tolist()))
"""


@pytest.mark.slow
def test_a_cli_study_tracked_and_its_export_logged_as_a_model(tmp_path, monkeypatch, capsys):
    """`run --mlflow` tracks the study; `export --mlflow --register` logs the export
    folder as a model in the exported trial's run, registered, that loads and predicts
    like the folder's own model.py in a process without autosearch."""
    import json
    import subprocess
    import sys

    import numpy as np
    import torch

    from autosearch.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(_STUDY_FILE)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert main(["run", "s.py", "--mlflow", uri, "--no-export"]) == 0  # exported below
    # A worker joining later tracks where the study is tracked; --tensorboard adds a tool.
    storage = f"sqlite:///{tmp_path}/runs/logged/study.db"
    worker = ["worker", "--study", "logged", "--storage", storage, "--n-trials", "1"]
    assert main([*worker, "--tensorboard", "tb"]) == 0
    runs = _runs(uri, "logged")
    assert len(runs["trial"]) == 3 and all(r.info.status == "FINISHED" for r in runs["trial"])
    assert [p.name for p in (tmp_path / "tb" / "logged").glob("trial-*")] == ["trial-00002"]
    capsys.readouterr()

    # The URI stored with the study is where the export goes when none is given.
    argv = ["export", "s.py", "--trial", "1", "--out", "exp", "--mlflow", "--register", "tiny"]
    assert main([*argv, "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["mlflow"]
    (trial_run,) = [r for r in runs["trial"] if r.data.tags["autosearch.trial"] == "1"]
    assert said["run"] == trial_run.info.run_id
    client = _client(uri)
    (version,) = client.search_model_versions("name = 'tiny'")
    assert str(version.version) == "1" and version.run_id == trial_run.info.run_id
    logged = client.get_run(trial_run.info.run_id)
    assert logged.info.status == "FINISHED"  # the trial's run, ended again as it was

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 1, 8, 8), dtype=np.uint8)
    np.save(tmp_path / "images.npy", images)
    loaded = subprocess.run(
        [sys.executable, "-c", _LOAD_WITHOUT_AUTOSEARCH, uri, said["model"], "images.npy"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    predicted = torch.tensor(json.loads(loaded.stdout.splitlines()[-1]))
    sys.path.insert(0, str(tmp_path / "exp"))
    try:
        import model as exported

        expected = exported.load()(exported.preprocess(torch.from_numpy(images)))
    finally:
        sys.path.remove(str(tmp_path / "exp"))
        sys.modules.pop("model", None)
    torch.testing.assert_close(predicted, expected.detach(), rtol=1e-5, atol=1e-5)

    # Refused before anything is written: a registry name without MLflow, a bad URI.
    assert main(["export", "s.py", "--out", "e2", "--register", "x"]) == 2
    assert "add --mlflow" in capsys.readouterr().err
    assert main(["export", "s.py", "--out", "e3", "--mlflow", "ftp://host/x"]) == 2
    assert "ftp://host/x" in capsys.readouterr().err
    assert not (tmp_path / "e2").exists() and not (tmp_path / "e3").exists()
