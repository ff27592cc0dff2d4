"""Every checkpoint is read as data, whatever a disk or a bucket holds: a training run's
file, a sharded run's folder (its ``.metadata`` and every ``.distcp`` value), planted
with code, cut short or damaged, is set aside in one line and the run trains again from
its last whole state; nothing it names is ever built. The places a checkpoint is read
(a trial, a population's member, ``autosearch train DIR``, through the S3 mirror) all
resume through :func:`autosearch.training._checkpoint.restore`: tested here at each."""

from __future__ import annotations

import io
import logging
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autosearch import TrainConfig
from autosearch.training._shard_reader import UnreadableShards, check, read_metadata
from autosearch.training.train import train


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(16, 10),
    )


def _config(parallel: str = "ddp", epochs: int = 3) -> TrainConfig:
    return TrainConfig(epochs=epochs, batch_size=128, lr=0.05, device="cpu", parallel=parallel)


class _Payload:
    """Makes a folder when unpickled: what a hostile file would do, visibly."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def _cut_after_two(digits, folder: Path, parallel: str) -> Path:
    """A run stopped after its second epoch: its checkpoint (and shards) in ``folder``."""
    checkpoint = folder / "train.pt"

    def stop(epoch):
        if epoch.epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(_net(), digits, _config(parallel), seed=1, checkpoint=checkpoint, on_epoch=stop)
    return checkpoint


@pytest.fixture(scope="module")
def cut_runs(digits, tmp_path_factory) -> dict[str, Path]:
    """One cut run of each format, copied for each example."""
    root = tmp_path_factory.mktemp("cut")
    return {p: _cut_after_two(digits, root / p, p).parent for p in ("ddp", "fsdp")}


def _smuggle_value(folder: Path, marker: Path) -> None:
    """Rewrite a sharded run's folder with the optimizer's learning rate a payload (a
    value DCP stores as pickled bytes in a ``.distcp`` file)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model(torch.zeros(2, 1, 8, 8)).sum().backward()
    optimizer.step()
    optimizer.param_groups[0]["initial_lr"] = 0.05
    model_state, optim_state = get_state_dict(model, optimizer)
    optim_state["param_groups"][0]["lr"] = _Payload(marker)
    shutil.rmtree(folder)
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder)


def _damage(run: Path, target: str, kind: str, where: float, marker: Path) -> Path:
    """``run``'s file ``target`` damaged by ``kind`` at the fraction ``where`` of it."""
    if target == "shards":
        return _smuggle_value(next(run.glob("train.pt.shards-*")), marker) or run
    path = {
        "train.pt": lambda: run / "train.pt",
        ".metadata": lambda: next(run.glob("train.pt.shards-*")) / ".metadata",
        ".distcp": lambda: next(run.glob("train.pt.shards-*/*.distcp")),
    }[target]()
    data = path.read_bytes()
    at = int(len(data) * where)
    if kind == "code":
        buffer = io.BytesIO()
        if target == ".metadata":
            pickle.dump(_Payload(marker), buffer)
        else:
            torch.save({"epoch": 2, "model": _Payload(marker)}, buffer)
        data = buffer.getvalue()
    elif kind == "cut":
        data = data[:at]
    elif kind == "flip":
        data = data[:at] + bytes(b ^ 0xFF for b in data[at : at + 16]) + data[at + 16 :]
    else:  # "gone"
        path.unlink()
        return run
    path.write_bytes(data)
    return run


@settings(
    max_examples=100,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    parallel=st.sampled_from(["ddp", "fsdp"]),
    target=st.sampled_from(["train.pt", ".metadata", ".distcp", "shards"]),
    kind=st.sampled_from(["code", "cut", "flip", "gone"]),
    where=st.floats(0.0, 0.999),
)
def test_a_damaged_checkpoint_never_runs_code_and_the_run_goes_on(
    digits, cut_runs, tmp_path_factory, parallel, target, kind, where
):
    if parallel == "ddp" and target != "train.pt":
        target = "train.pt"  # an unsharded run keeps one file
    run = tmp_path_factory.mktemp("run") / "run"
    shutil.copytree(cut_runs[parallel], run)
    marker = run.parent / "code-ran"
    _damage(run, target, kind, where, marker)
    model = _net(seed=7)
    result = train(model, digits, _config(parallel), seed=1, checkpoint=run / "train.pt")
    assert not marker.exists()  # nothing named in a file was ever built
    epochs = [e.epoch for e in result.history]
    assert epochs == [1, 2, 3]  # resumed (a harmless flip) or trained again from scratch
    assert torch.load(run / "train.pt", weights_only=True)["epoch"] == 3  # a new, whole one
    if parallel == "fsdp":
        check(run / "train.pt.shards-3")  # its shards whole


@pytest.mark.parametrize("target", [".metadata", ".distcp", "shards", "gone"])
def test_damaged_shards_are_set_aside_in_one_line(digits, cut_runs, tmp_path, caplog, target):
    """F22, F23, F24: a shard cut to 1,000 bytes, a metadata cut in half, a payload in
    the metadata or in a stored value, a folder that is gone: one line, the folder and
    the file set aside, the run trained from scratch."""
    run = tmp_path / "run"
    shutil.copytree(cut_runs["fsdp"], run)
    marker = tmp_path / "code-ran"
    shards = run / "train.pt.shards-2"
    if target == ".metadata":
        data = (shards / ".metadata").read_bytes()
        (shards / ".metadata").write_bytes(data[: len(data) // 2])
    elif target == ".distcp":
        (distcp,) = shards.glob("*.distcp")
        distcp.write_bytes(distcp.read_bytes()[:1000])
    elif target == "shards":
        _smuggle_value(shards, marker)
    else:
        shutil.rmtree(shards)
    straight = train(_net(seed=7), digits, _config("fsdp"), seed=1)
    with caplog.at_level(logging.WARNING):
        result = train(_net(seed=7), digits, _config("fsdp"), seed=1, checkpoint=run / "train.pt")
    assert not marker.exists()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, warned
    assert "cannot be read" in warned[0] and "training from scratch" in warned[0]
    assert "\n" not in warned[0] and "Traceback" not in caplog.text
    assert [e.train_loss for e in result.history] == [e.train_loss for e in straight.history]
    assert (run / "train.pt.unreadable").is_file()
    assert (run / "train.pt.shards-2.unreadable").is_dir() == (target != "gone")
    assert sorted(p.name for p in run.iterdir() if "unreadable" not in p.name) == [
        "train.pt",
        "train.pt.shards-3",
    ]


def test_shard_metadata_admits_dcps_types_only(cut_runs, tmp_path):
    shards = next(cut_runs["fsdp"].glob("train.pt.shards-*"))
    metadata = read_metadata(shards)
    assert metadata.state_dict_metadata  # the real one reads
    for refused in (_Payload(tmp_path / "ran"), {"a": 1}, [shards]):
        (tmp_path / ".metadata").write_bytes(pickle.dumps(refused))
        with pytest.raises(UnreadableShards, match=r"\.metadata is not DCP metadata"):
            read_metadata(tmp_path)
    assert not (tmp_path / "ran").exists()
    escaping = tmp_path / "escaping"
    shutil.copytree(shards, escaping)
    for info in metadata.storage_data.values():
        info.relative_path = "../../elsewhere.distcp"
    (escaping / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(UnreadableShards, match="names a shard outside it"):
        check(escaping)


# Every place a checkpoint is read ---------------------------------------------------------


def _plant(folder: Path, marker: Path, where: str) -> Path:
    """A payload that would make ``marker`` where it is unpickled: in the newest shard
    folder's ``.metadata`` under ``folder`` (``where="shards"``), or as ``folder``'s
    ``train.pt`` (``where="file"``, a whole checkpoint of objects)."""
    if where == "shards":
        target = sorted(folder.rglob("*.shards-*/.metadata"))[-1]
        target.write_bytes(pickle.dumps(_Payload(marker)))
        return target
    target = next(iter(sorted(folder.rglob("train.pt"))))
    torch.save({"epoch": 1, "model": _Payload(marker)}, target)
    return target


def _cut_study(tmp_path: Path, tiny_space, **options):
    """A study whose first trial (trained in shards) is cut after its second epoch, as
    Ctrl-C would (its checkpoint kept for the resume)."""
    import signal

    import autosearch
    from controllers import RandomSearch

    study = autosearch.create_study(
        "reads",
        controller=RandomSearch(tiny_space, seed=0),
        storage=f"sqlite:///{tmp_path}/s.db",
        train=_config("fsdp"),
        **options,
    )

    def stop_after_two(trial, epoch):
        if epoch.epoch == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    assert study.optimize(1, epoch_callbacks=[stop_after_two]) == []
    return study


def test_a_trials_shards_planted_with_code_are_set_aside(tmp_path, tiny_space, caplog):
    import autosearch

    study = _cut_study(tmp_path, tiny_space)
    marker = tmp_path / "code-ran"
    _plant(study._artifacts.folder / "checkpoints", marker, "shards")
    with caplog.at_level(logging.WARNING):
        (done,) = autosearch.load_study("reads", storage=study.storage_url).optimize(1)
    assert done.state == "complete" and not marker.exists()
    assert "train.pt cannot be read" in caplog.text and "is not DCP metadata" in caplog.text


@pytest.mark.slow
@pytest.mark.service
@pytest.mark.parametrize("where", ["shards", "file"])
def test_a_checkpoint_planted_with_code_in_the_bucket_is_set_aside(
    bucket, tmp_path, tiny_space, caplog, where
):
    """Through the S3 mirror: the attempt's work fetched from the bucket onto a fresh
    disk, a payload planted in the bucket's copy."""
    import autosearch

    name, client = bucket
    study = _cut_study(tmp_path, tiny_space, artifacts=f"s3://{name}/reads")
    marker = tmp_path / "code-ran"
    shutil.rmtree(study._artifacts.folder)  # another machine: only the bucket has the work
    suffix = "/.metadata" if where == "shards" else "/train.pt"
    keys = [
        o["Key"]
        for o in client.list_objects_v2(Bucket=name)["Contents"]
        if "/checkpoints/" in o["Key"] and o["Key"].endswith(suffix)
    ]
    body = io.BytesIO()
    if where == "shards":
        pickle.dump(_Payload(marker), body)
    else:
        torch.save({"epoch": 1, "model": _Payload(marker)}, body)
    for key in keys:
        client.put_object(Bucket=name, Key=key, Body=body.getvalue())
    with caplog.at_level(logging.WARNING):
        (done,) = autosearch.load_study("reads", storage=study.storage_url).optimize(1)
    assert keys and done.state == "complete" and not marker.exists()
    assert "cannot be read" in caplog.text


def test_a_population_members_checkpoint_planted_with_code_is_rebuilt(digits, tmp_path, caplog):
    from optuna.distributions import FloatDistribution

    from autosearch.population import train_population
    from autosearch.population.rules import PopulationBasedTraining

    population = PopulationBasedTraining(
        size=2, interval=1, mutations={"lr": FloatDistribution(0.01, 0.2, log=True)}, seed=1
    )

    def stop(member, epoch):
        if (member, epoch.epoch) == (0, 2):
            raise KeyboardInterrupt

    folder = tmp_path / "pop"
    with pytest.raises(KeyboardInterrupt):
        train_population(_net, digits, _config(), population, folder, seed=3, on_epoch=stop)
    marker = tmp_path / "code-ran"
    torch.save({"epoch": 1, "model": _Payload(marker)}, folder / "members" / "1" / "train.pt")
    with caplog.at_level(logging.WARNING):
        result = train_population(_net, digits, _config(), population, folder, seed=3)
    assert not marker.exists() and all(m["epoch"] == 3 for m in result.members)
    assert "population member 1: its checkpoint cannot be read" in caplog.text


def test_an_exports_full_training_checkpoint_planted_with_code_is_set_aside(
    digits, tmp_path, tiny_space, caplog
):
    """``autosearch train DIR`` resumes from ``DIR/full/checkpoint.pt``."""
    import autosearch
    from autosearch.export.retrain import train_export
    from controllers import RandomSearch

    study = autosearch.create_study(
        "x", controller=RandomSearch(tiny_space, seed=0), storage=f"sqlite:///{tmp_path}/x.db",
        train=_config(epochs=1),
    )  # fmt: skip
    (record,) = study.optimize(1)
    folder = study.export(record, tmp_path / "export")
    (folder / "full").mkdir()
    marker = tmp_path / "code-ran"
    torch.save({"epoch": 1, "model": _Payload(marker)}, folder / "full" / "checkpoint.pt")
    with caplog.at_level(logging.WARNING):
        metrics = train_export(folder, digits, _config(epochs=2))
    assert not marker.exists() and len(metrics["history"]) == 2
    assert "checkpoint.pt cannot be read" in caplog.text
