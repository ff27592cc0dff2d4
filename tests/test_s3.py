"""Weights and checkpoints on S3-compatible object storage, against a real S3 server
(moto's, on 127.0.0.1): trials store their weights in the bucket, and a trial cut short
resumes from its epoch on a worker that never saw the first one's disk."""

from __future__ import annotations

import os
import shutil
import signal

import pytest

import autosearch
from autosearch import TrainConfig

pytest.importorskip("boto3", reason="S3 artifacts are an extra: pip install 'autosearch-nas[s3]'")
moto_server = pytest.importorskip(
    "moto.server", reason="the S3 tests start moto's server: pip install 'moto[server]'"
)

pytestmark = [pytest.mark.slow, pytest.mark.service]


def _keys(client, bucket: str) -> list[str]:
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_weights_live_in_the_bucket_and_checkpoints_go_when_complete(bucket, tmp_path, tiny_space):
    from controllers import RandomSearch

    name, client = bucket
    study = autosearch.create_study(
        "s3",
        controller=RandomSearch(tiny_space, seed=0),
        storage=f"sqlite:///{tmp_path}/s.db",
        artifacts=f"s3://{name}/studies/s3",
        train=TrainConfig(epochs=2, batch_size=128, lr=0.1),
    )
    (record,) = study.optimize(1)
    keys = _keys(client, name)
    assert len(keys) == 1 and keys[0].startswith("studies/s3/weights/")  # no checkpoint left
    model = study.load_model(record)  # read back from the bucket
    assert sum(p.numel() for p in model.parameters()) == record.params
    assert not any(study._artifacts.folder.rglob("*.pt"))  # nothing kept on this disk


def test_a_cut_trial_resumes_from_the_bucket_on_a_fresh_disk(bucket, tmp_path, tiny_space):
    """Objects of other shapes in the bucket (a key climbing out of the work folder, a
    stray object where an attempt's folder is, an unreadable variant result) are
    skipped: nothing lands outside the attempt's folder, and the trial resumes."""
    from controllers import RandomSearch

    name, client = bucket
    url = f"sqlite:///{tmp_path}/s.db"
    study = autosearch.create_study(
        "cut",
        controller=RandomSearch(tiny_space, seed=0),
        storage=url,
        artifacts=f"s3://{name}/cut",
        train=TrainConfig(epochs=3, batch_size=128, lr=0.1),
        variants=("base", "prune-l1@0.5"),
    )

    def stop_after_two(trial: int, epoch) -> None:  # as Ctrl-C would: after the checkpoint
        if epoch.epoch == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    assert study.optimize(1, epoch_callbacks=[stop_after_two]) == []
    cut = study.optuna_study.get_trials()[0]
    assert "interrupted" in cut.user_attrs["superseded"] and cut.user_attrs["resume"]
    arch_id = cut.user_attrs["arch_id"]
    work = f"cut/checkpoints/{study._artifacts.study}/{arch_id}"  # keyed by the study too
    assert f"{work}/0/train.pt" in _keys(client, name)
    shutil.rmtree(study._artifacts.folder)  # another machine: this disk's copy is gone
    escape = tmp_path / "escape" / "zz.pth"
    planted = {
        f"{work}/0/{'../' * 40}{str(escape).lstrip('/')}": b"import os",
        f"{work}/0/..": b"x",
        f"{work}/0": b"a stray object where a folder is",
        f"{work}/9": b"an attempt with no file",
        f"{work}/0/variants/prune-l1@0.5.json": b"\x00not json",
    }
    for key, body in planted.items():
        client.put_object(Bucket=name, Key=key, Body=body)
    assert set(planted) <= set(_keys(client, name))  # the server keeps the keys as given

    again = autosearch.load_study("cut", storage=url)
    done = again.optimize(1)
    assert len(done) == 1 and done[0].state == "complete"
    attrs = again.optuna_study.get_trials()[done[0].trial].user_attrs
    assert done[0].arch.arch_id == arch_id and attrs["resumes"] == 0
    assert attrs["result"]["resumed_from_epoch"] == 2  # epochs 1-2 came from the bucket
    assert not escape.parent.exists()  # nothing written outside the attempt's folder
    # The variant's unreadable result was derived again, not taken as a failure.
    (variant,) = [r for r in again.records() if r.variant == "prune-l1@0.5"]
    assert variant.state == "complete"
    assert [k for k in _keys(client, name) if "/checkpoints/" in k] == []


def test_a_missing_bucket_is_refused_before_any_trial(bucket, tmp_path, tiny_space):
    from autosearch.errors import PlatformError
    from controllers import RandomSearch

    study = autosearch.create_study(
        "gone",
        controller=RandomSearch(tiny_space, seed=0),
        storage=f"sqlite:///{tmp_path}/s.db",
        artifacts="s3://no-such-bucket/x",
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
    )
    with pytest.raises(PlatformError, match=r"s3://no-such-bucket/x.*does not exist"):
        study.optimize(1)
    assert study.optuna_study.get_trials() == []  # refused before anything ran


def test_a_study_made_again_at_the_same_url_resumes_nothing_of_the_first(
    bucket, tmp_path, tiny_space
):
    """A study cut short leaves its work in this machine's cache of the bucket; a new
    study of the same name at the same URL (the first's storage deleted, the bucket
    emptied) trains its trials from the first epoch, not from the leftovers."""
    from controllers import RandomSearch

    name, client = bucket

    def make(storage: str):
        return autosearch.create_study(
            "again",
            controller=RandomSearch(tiny_space, seed=0),
            storage=storage,
            artifacts=f"s3://{name}/again",
            train=TrainConfig(epochs=2, batch_size=128, lr=0.1),
        )

    first = make(f"sqlite:///{tmp_path}/first.db")

    def stop_after_one(trial: int, epoch) -> None:
        if epoch.epoch == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    assert first.optimize(1, epoch_callbacks=[stop_after_one]) == []
    assert any(first._artifacts.folder.rglob("train.pt"))  # the leftover, on this disk
    for key in _keys(client, name):
        client.delete_object(Bucket=name, Key=key)

    second = make(f"sqlite:///{tmp_path}/second.db")
    seen: list[int] = []
    (done,) = second.optimize(1, epoch_callbacks=[lambda trial, epoch: seen.append(epoch.epoch)])
    assert done.state == "complete" and seen == [1, 2]
    result = second.optuna_study.get_trials()[done.trial].user_attrs["result"]
    assert not result.get("resumed_from_epoch")


def test_a_bucket_failing_mid_trial_keeps_the_trial_and_its_whole_curve(
    bucket, tmp_path, tiny_space
):
    """A push that fails after an epoch is the platform's failure: the trial stays
    resumable, and its resumed learning curve holds every epoch trained."""
    from autosearch.errors import PlatformError
    from controllers import RandomSearch

    name, client = bucket
    url = f"sqlite:///{tmp_path}/s.db"
    study = autosearch.create_study(
        "flaky",
        controller=RandomSearch(tiny_space, seed=0),
        storage=url,
        artifacts=f"s3://{name}/flaky",
        train=TrainConfig(epochs=3, batch_size=128, lr=0.1),
    )

    def break_the_bucket(trial: int, epoch) -> None:
        if epoch.epoch == 1:
            for key in _keys(client, name):
                client.delete_object(Bucket=name, Key=key)
            client.delete_bucket(Bucket=name)

    with pytest.raises(PlatformError, match="object storage"):
        study.optimize(1, epoch_callbacks=[break_the_bucket])
    (cut,) = study.optuna_study.get_trials()
    assert cut.user_attrs["resume"] is True and study.records() == []
    assert sorted(cut.intermediate_values) == [1, 2]  # epoch 2 was trained and recorded

    client.create_bucket(Bucket=name)
    again = autosearch.load_study("flaky", storage=url)
    (done,) = again.optimize(1)
    trial = again.optuna_study.get_trials()[done.trial]
    assert trial.user_attrs["result"]["resumed_from_epoch"] == 2  # this disk's checkpoint
    assert sorted(trial.intermediate_values) == [1, 2, 3]


def test_damaged_weights_in_the_bucket_are_named_in_one_line(bucket, tmp_path, tiny_space, capsys):
    from autosearch.cli import main
    from controllers import RandomSearch

    name, client = bucket
    url = f"sqlite:///{tmp_path}/s.db"
    study = autosearch.create_study(
        "bad",
        controller=RandomSearch(tiny_space, seed=0),
        storage=url,
        artifacts=f"s3://{name}/bad",
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
    )
    study.optimize(1)
    (key,) = [k for k in _keys(client, name) if "/weights/" in k]
    client.put_object(Bucket=name, Key=key, Body=os.urandom(4096))
    code = main(["export", "--study", "bad", "--storage", url, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err and len(err.splitlines()) == 1
    assert f"s3://{name}/bad/weights/{key.rsplit('/', 1)[1]}" in err and "damaged" in err


SUPERNET_FILE = """
from autosearch import StudySpec, SupernetConfig, TrainConfig
from controllers import RandomSearch
from search_spaces import ResNetSpace

space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16))
study = StudySpec(
    name="sn",
    controller=RandomSearch(space.supernet(fixed={"stages": 2}), seed=0),
    train=TrainConfig(epochs=8, batch_size=32, lr=0.05),
    supernet=SupernetConfig(sandwich=1, latency=False),
    storage="sqlite:///study.db",
    n_trials=1,
)
"""


def _killed_supernet(name: str, client, tmp_path) -> tuple[str, int]:
    """Run `autosearch supernet` on SUPERNET_FILE with its artifacts in the bucket and
    kill it once its first checkpoint is there: that checkpoint's key, and its epoch."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    import torch

    (tmp_path / "sn.py").write_text(SUPERNET_FILE)
    cli = [str(Path(sys.executable).with_name("autosearch")), "supernet", "sn.py"]
    cli += ["--artifacts", f"s3://{name}/sn"]
    run = subprocess.Popen(cli, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for _ in range(36000):  # waits on the bucket's state; the bound keeps a hang out
            if any(k.endswith("/train.pt") for k in _keys(client, name)) or run.poll() is not None:
                break
            time.sleep(0.05)
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=1800)
    finally:
        run.kill()
    (checkpoint,) = [k for k in _keys(client, name) if k.endswith("/train.pt")]
    client.download_file(name, checkpoint, str(tmp_path / "cut.pt"))
    return checkpoint, torch.load(tmp_path / "cut.pt", weights_only=True)["epoch"]


def test_a_killed_supernet_resumes_from_the_bucket_past_stray_objects(
    bucket, tmp_path, monkeypatch
):
    """The supernet's checkpoint lives in the bucket: killed mid-training, it resumes on
    a disk that never saw it. Objects of every shape a listing may hold under its folder
    (a name over 255 bytes, a file where a folder must go, an empty name, unicode) are
    skipped with a log line, never a run that exits 2 until someone deletes them."""
    import torch

    name, client = bucket
    # The killed worker's claim is taken over at once: its process is gone.
    checkpoint, cut = _killed_supernet(name, client, tmp_path)
    folder = checkpoint.rsplit("/", 2)[0]  # sn/supernet/JOB
    study = autosearch.load_study("sn", storage=f"sqlite:///{tmp_path}/study.db")
    shutil.rmtree(study._artifacts.folder)  # another machine: this disk's copy is gone
    for key in (
        f"{folder}/0/{'x' * 300}",
        f"{folder}/0/{'é' * 200}",
        f"{folder}/0/variants",
        f"{folder}/0/variants/x.json",
        f"{folder}/0/train.pt/inside-a-file",
        f"{folder}/0/",
        f"{folder}/0/日本語",
        f"{folder}/99/a/b",
        f"{folder}/99/a",
    ):
        client.put_object(Bucket=name, Key=key, Body=b"stray")
    history = study.supernet.train()["history"]
    assert [e["epoch"] for e in history] == list(range(1, 9))
    # Epochs up to the cut came from the bucket's checkpoint, not trained again.
    again = torch.load(tmp_path / "cut.pt", weights_only=True)["history"]
    assert [e["seconds"] for e in history[:cut]] == [e["seconds"] for e in again]
    assert not [k for k in _keys(client, name) if "/supernet/" in k]  # its work is gone


def test_a_supernet_study_made_again_at_the_same_url_resumes_nothing_of_the_first(
    bucket, tmp_path, monkeypatch
):
    """The reported case: a supernet study made again on the same s3:// URL (its SQLite
    file deleted) resumed the deleted study's supernet checkpoint from the bucket. The
    job's folder is keyed by the study's creation id: the new study trains afresh."""
    import torch

    name, client = bucket
    checkpoint, cut = _killed_supernet(name, client, tmp_path)
    (tmp_path / "study.db").unlink()  # the first study is gone; its bucket folder is not
    from autosearch.studyfile import load_spec

    study = load_spec(str(tmp_path / "sn.py")).create(
        storage=f"sqlite:///{tmp_path}/study.db", artifacts=f"s3://{name}/sn"
    )
    history = study.supernet.train()["history"]
    first = torch.load(tmp_path / "cut.pt", weights_only=True)["history"]
    assert len(history) == 8
    # Trained from the first epoch: none of the cut run's epochs were restored.
    assert [e["seconds"] for e in history[:cut]] != [e["seconds"] for e in first]
    assert checkpoint in _keys(client, name)  # the old study's work is left as it was


def test_a_population_trial_cut_short_resumes_from_the_bucket_on_a_fresh_disk(
    bucket, tmp_path, tiny_space, monkeypatch
):
    """A study's architecture trained as a population in an S3 study: the folder is
    pushed after each of the trial's member-epochs, so a trial cut after the first goes
    on, on a disk that never saw it, to the population of an uninterrupted run; its
    members' checkpoints go when it is stored."""
    from optuna.distributions import FloatDistribution

    from autosearch.population import trial as population_study
    from controllers import RandomSearch

    name, client = bucket
    population = autosearch.PopulationBasedTraining(
        size=2, interval=1, seed=0, mutations={"lr": FloatDistribution(0.02, 0.5, log=True)}
    )

    def options():  # a controller of its own for each study: the same search
        return {
            "controller": RandomSearch(tiny_space, seed=0),
            "train": TrainConfig(epochs=2, batch_size=128, lr=0.1),
        }

    straight = autosearch.create_study(
        "whole", storage=f"sqlite:///{tmp_path}/w.db", artifacts=str(tmp_path / "w"), **options()
    )
    straight.optimize(1)
    whole = straight.train_population(population)

    url = f"sqlite:///{tmp_path}/s.db"
    study = autosearch.create_study("pop", storage=url, artifacts=f"s3://{name}/pop", **options())
    study.optimize(1)
    real, calls = population_study.PopulationLoop._member_epoch, []

    def stop_after_the_first(self, member, epoch):
        calls.append((member, epoch.epoch))
        real(self, member, epoch)  # the push, then the check of the interrupt
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(population_study.PopulationLoop, "_member_epoch", stop_after_the_first)
    assert study.train_population(population) is None and study.interrupted == "SIGTERM"
    pushed = [k for k in _keys(client, name) if "/populations/" in k]
    assert any(k.endswith("/population.json") for k in pushed)
    assert any(k.endswith("/members/0/train.pt") for k in pushed), pushed
    shutil.rmtree(study._artifacts.folder)  # another machine: this disk's copy is gone

    again = autosearch.load_study("pop", storage=url).train_population(population)
    assert again is not None and again.state == "complete"
    assert again.arch == whole.arch
    assert len(calls) == 2 * 2  # the cut member-epoch came from the bucket
    assert again.accuracy == pytest.approx(whole.accuracy)
    assert again.metrics["population_winner"] == whole.metrics["population_winner"]
    assert [k for k in _keys(client, name) if "/populations/" in k] == []
    assert not any(study._artifacts.folder.rglob("*.pt"))  # nothing kept on this disk
