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

pytest.importorskip("boto3", reason="S3 artifacts are an extra: pip install 'autosearch[s3]'")
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
    assert not any(study.artifacts.folder.rglob("*.pt"))  # nothing kept on this disk


def test_a_cut_trial_resumes_from_the_bucket_on_a_fresh_disk(bucket, tmp_path, tiny_space):
    from controllers import RandomSearch

    name, client = bucket
    url = f"sqlite:///{tmp_path}/s.db"
    study = autosearch.create_study(
        "cut",
        controller=RandomSearch(tiny_space, seed=0),
        storage=url,
        artifacts=f"s3://{name}/cut",
        train=TrainConfig(epochs=3, batch_size=128, lr=0.1),
    )

    def stop_after_two(trial: int, epoch) -> None:  # as Ctrl-C would: after the checkpoint
        if epoch.epoch == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    assert study.optimize(1, epoch_callbacks=[stop_after_two]) == []
    cut = study.optuna_study.get_trials()[0]
    assert "interrupted" in cut.user_attrs["superseded"] and cut.user_attrs["resume"]
    arch_id = cut.user_attrs["arch_id"]
    assert f"cut/checkpoints/{arch_id}/0/train.pt" in _keys(client, name)
    shutil.rmtree(study.artifacts.folder)  # another machine: this disk's copy is gone

    again = autosearch.load_study("cut", storage=url)
    (done,) = again.optimize(1)
    attrs = again.optuna_study.get_trials()[done.trial].user_attrs
    assert done.arch.arch_id == arch_id and attrs["resumes"] == 0
    assert attrs["result"]["resumed_from_epoch"] == 2  # epochs 1-2 came from the bucket
    assert [k for k in _keys(client, name) if "/checkpoints/" in k] == []


def test_an_unreachable_bucket_is_a_platform_error_and_the_trial_resumes(
    bucket, tmp_path, tiny_space
):
    from autosearch.errors import PlatformError
    from controllers import RandomSearch

    study = autosearch.create_study(
        "gone",
        controller=RandomSearch(tiny_space, seed=0),
        storage=f"sqlite:///{tmp_path}/s.db",
        artifacts="s3://no-such-bucket/x",
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
    )
    with pytest.raises(PlatformError, match=r"s3://no-such-bucket/x.*NoSuchBucket"):
        study.optimize(1)
    (trial,) = study.optuna_study.get_trials()
    assert trial.user_attrs["resume"] is True and study.records() == []
