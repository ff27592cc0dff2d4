"""The GPU fast path: the training step captured in a CUDA graph. The CUDA tests skip
where no GPU exists (CI); the rules for when a graph is used are checked everywhere.
(On a GPU machine, test_train's NaN test covers the watch that never waits for the GPU:
its device is "auto".)"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from autosearch import SupernetConfig, TrainConfig
from autosearch.training._step import GraphedStep, graph_refusal
from autosearch.training.train import train
from autosearch.weight_sharing.supernet import train_supernet
from search_spaces import ResNetSpace

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _model(tiny_space, digits, seed=0):
    torch.manual_seed(seed)
    widest = tiny_space.make({gene: max(d.values()) for gene, d in tiny_space.domains().items()})
    return tiny_space.build(widest, input_shape=digits.input_shape, num_classes=10)


def _refusal(**given):
    settings = dict(
        device=torch.device("cuda"),
        distributed=False,
        precision="bf16",
        schedule="cosine",
        compiled=False,
        custom_loss=False,
        model=nn.Linear(2, 2),
    )
    return graph_refusal(**(settings | given))


def test_a_graph_is_used_only_where_every_step_is_the_same():
    assert _refusal() is None
    assert _refusal(precision="fp32") is None
    assert "CUDA" in _refusal(device=torch.device("cpu"))
    assert "DDP" in _refusal(distributed=True)
    assert "loss scaler" in _refusal(precision="fp16")
    assert "momentum" in _refusal(schedule="onecycle")
    assert "compile" in _refusal(compiled=True)
    assert "teacher" in _refusal(custom_loss=True)

    class Supernet(nn.Linear):
        def set_epoch(self, epoch: int) -> None: ...

    assert "changes between steps" in _refusal(model=Supernet(2, 2))
    assert "pins memory" in _refusal(streamed=True)


@pytest.fixture
def captures(monkeypatch):
    """Each GraphedStep made during the test, to see whether it captured."""
    made: list[GraphedStep] = []
    init = GraphedStep.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(GraphedStep, "__init__", spy)
    return made


@cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_graphed_training_learns_as_eager_training_does(
    tiny_space, digits, captures, precision, optimizer
):
    results = {}
    for graphs in (False, True):
        config = TrainConfig(
            epochs=3,
            batch_size=64,
            lr=0.1 if optimizer == "sgd" else 0.03,
            optimizer=optimizer,
            device="cuda",
            precision=precision,
            channels_last=True,
            cuda_graphs=graphs,
        )
        results[graphs] = train(_model(tiny_space, digits), digits, config, seed=0)
    (graphed,) = captures
    assert graphed.graph is not None and graphed.failed is None
    eager, replayed = results[False], results[True]
    assert replayed.val_accuracy > 0.8
    assert abs(replayed.val_accuracy - eager.val_accuracy) < 0.05
    for a, b in zip(eager.history, replayed.history, strict=True):
        assert b.train_loss == pytest.approx(a.train_loss, rel=0.1)


@cuda
def test_a_graphed_run_resumes_from_its_checkpoint(tiny_space, digits, tmp_path):
    config = TrainConfig(epochs=3, batch_size=64, lr=0.05, device="cuda", precision="bf16")

    class Stop(Exception):
        pass

    def stop(epoch):
        if epoch.epoch == 2:
            raise Stop

    path = tmp_path / "state.pt"
    with pytest.raises(Stop):
        train(_model(tiny_space, digits), digits, config, seed=1, checkpoint=path, on_epoch=stop)
    resumed = train(_model(tiny_space, digits, seed=5), digits, config, seed=1, checkpoint=path)
    straight = train(_model(tiny_space, digits), digits, config, seed=1)
    assert [e.epoch for e in resumed.history] == [1, 2, 3]
    assert abs(resumed.val_accuracy - straight.val_accuracy) < 0.05


@cuda
def test_a_failed_capture_trains_eagerly_and_says_so_once(tiny_space, digits, caplog):
    class HostSync(nn.Module):  # reads a value on the host every step: not capturable
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            out = self.inner(x)
            return out * (1.0 if float(out.detach().abs().max()) >= 0 else 0.0)

    model = HostSync(_model(tiny_space, digits))
    config = TrainConfig(epochs=2, batch_size=64, lr=0.05, device="cuda", precision="bf16")
    with caplog.at_level("WARNING", logger="autosearch.training._step"):
        result = train(model, digits, config, seed=0)
    assert result.val_accuracy > 0.5
    assert sum("CUDA graph capture failed" in r.message for r in caplog.records) == 1


def _elastic_resnet():
    """The elastic ResNet of benchmarks/ground_truth.py: some of its supernet's
    parameters first get a gradient after the first sandwich step."""
    return ResNetSpace(
        max_stages=3, depths=(1, 2, 3), widths=(8, 16), stem_widths=(8, 16), strides=(1, 2)
    ).supernet(
        fixed={"stages": 3, "block": "basic", "shortcut": "pad"}
        | {f"stage{i}.stride": 2 for i in (1, 2, 3)}
    )


def _train_supernet(digits, device: str) -> None:
    elastic = _elastic_resnet()
    net = elastic.build_supernet(input_shape=digits.input_shape, num_classes=10)
    recipe = TrainConfig(epochs=1, batch_size=64, device=device)
    train_supernet(net, elastic, digits, recipe, SupernetConfig(sandwich=2), seed=0)


def test_fused_sgd_is_kept_from_supernets_because_it_fails_on_them(digits, monkeypatch):
    """Why the trainer uses torch's fused kernels only for graphed steps: its fused SGD
    fails on a parameter that first gets a gradient after the first step (its momentum
    buffer is None), as a supernet's do. Seen on an H200 before the fix; forced here."""
    from autosearch.training import _optim

    sgd = _optim.OPTIMIZERS["sgd"]
    monkeypatch.setitem(_optim.OPTIMIZERS, "sgd", lambda p, c, graphed: sgd(p, c, True))
    with pytest.raises(TypeError, match="got NoneType"):
        _train_supernet(digits, "cpu")
    monkeypatch.setitem(_optim.OPTIMIZERS, "sgd", sgd)
    _train_supernet(digits, "cpu")  # the trainer's own choice: foreach kernels


@cuda
def test_a_supernet_trains_on_a_gpu(digits):
    _train_supernet(digits, "cuda")


@cuda
def test_subnets_are_evaluated_on_the_gpu_as_on_the_cpu(digits):
    """Issue 45: a subnet's evaluation on a GPU costs its arithmetic: the supernet, the
    calibration and evaluation images live there from the start, cuDNN's autotuner is
    off while subnets run, and the scores are the CPU's (TF32 aside)."""
    from autosearch.compress._fake_quant import estimate_int8
    from autosearch.compress.variants import Compression
    from autosearch.training.train import evaluate
    from autosearch.weight_sharing.supernet import SubnetEvaluator

    space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16)).supernet(
        fixed={"stages": 2, "block": "basic"}
    )
    config = SupernetConfig(sandwich=1)
    torch.manual_seed(0)
    net = space.build_supernet(input_shape=digits.input_shape, num_classes=10)
    train_supernet(net, space, digits, TrainConfig(epochs=2, device="cuda"), config, seed=0)
    torch.backends.cudnn.benchmark = True
    on_gpu = SubnetEvaluator(net, space, digits, config, seed=0, device="cuda")
    assert on_gpu.calibration.is_cuda and on_gpu.val.x.is_cuda and on_gpu.test.y.is_cuda
    arch = space.smallest()
    model, scored = on_gpu.evaluate(arch)
    assert next(model.parameters()).is_cuda and torch.backends.cudnn.benchmark  # restored
    on_cpu = SubnetEvaluator(net.cpu(), space, digits, config, seed=0, device="cpu")
    _, expected = on_cpu.evaluate(arch)
    assert abs(scored["accuracy"] - expected["accuracy"]) <= 2 / len(digits.val)
    estimate = estimate_int8(model, digits, Compression(), seed=0)  # estimated where it runs
    assert next(estimate.model.parameters()).is_cuda
    assert 0 < evaluate(estimate.model, on_gpu.val, digits)[0] <= 1
    # observed on the GPU (the histograms taken there), the ranges searched on the CPU:
    # the estimate scores as the same estimate made on the CPU (TF32 off for the check)
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        on_the_gpu = estimate_int8(model, digits, Compression(), seed=0)
        gpu_accuracy = evaluate(on_the_gpu.model, on_gpu.val, digits)[0]
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    on_the_cpu = estimate_int8(model.cpu(), digits, Compression(), seed=0)
    cpu_accuracy = evaluate(on_the_cpu.model, on_cpu.val, digits)[0]
    assert abs(gpu_accuracy - cpu_accuracy) <= 2 / len(digits.val), (gpu_accuracy, cpu_accuracy)


@cuda
def test_the_placement_rule_holds_what_a_trial_allocates_on_the_gpu(digits):
    """Everything the allocator held while a candidate trained (weights, optimizer,
    activations, resident images, cuDNN's workspaces) fits in the rule's size of it."""
    from autosearch.training.placement import step_need

    space = ResNetSpace(max_stages=3)
    model = space.build(space.default(), input_shape=digits.input_shape, num_classes=10)
    need = step_need(
        model, digits.input_shape, batch=64, precision="bf16", data_bytes=digits.train.x.nbytes
    )
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    config = TrainConfig(epochs=1, batch_size=64, device="cuda", precision="bf16")
    train(model, digits, config, seed=0)
    peak = torch.cuda.max_memory_allocated() - base
    assert 0 < peak <= need.total, (peak, need.describe())


@cuda
def test_a_worker_runs_cuda_under_the_platforms_mps_daemon_or_without_it():
    """Where MPS starts, a worker given its environment runs CUDA as its client; where
    it cannot, the environment is empty and CUDA runs as before."""
    import os
    import subprocess
    import sys

    from autosearch.workers import _mps

    probe = "import torch; print(torch.ones(4, device='cuda').sum().item())"
    with _mps.daemon() as env:
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0 and done.stdout.strip() == "4.0", done.stderr


@cuda
def test_a_subnet_on_the_gpu_is_predicted_as_its_cpu_copy(tiny_space):
    """The latency table traces a model on the GPU where it is (no copy a subnet) and
    predicts what it predicts for the same network on the CPU."""
    from autosearch.scoring.latency import LatencyTable

    table = LatencyTable(device="cpu:test", torch=torch.__version__.split("+")[0])
    model = tiny_space.build(tiny_space.default(), input_shape=(1, 8, 8), num_classes=10)
    expected = {batch: table.predict(model, (1, 8, 8), batch=batch) for batch in (1, 32)}
    on_gpu = model.to("cuda")
    for batch, value in expected.items():
        assert table.predict(on_gpu, (1, 8, 8), batch=batch) == value


@cuda
def test_a_pools_parent_reads_free_memory_without_holding_a_context():
    """Placing workers reads each GPU's free memory; a parent without a CUDA context
    does it in a short-lived process, and holds none for the run afterwards."""
    import subprocess
    import sys

    probe = (
        "import torch; from autosearch.workers.local import _free_memory; "
        "free = _free_memory(); assert not torch.cuda.is_initialized(); "
        "assert len(free) == torch.cuda.device_count() and min(free) > 0; print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_the_fused_benchmark_trains_several_models_as_one_under_bf16_autocast(digits):
    """benchmarks/gpu.py's fused section (k ResNet-20s vmapped as one model) under bf16
    autocast, as on the GPU, where batch norm's batching rule refused autocast's mixed
    dtypes (H200, 2026-11-29); the CPU's autocast refuses them too."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"
    spec = importlib.util.spec_from_file_location("gpu_benchmark", path)
    assert spec is not None and spec.loader is not None
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    gpu.BATCH = 64
    assert gpu.fused_images_per_s(digits, 2, device="cpu", steps=1) > 0


@cuda
def test_the_zero_cost_proxies_score_a_cuda_network_as_its_cpu_copy(tiny_space, digits):
    """Every proxy runs on a network and batch on the GPU (NASWOT's kernel once lived on
    the CPU: 'Expected all tensors to be on the same device', H200, 2026-11-29) and
    scores it as on the CPU."""
    from autosearch.evaluation.proxies import PROXIES, proxy_scores

    model = _model(tiny_space, digits)
    images = digits.normalize(digits.train.x[:32])
    labels = digits.train.y[:32]
    on_cpu = proxy_scores(model, images, labels)
    on_gpu = proxy_scores(model.cuda(), images.cuda(), labels.cuda())
    for name in PROXIES:
        assert on_gpu[name] == pytest.approx(on_cpu[name], rel=1e-2, abs=1e-6), name
