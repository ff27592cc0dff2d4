"""The shared training stack: precision, checkpoints with exact resume, DDP under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from autosearch import TrainConfig, TrialFailed
from autosearch.runtime import resolve
from autosearch.train import _cutout, train

ROOT = Path(__file__).resolve().parents[1]


def _net(seed: int = 0) -> nn.Module:
    """A small conv net without batch norm (BN statistics are per DDP rank)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def test_auto_precision_is_fp32_on_cpu_and_names_are_checked():
    assert resolve(device="cpu", precision="auto").precision == "fp32"
    with pytest.raises(ValueError, match="precision must be one of"):
        TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match="schedule"):
        TrainConfig(schedule="step")  # type: ignore[arg-type]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_paths_train(digits, precision):
    config = TrainConfig(epochs=2, lr=0.05, precision=precision, device="cpu", grad_clip=5.0)
    result = train(_net(), digits, config, seed=0)
    assert result.precision == precision
    assert all(torch.isfinite(torch.tensor(e.train_loss)) for e in result.history)
    assert result.val_accuracy > 0.3  # learned something in reduced precision


def test_fp16_uses_a_dynamic_loss_scaler(digits, monkeypatch):
    scales = []
    real_update = torch.amp.GradScaler.update

    def spy(self, new_scale=None):
        real_update(self, new_scale)
        scales.append(self.get_scale())

    monkeypatch.setattr(torch.amp.GradScaler, "update", spy)
    train(_net(), digits, TrainConfig(epochs=1, precision="fp16", device="cpu"), seed=0)
    assert scales and scales[0] > 1.0  # scaling on (a disabled scaler reports 1.0)
    train(_net(), digits, TrainConfig(epochs=1, precision="fp32", device="cpu"), seed=0)


def test_onecycle_channels_last_and_cutout(digits):
    from autosearch.train import _SCHEDULES

    config = TrainConfig(
        epochs=4,
        schedule="onecycle",
        lr=0.2,
        channels_last=True,
        cutout=3,
        crop_padding=1,
        device="cpu",
    )
    optimizer = torch.optim.SGD(_net().parameters(), lr=config.lr)
    schedule = _SCHEDULES["onecycle"](optimizer, config, 100)
    lrs = []
    for _ in range(99):
        optimizer.step()
        schedule.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    peak = max(range(len(lrs)), key=lrs.__getitem__)
    assert 20 <= peak <= 35 and lrs[peak] == pytest.approx(0.2, rel=0.01) and lrs[-1] < 1e-3
    result = train(_net(), digits, config, seed=0)
    assert result.history[-1].train_loss < result.history[0].train_loss
    x = torch.ones(4, 1, 8, 8)
    holes = _cutout(x, 3, torch.Generator().manual_seed(0))
    zeroed = (holes == 0).flatten(1).sum(1)
    assert ((zeroed >= 4) & (zeroed <= 9)).all()  # a 3×3 square, clipped at borders


def test_out_of_memory_fails_the_trial_with_advice(digits, monkeypatch):
    class Hungry(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    with pytest.raises(TrialFailed, match="out of memory .* lower batch_size"):
        train(Hungry(), digits, TrainConfig(epochs=1, device="cpu"), seed=0)


_KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys, torch
    sys.path.insert(0, {tests!r})
    from test_training_stack import _net
    from autosearch import TrainConfig
    from autosearch.data import load_data
    from autosearch.train import train

    def die_after(epoch):
        if epoch.epoch == {k}:
            os.kill(os.getpid(), signal.SIGKILL)  # no clean-up, like a crashed machine

    config = TrainConfig(epochs=4, lr=0.05, crop_padding=1, flip=True, device="cpu")
    train(_net(), load_data("digits"), config, seed=7, checkpoint={path!r}, on_epoch=die_after)
    """
)


def test_a_run_killed_after_epoch_k_resumes_to_the_same_weights(digits, tmp_path):
    config = TrainConfig(epochs=4, lr=0.05, crop_padding=1, flip=True, device="cpu")
    straight = _net()
    expected = train(straight, digits, config, seed=7)
    checkpoint = tmp_path / "run.pt"
    code = _KILLED_RUN.format(tests=str(ROOT / "tests"), k=2, path=str(checkpoint))
    killed = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, timeout=300)
    assert killed.returncode == -9 and checkpoint.is_file()
    resumed = _net(seed=123)  # different initial weights: the checkpoint must win
    result = train(resumed, digits, config, seed=7, checkpoint=checkpoint)
    assert [e.epoch for e in result.history] == [1, 2, 3, 4]
    for (name, a), b in zip(
        straight.state_dict().items(), resumed.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    assert result.val_accuracy == expected.val_accuracy


_DDP_RUN = textwrap.dedent(
    """
    import os, sys, torch
    sys.path.insert(0, {tests!r})
    from test_training_stack import _net
    from autosearch import TrainConfig
    from autosearch.data import load_data
    from autosearch.runtime import init_distributed, resolve
    from autosearch.train import train

    init_distributed()
    runtime = resolve(device="cpu", precision="fp32")
    model = _net()
    config = TrainConfig(epochs=2, batch_size=64, lr=0.05, crop_padding=1, device="cpu")
    result = train(model, load_data("digits"), config, seed=3, runtime=runtime)
    torch.save({{"params": model.state_dict(), "world": result.world_size}},
               os.path.join({out!r}, f"rank{{runtime.rank}}.pt"))
    """
)


@pytest.mark.slow
def test_two_torchrun_processes_match_one_process(digits, tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    code = tmp_path / "ddp.py"
    code.write_text(_DDP_RUN.format(tests=str(ROOT / "tests"), out=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node=2", str(code)],
        cwd=tmp_path,
        env=env,
        check=True,
        timeout=600,
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0]["world"] == ranks[1]["world"] == 2
    single = _net()
    config = TrainConfig(epochs=2, batch_size=64, lr=0.05, crop_padding=1, device="cpu")
    train(single, digits, config, seed=3)
    for name, value in single.state_dict().items():
        assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
        torch.testing.assert_close(ranks[0]["params"][name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_study_runs_under_torchrun_with_rank_0_storing(tmp_path):
    import autosearch

    (tmp_path / "tiny.py").write_text(
        textwrap.dedent(
            """
        from autosearch import StudySpec, TrainConfig
        from controllers import RandomSearch
        from search_spaces import ResNetSpace

        study = StudySpec(
            name="ddp",
            controller=RandomSearch(
                ResNetSpace(max_stages=2, depths=(1,), widths=(4, 8), stem_widths=(4,)), seed=0
            ),
            train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
            n_trials=2,
        )
        """
        )
    )
    cli = Path(sys.executable).with_name("autosearch")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [str(cli), "run", "tiny.py", "--nproc-per-node", "2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("Pareto front") == 1  # rank 0 alone reports
    study = autosearch.load_study("ddp", storage=f"sqlite:///{tmp_path}/runs/ddp/study.db")
    records = study.records()
    assert len(records) == 2 and all(r.state == "complete" for r in records)
    assert all(r.metrics["world_size"] == 2 for r in records)


def test_batch_size_finder_takes_the_largest_batch_that_fits(digits):
    from autosearch.train import find_batch_size

    class Bounded(nn.Module):
        """Runs out of memory above 300 images, like a GPU would."""

        def __init__(self):
            super().__init__()
            self.net = _net()

        def forward(self, x):
            if len(x) > 300:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return self.net(x)

    model = Bounded()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    runtime = resolve(device="cpu", precision="fp32")
    assert find_batch_size(model, digits, TrainConfig(batch_size=32), runtime) == 256
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(TrialFailed, match="even at batch size 512"):
        find_batch_size(model, digits, TrainConfig(batch_size=512), runtime)
