"""FSDP and hybrid sharding (TrainConfig(parallel="fsdp" | "hsdp")): real torchrun ranks on
the CPU with gloo train to the losses and weights of one process, each rank holding its
share of the parameters and optimizer state (measured from the tensors), and a run killed
mid-epoch resumes from its sharded checkpoint at another number of ranks."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from autosearch import TrainConfig
from autosearch.errors import ConfigError
from autosearch.training.train import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_training_stack import _net  # noqa: E402

_RUN = textwrap.dedent(
    """
    import json, os, signal, sys, torch, torch.nn as nn
    sys.path.insert(0, {tests!r})
    from test_training_stack import _net
    from autosearch import TrainConfig
    from autosearch.data import load_data
    from autosearch.errors import ConfigError
    from autosearch.training import sharding
    from autosearch.training.runtime import init_distributed, leave_distributed, resolve
    from autosearch.training.train import train

    KILL = {kill!r}  # (epoch, step): rank 1 dies there, mid-epoch, like a lost machine

    def bn_net():
        torch.manual_seed(1)
        return nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 10),
        )

    def main():
        init_distributed("cpu")
        runtime = resolve(device="cpu", precision="fp32")
        data = load_data("digits")
        config = TrainConfig(
            epochs={epochs}, batch_size=64, lr=0.05, crop_padding=1, device="cpu",
            grad_clip=5.0, parallel={parallel!r}, shard_size={shard_size!r},
        )
        epochs, steps = [0], [0]

        def dying(logits, x, y):
            if KILL and runtime.rank == 1 and epochs[0] + 1 == KILL[0]:
                steps[0] += 1
                if steps[0] == KILL[1]:
                    os.kill(os.getpid(), signal.SIGKILL)
            return torch.nn.functional.cross_entropy(logits, y)

        model = _net()
        result = train(
            model, data, config, seed=3, runtime=runtime, checkpoint={checkpoint!r},
            criterion=dying, on_epoch=lambda e: epochs.__setitem__(0, e.epoch),
        )
        out = {{"params": model.state_dict(), "world": result.world_size, "held": result.held,
               "losses": [e.train_loss for e in result.history]}}
        if not KILL:  # batch norm under sharding, in bf16; a supernet refused
            bn = bn_net()
            config = TrainConfig(epochs=1, batch_size=64, lr=0.05, device="cpu",
                                 precision="bf16", parallel={parallel!r}, shard_size={shard_size!r})
            train(bn, data, config, seed=3, runtime=runtime)
            out["bn"] = {{k: v for k, v in bn.state_dict().items() if "running" in k}}
            bn.find_unused_parameters = True
            try:
                train(bn, data, config, seed=3, runtime=runtime)
            except ConfigError as exc:
                out["refused"] = str(exc)
        torch.save(out, os.path.join({out!r}, f"rank{{runtime.rank}}.pt"))
        leave_distributed()

    if __name__ == "__main__":
        main()
    """
)


def _ranks(
    tmp_path: Path,
    n: int,
    parallel: str,
    *,
    epochs: int = 2,
    shard_size: int | None = None,
    kill: tuple[int, int] | None = None,
    checkpoint: Path | None = None,
) -> tuple[int, list[dict]]:
    """Train ``_net`` with ``n`` torchrun processes (gloo, one thread each): torchrun's
    exit code, and each rank's results (where it lived to write them)."""
    code = tmp_path / f"{parallel}{n}.py"
    code.write_text(
        _RUN.format(
            tests=str(ROOT / "tests"),
            out=str(tmp_path),
            epochs=epochs,
            parallel=parallel,
            shard_size=shard_size,
            kill=kill,
            checkpoint=str(checkpoint) if checkpoint else None,
        )
    )
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run(
        [str(torchrun), "--standalone", f"--nproc-per-node={n}", str(code)],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    ranks = [tmp_path / f"rank{r}.pt" for r in range(n)]
    return done.returncode, [torch.load(p, weights_only=True) for p in ranks if p.is_file()]


def _config(**changes) -> TrainConfig:
    settings = {"epochs": 2, "batch_size": 64, "lr": 0.05, "crop_padding": 1, "device": "cpu"}
    return TrainConfig(**{**settings, "grad_clip": 5.0, **changes})


def _full_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("n", "parallel", "shard_size"), [(2, "fsdp", None), (4, "hsdp", 2)], ids=["fsdp2", "hsdp2x2"]
)
def test_sharded_ranks_train_to_one_process_weights_holding_their_share(
    digits, tmp_path, n, parallel, shard_size
):
    code, ranks = _ranks(tmp_path, n, parallel, shard_size=shard_size)
    assert code == 0 and len(ranks) == n
    single = _net()
    expected = train(single, digits, _config(), seed=3)
    group = shard_size or n  # the ranks one copy of the model is split over
    for rank in ranks:
        assert rank["world"] == n
        for name, value in single.state_dict().items():  # whole again, on every rank
            torch.testing.assert_close(rank["params"][name], value, rtol=1e-4, atol=1e-5)
        assert rank["losses"] == pytest.approx([e.train_loss for e in expected.history], rel=1e-4)
        # Measured from the tensors each rank held: its share, and its share of momentum.
        assert rank["held"]["parameters"] == pytest.approx(_full_bytes(single) / group, rel=0.05)
        assert rank["held"]["optimizer"] == pytest.approx(_full_bytes(single) / group, rel=0.05)
        for name, value in ranks[0]["bn"].items():  # one statistic, averaged over the ranks
            assert torch.equal(rank["bn"][name], value), name
        assert "set parallel='ddp'" in rank["refused"]
    assert expected.held["parameters"] == _full_bytes(single)


@pytest.mark.slow
def test_a_rank_killed_mid_epoch_resumes_from_the_shards_at_another_number_of_ranks(
    digits, tmp_path, caplog
):
    checkpoint = tmp_path / "run" / "train.pt"
    code, ranks = _ranks(tmp_path, 2, "fsdp", epochs=3, kill=(3, 2), checkpoint=checkpoint)
    assert code != 0 and ranks == []  # torchrun stopped the survivor too
    assert (checkpoint.parent / "train.pt.shards-2" / ".metadata").is_file()
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["train.pt", "train.pt.shards-2"]

    straight = _net()
    expected = train(straight, digits, _config(epochs=3), seed=3)
    resumed = _net(seed=123)  # other initial weights: the shards must win
    with caplog.at_level(logging.WARNING):
        result = train(
            resumed, digits, _config(epochs=3, parallel="fsdp"), seed=3, checkpoint=checkpoint
        )
    assert not caplog.records, caplog.text  # resumed, not trained from scratch
    assert [e.epoch for e in result.history] == [1, 2, 3]
    assert [e.train_loss for e in result.history] == pytest.approx(
        [e.train_loss for e in expected.history], rel=1e-4
    )
    for name, value in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=1e-4, atol=1e-5)
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == ["train.pt", "train.pt.shards-3"]


@pytest.mark.slow
def test_one_ranks_shard_cut_short_sets_the_folder_aside_on_every_rank(digits, tmp_path):
    """F22 at two ranks: rank 1's shard file cut to 1,000 bytes. Every rank finds it
    before any rank loads (no rank waits in DCP for another), both train from scratch."""
    checkpoint = tmp_path / "run" / "train.pt"
    code, _ = _ranks(tmp_path, 2, "fsdp", epochs=3, kill=(3, 2), checkpoint=checkpoint)
    assert code != 0
    shard = checkpoint.parent / "train.pt.shards-2" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    code, ranks = _ranks(tmp_path, 2, "fsdp", epochs=3, checkpoint=checkpoint)
    assert code == 0 and len(ranks) == 2
    expected = train(_net(), digits, _config(epochs=3), seed=3)
    for rank in ranks:  # from scratch: the same losses as a run that never had a checkpoint
        assert rank["losses"] == pytest.approx([e.train_loss for e in expected.history], rel=1e-4)
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == [
        "train.pt",
        "train.pt.shards-2.unreadable",
        "train.pt.shards-3",
        "train.pt.unreadable",
    ]


def test_a_sharded_checkpoint_in_one_process_resumes_to_the_same_weights(digits, tmp_path):
    config = _config(epochs=3, parallel="fsdp")
    straight = _net()
    train(straight, digits, config, seed=5)
    checkpoint = tmp_path / "train.pt"

    def stop_after_2(epoch):
        if epoch.epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(_net(), digits, config, seed=5, checkpoint=checkpoint, on_epoch=stop_after_2)
    assert torch.load(checkpoint, weights_only=True)["shards"] == "train.pt.shards-2"
    resumed = _net(seed=99)
    result = train(resumed, digits, config, seed=5, checkpoint=checkpoint)
    assert [e.epoch for e in result.history] == [1, 2, 3]
    for name, value in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name


def test_a_checkpoint_of_the_other_format_trains_from_scratch_and_says_so(digits, tmp_path, caplog):
    checkpoint = tmp_path / "train.pt"
    train(_net(), digits, _config(epochs=1), seed=5, checkpoint=checkpoint)  # unsharded
    with caplog.at_level(logging.WARNING):
        result = train(
            _net(), digits, _config(epochs=1, parallel="hsdp"), seed=5, checkpoint=checkpoint
        )
    assert "parallel: not -> sharded" in caplog.text and "training from scratch" in caplog.text
    assert [e.epoch for e in result.history] == [1]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_model_with_nothing_to_train_is_refused_in_one_line(digits, parallel):
    with pytest.raises(ConfigError, match="Sequential has no trainable parameters"):
        train(nn.Sequential(nn.Flatten()), digits, _config(parallel=parallel), seed=0)


def test_sharding_settings_are_checked_in_one_line():
    with pytest.raises(ConfigError, match="parallel='zero3' cannot be used: expected 'ddp'"):
        TrainConfig(parallel="zero3")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="applies to parallel='hsdp' only"):
        TrainConfig(parallel="fsdp", shard_size=2)
    with pytest.raises(ConfigError, match="shard_size=0"):
        TrainConfig(parallel="hsdp", shard_size=0)


def test_a_process_that_never_shards_never_imports_the_distributed_checkpoint():
    """DCP (and the symbolic-shape machinery it pulls in) is imported where shards are
    read or written: the trainer, the study and a whole run's checkpoint do without it."""
    code = textwrap.dedent(
        """
        import sys
        import torch.nn as nn
        from autosearch.training import _checkpoint, sharding, train  # noqa: F401
        import autosearch.study
        print("torch.distributed.checkpoint" in sys.modules)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["False"]
