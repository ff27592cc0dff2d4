"""Several trials a GPU: the placement rule (a trial's size against a GPU's free memory),
the workers it places, the GPU fraction Ray asks for, and the MPS daemon the local pool
starts for workers that share a GPU. Everything here runs on the CPU; the rule's sizes
against the GPU's own count are in tests/test_gpu.py, the trials per hour in
benchmarks/gpu.py's workers section."""

from __future__ import annotations

import logging
import math
import os
import stat
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

from autosearch import RayExecutor, TrainConfig
from autosearch.errors import ConfigError
from autosearch.training.placement import HEADROOM, Need, assign, per_gpu, step_need
from autosearch.workers import _mps
from autosearch.workers import pool as workers
from autosearch.workers.executors import ProcessExecutor

GiB = 2**30
needs = st.builds(
    Need,
    weights=st.integers(0, 4 * GiB),
    activations=st.integers(0, 64 * GiB),
    data=st.integers(0, 4 * GiB),
    context=st.integers(0, GiB),
)
frees = st.integers(0, 200 * GiB)


@settings(max_examples=300, deadline=None)
@given(need=needs, free=frees, more=st.integers(0, 50 * GiB), cap=st.integers(1, 16))
def test_the_rule_fits_what_the_free_memory_holds(need, free, more, cap):
    fits = per_gpu(need, free, cap=cap)
    assert 1 <= fits <= cap
    if fits > 1:  # never plans on more than its share of the free memory
        assert fits * need.total <= free * HEADROOM
    if fits < cap:  # and leaves no room for one more
        assert (fits + 1) * max(1, need.total) > free * HEADROOM
    assert per_gpu(need, free + more, cap=cap) >= fits  # more memory never fits fewer
    larger = Need(weights=need.weights + more, activations=need.activations)
    assert per_gpu(larger, free, cap=cap) <= per_gpu(
        Need(weights=need.weights, activations=need.activations), free, cap=cap
    )


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 64),
    free=st.lists(frees, min_size=0, max_size=8),
    need=needs,
    override=st.none() | st.integers(1, 16),
)
def test_workers_are_spread_evenly_or_refused_before_any_starts(n, free, need, override):
    asked = []

    def sized() -> Need:
        asked.append(1)
        return need

    try:
        gpus = assign(n, free, sized, per_gpu_override=override)
    except ConfigError as e:
        sharing = math.ceil(n / len(free))
        limit = override if override is not None else min(per_gpu(need, f) for f in free)
        assert sharing > limit
        assert f"use n_workers <= {len(free) * limit}" in str(e)
        return
    assert len(gpus) == n
    if not free:
        assert gpus == [None] * n
        return
    counts = Counter(gpus)
    assert set(counts) <= set(range(len(free)))
    assert max(counts.values()) - min(counts.get(g, 0) for g in range(min(n, len(free)))) <= 1
    if override is None:
        assert max(counts.values()) <= min(per_gpu(need, f) for f in free)
    if n <= len(free) or override is not None:
        assert not asked  # a trial is sized only where workers share a GPU by the rule


def test_a_refusal_names_the_trial_the_memory_and_the_fix():
    need = Need(weights=GiB, activations=5 * GiB, batch=256)
    with pytest.raises(ConfigError) as refused:
        assign(8, [16 * GiB], lambda: need)
    said = str(refused.value)
    assert "8 workers on 1 GPU(s) put 8 on one, but only 1 fit" in said
    assert "a trial needs 13.09 GiB" in said and "at batch 256" in said
    assert "16.0 GiB free" in said and "per_gpu" in said
    assert assign(8, [16 * GiB], lambda: need, per_gpu_override=8) == [0] * 8


@pytest.mark.parametrize(
    "bad", [0, -1, True, 1.5, "2"], ids=["zero", "negative", "bool", "float", "text"]
)
def test_a_per_gpu_that_cannot_be_used_is_refused(bad):
    with pytest.raises(ConfigError, match="per_gpu"):
        ProcessExecutor(per_gpu=bad)
    with pytest.raises(ConfigError, match="per_gpu"):
        RayExecutor(num_gpus="auto", per_gpu=bad)
    with pytest.raises(ConfigError, match="per_gpu"):
        assign(4, [GiB], lambda: Need(0, 0), per_gpu_override=bad)


def test_executor_settings_that_cannot_be_used_are_refused():
    with pytest.raises(ConfigError, match="mps"):
        ProcessExecutor(mps="yes")  # type: ignore[arg-type]
    for bad in (-1, float("nan"), float("inf"), "half", True):
        with pytest.raises(ConfigError, match="num_gpus"):
            RayExecutor(num_gpus=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="only with num_gpus='auto'"):
        RayExecutor(num_gpus=0.5, per_gpu=2)
    with pytest.raises(ConfigError, match="resolved by resources"):
        _ = RayExecutor(num_gpus="auto").gpus_per_worker
    assert RayExecutor(num_gpus=0.25).gpus_per_worker == 0.25


# What a trial holds -----------------------------------------------------------------------


def test_a_step_counts_what_autograd_saves_once_and_weights_apart():
    """A convolution saves its input, the ReLU its output, the linear layer a view of
    that output (counted once with it); the weights they save are counted as weights,
    with their gradients and SGD's momentum, not once per image."""
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(512, 10)
    )
    need = step_need(model, (3, 8, 8), batch=256)
    params = sum(p.numel() for p in model.parameters())
    assert need.weights == params * 4 * 3
    per_image = (3 * 8 * 8 + 8 * 8 * 8) * 4  # the input, the ReLU's output
    assert per_image * 256 <= need.activations <= (per_image + 64) * 256  # + the loss's few
    assert step_need(model, (3, 8, 8), batch=512).activations == 2 * need.activations
    assert step_need(model, (3, 8, 8), batch=256, precision="bf16").activations == (
        need.activations // 2
    )
    assert step_need(model, (3, 8, 8), batch=256, optimizer="adamw").weights == params * 4 * 4
    wide = nn.Sequential(nn.Flatten(), nn.Linear(192, 100_000))  # weights >> activations
    assert step_need(wide, (3, 8, 8), batch=2).activations < 4 * 100_000 * 4


def test_sizing_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step_need(model, (3, 8, 8), batch=64)
    assert not model.training
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(ConfigError, match="optimizer"):
        step_need(model, (3, 8, 8), batch=64, optimizer="lamb")
    with pytest.raises(ConfigError, match="batch"):
        step_need(model, (3, 8, 8), batch=0)


def test_a_study_trial_is_sized_by_the_largest_sampled_candidate(digits):
    from search_spaces import ResNetSpace

    space = ResNetSpace(max_stages=2)
    config = TrainConfig(batch_size=32)
    need = workers.trial_need(space, config, digits, samples=6)
    model = space.build(space.default(), input_shape=digits.input_shape, num_classes=10)
    default = step_need(model, digits.input_shape, batch=32, data_bytes=digits.train.x.nbytes)
    assert need.total >= default.total and need.data == digits.train.x.nbytes
    grown = workers.trial_need(
        space, TrainConfig(batch_size=32, auto_batch_size=True), digits, samples=6
    )
    assert grown.batch == 32 * 8 and grown.activations > need.activations


# Ray's fraction ----------------------------------------------------------------------------


class _Ray:
    """Ray's calls the fraction makes, on a cluster of ``gpus`` GPUs with ``free`` bytes
    free on the GPU a task gets."""

    def __init__(self, gpus: float, free: int) -> None:
        self.gpus, self.free, self.tasks = gpus, free, []

    def cluster_resources(self):
        return {"CPU": 8.0, **({"GPU": self.gpus} if self.gpus else {})}

    def remote(self, **resources):
        self.tasks.append(resources)
        free = self.free

        class _Task:
            def __init__(self, fn):
                pass

            def remote(self):
                return free

        return _Task

    def get(self, ref):
        return ref


def test_ray_asks_for_the_rules_fraction_of_a_gpu():
    need = Need(weights=0, activations=GiB)  # 3.09 GiB with the context and workspaces
    on_gpus = _Ray(gpus=2, free=16 * GiB)
    assert RayExecutor(num_gpus="auto")._fraction(on_gpus, lambda: need) == 1 / per_gpu(
        need, 16 * GiB
    )
    assert on_gpus.tasks == [{"num_gpus": 1, "num_cpus": 0}]  # read on a GPU of the cluster
    assert RayExecutor(num_gpus="auto", per_gpu=4)._fraction(on_gpus, lambda: need) == 0.25
    nothing = _Ray(gpus=0, free=0)
    assert RayExecutor(num_gpus="auto")._fraction(nothing, lambda: need) == 0.0
    assert nothing.tasks == []
    huge = Need(weights=0, activations=100 * GiB)
    assert RayExecutor(num_gpus="auto")._fraction(on_gpus, lambda: huge) == 1.0


# MPS -----------------------------------------------------------------------------------


def _control(folder: Path, *, fails: str | None = None) -> str:
    """A stand-in for nvidia-cuda-mps-control that records how it was called (this
    machine has no NVIDIA driver; the real daemon is started in benchmarks/gpu.py)."""
    script = folder / "nvidia-cuda-mps-control"
    log = folder / "calls"
    exit_with = f'echo "{fails}" >&2; exit 1' if fails else "exit 0"
    pipe = "$CUDA_MPS_PIPE_DIRECTORY"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-d" ]; then echo "start {pipe}" >> {log}; {exit_with}; fi\n'
        f'read line; echo "$line {pipe}" >> {log}\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_mps_is_started_for_the_run_and_stopped_after(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    control = _control(tmp_path)
    with _mps.daemon(control=control) as env:
        pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
        assert Path(pipe).is_dir() and Path(env["CUDA_MPS_LOG_DIRECTORY"]).is_dir()
        assert (tmp_path / "calls").read_text() == f"start {pipe}\n"
    assert (tmp_path / "calls").read_text() == f"start {pipe}\nquit {pipe}\n"
    assert not Path(pipe).exists()  # the run's private folder is gone with it


def test_where_mps_cannot_start_the_workers_share_without_it_and_it_is_said(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    caplog.set_level(logging.INFO, logger=_mps.__name__)
    with _mps.daemon(control=str(tmp_path / "absent")) as env:
        assert env == {}
    assert "without CUDA MPS" in caplog.text and "not on PATH" in caplog.text
    refused = _control(tmp_path, fails="An instance of this daemon is already running")
    with _mps.daemon(control=refused) as env:
        assert env == {}
    assert "exited 1: An instance of this daemon is already running" in caplog.text
    with pytest.raises(ConfigError, match="CUDA MPS asked for, but .* exited 1"):
        with _mps.daemon(control=refused, required=True):
            pass
    with pytest.raises(ConfigError, match="not on PATH"):
        with _mps.daemon(control=str(tmp_path / "absent"), required=True):
            pass


def test_a_daemon_the_environment_names_is_used_not_started(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/run/theirs")
    control = _control(tmp_path)
    with _mps.daemon(control=control) as env:
        assert env == {"CUDA_MPS_PIPE_DIRECTORY": "/run/theirs"}
    assert not (tmp_path / "calls").exists()


def test_the_pool_starts_mps_only_where_workers_share_a_gpu(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    _control(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    calls = tmp_path / "calls"
    for executor, gpus, started in [
        (ProcessExecutor(), [0, 1], False),
        (ProcessExecutor(), [None, None], False),
        (ProcessExecutor(), [0, 0, 1], True),
        (ProcessExecutor(mps=False), [0, 0], False),
        (ProcessExecutor(mps=True), [0, 1], True),
    ]:
        calls.unlink(missing_ok=True)
        with executor._sharing([{"gpu": g} for g in gpus]) as env:
            assert bool(env) == started, (executor, gpus)
        assert calls.exists() == started


def _environment(name: str) -> str | None:
    return os.environ.get(name)


def test_a_worker_gets_its_gpu_and_environment_before_its_work(monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    seen = workers._process(
        lambda: (_environment("CUDA_MPS_PIPE_DIRECTORY"), _environment("CUDA_VISIBLE_DEVICES")),
        threads=torch.get_num_threads(),
        gpu=3,
        env={"CUDA_MPS_PIPE_DIRECTORY": "/tmp/pipe"},
    )
    assert seen == ("/tmp/pipe", "3")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY")
