"""GPU training benchmark. Prints JSON; every ratio is measured within this run, on one GPU.

Sections (``--only`` picks some):

1. trainer: ResNet-20 on Fashion-MNIST (48,000 training images, batch 256), images/s of a
   steady epoch (training and validation, the median of epochs 2..E) for fp32, bf16 and
   bf16 + channels_last, each with CUDA graphs off and on; the first epoch against a
   steady one; the validation accuracy after E epochs. Against a hand-written loop with
   the same tricks (data on the GPU, bf16, channels_last, fused SGD, the whole step
   captured in a CUDA graph by hand), and, with ``--baseline DIR`` (a copy of the
   package before the change), against the trainer as it was.
2. warmup: the first epoch of a new architecture against its steady epoch, three
   architectures, with cuDNN's autotuner (``cudnn.benchmark``) off and on.
3. workers: trials per hour with 1, 2, 4 and 8 worker processes sharing the GPU (each
   trial: a ResNet-20-sized candidate, one epoch on 12,000 images), plain and under the
   CUDA MPS daemon the platform starts (target: >= 2.5x one worker).
   fused: 1..16 ResNet-20s trained as one fused model (torch.func: stacked weights,
   vmap), images/s against one in the trainer's fast path.
   placement: the placement rule's size of a trial against the allocator's peak, and
   how many the rule puts on this GPU.
4. batch: ``auto_batch_size``'s choice (the trainer's rule, said in words), its images/s
   and its validation accuracy against batch 256.
5. study: a ``make run``-like study (random search, ResNet space, 6 trials, 2 epochs)
   on Fashion-MNIST: wall time, trials per hour and the best accuracy.
6. subnet: one subnet of a Fashion-MNIST supernet (the guide's ResNet sub-space, 28 x 28)
   evaluated as a search evaluates it (weights inherited, batch norm recalibrated on 256
   training images, 2,000 validation images): seconds a subnet, the first and the
   median of the rest (target <= 0.1 s on the GPU).
7. ws_example: the weight-sharing guide's example (``benchmarks/ws_example.py --device
   cuda --then-workers 4 --profile 20``): subnets a minute of the guide's
   ``optimize(1000, n_workers=2)`` with int8 estimates and latency predictions (target
   <= 60 s); then 1,000 more by four worker processes sharing the GPU (a trial's host
   side, Python between small passes, is most of it: the H200 of 2026-11-29 ran 474 a
   minute in one process), and 20 more under torch.profiler in this process: the
   operators of a trial's host and device time, its driver calls.
8. int8: the int8 estimate on the GPU against the real int8 program (lowered and run
   on the CPU), Fashion-MNIST, 2,400 validation images (``benchmarks/int8_estimate.py
   --device cuda``; target: a tenth of the real program's time, within 0.3 point).

Where no CUDA GPU exists it prints one line saying so and exits 0 (CI).

    python benchmarks/gpu.py [--data fashion-mnist] [--epochs 4] [--baseline DIR] [--out F]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent

BATCH = 256


def _config(**fields):
    """A TrainConfig from the fields this version of it has (a baseline copy of the
    package may predate some)."""
    from autosearch.training.train import TrainConfig

    known = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in fields.items() if k in known})


def _resnet20(data, seed: int = 0):
    from search_spaces import ResNetSpace

    torch.manual_seed(seed)
    space = ResNetSpace(max_stages=3)
    return space.build(
        space.reference("resnet20"), input_shape=data.input_shape, num_classes=data.num_classes
    )


def _run(model, data, config) -> dict[str, float]:
    from autosearch.training.train import train

    result = train(model, data, config, seed=0)
    seconds = [e.seconds for e in result.history]
    steady = statistics.median(seconds[1:])
    return {
        "images_per_s": len(data.train) / steady,
        "first_epoch_vs_steady": seconds[0] / steady,
        "val_accuracy": result.val_accuracy,
    }


def trainer_configs(data, epochs: int, graphs: bool = True) -> dict[str, dict[str, float]]:
    """The trainer at each precision and memory format (with and without graphs)."""
    variants = {
        "fp32": {"precision": "fp32"},
        "bf16": {"precision": "bf16"},
        "bf16_channels_last": {"precision": "bf16", "channels_last": True},
    }
    out = {}
    for name, extra in variants.items():
        for use in (False, True) if graphs else (False,):
            config = _config(
                epochs=epochs, batch_size=BATCH, lr=0.1, device="cuda", cuda_graphs=use, **extra
            )
            label = f"{name}_graphs" if use else name
            out[label] = _run(_resnet20(data), data, config)
    return out


def sync_count(data) -> dict:
    """Host waits for the GPU during two epochs of bf16 + channels_last training, as
    ``torch.cuda.set_sync_debug_mode`` reports them, by where they happen."""
    import collections
    import warnings

    config = _config(
        epochs=2, batch_size=BATCH, lr=0.1, device="cuda", precision="bf16", channels_last=True
    )
    model = _resnet20(data)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _run(model, data, config)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    where = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught)
    return {
        "steps": 2 * -(-len(data.train) // BATCH),
        "syncs": len(caught),
        "where": dict(where.most_common(8)),
    }


def hand_loop(data, epochs: int, graph: bool) -> dict[str, float]:
    """What an expert writes by hand for this model: data on the GPU, bf16 autocast,
    channels_last, fused SGD with a cosine schedule, and (``graph``) the whole step
    captured in a CUDA graph after three warm-up steps; validation after each epoch."""
    from autosearch.training.train import evaluate

    device = torch.device("cuda")
    model = _resnet20(data).to(device).to(memory_format=torch.channels_last)
    x_all, y_all = data.train.x.to(device), data.train.y.to(device)
    steps = epochs * -(-len(y_all) // BATCH)
    lr = torch.tensor(0.1, device=device)
    opt = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4, fused=True
    )
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), steps
    )  # a float schedule, copied into the device tensor each step
    static_x = torch.empty((BATCH, *data.input_shape), device=device)
    static_y = torch.empty(BATCH, dtype=torch.long, device=device)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            loss = F.cross_entropy(
                model(static_x.contiguous(memory_format=torch.channels_last)), static_y
            )
        loss.backward()
        opt.step()
        return loss

    g, times = None, []
    generator = torch.Generator(device=device).manual_seed(0)
    for epoch in range(epochs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.train()
        for i, idx in enumerate(
            torch.randperm(len(y_all), device=device, generator=generator).split(BATCH)
        ):
            if len(idx) != BATCH:
                continue  # the hand loop drops the last partial batch
            static_x.copy_(data.normalize(x_all[idx]))
            static_y.copy_(y_all[idx])
            lr.fill_(sched.get_last_lr()[0])
            if g is not None:
                g.replay()
            elif not graph or epoch * 1000 + i < 3:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    opt.zero_grad(set_to_none=True)
                    step()
                torch.cuda.current_stream().wait_stream(s)
            else:
                opt.zero_grad(set_to_none=True)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    step()
                g.replay()
            sched.optimizer.step()
            sched.step()
        accuracy, _ = evaluate(model, data.val, data)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    steady = statistics.median(times[1:])
    return {
        "images_per_s": len(y_all) / steady,
        "first_epoch_vs_steady": times[0] / steady,
        "val_accuracy": accuracy,
    }


def _guarded(measure) -> dict:
    """A measurement, or the error that stopped it (the other measurements go on)."""
    try:
        return measure()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}


def bench_trainer(data, epochs: int, baseline: str | None, data_spec: str) -> dict:
    ours = trainer_configs(data, epochs)
    out: dict = {"autosearch": ours, "syncs": _guarded(lambda: sync_count(data))}
    out["hand_written"] = {
        "bf16_channels_last_eager": _guarded(lambda: hand_loop(data, epochs, graph=False)),
        "bf16_channels_last_graphs": _guarded(lambda: hand_loop(data, epochs, graph=True)),
    }
    best = ours["bf16_channels_last_graphs"]["images_per_s"]
    hand = out["hand_written"]["bf16_channels_last_graphs"].get("images_per_s")
    if hand:
        out["vs_hand_written_graphs"] = best / hand
    if baseline:
        paths = [baseline, os.environ.get("PYTHONPATH", "")]
        command = [sys.executable, __file__, "--baseline-child"]
        run = subprocess.run(
            [*command, "--data", data_spec, "--epochs", str(epochs)],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
            capture_output=True,
            text=True,
            timeout=600,
        )
        if run.returncode:
            out["before"] = {"error": run.stderr.strip().splitlines()[-3:]}
        else:
            before = json.loads(run.stdout.strip().splitlines()[-1])
            out["before"] = before
            out["speedup_vs_before"] = {
                name: best / before[name]["images_per_s"] for name in before if name != "syncs"
            }
    return out


def bench_warmup(data) -> dict:
    """The first epoch of three new architectures against their steady epochs, with
    cuDNN's autotuner off (the default) and on."""
    import random

    from search_spaces import ResNetSpace

    space = ResNetSpace(max_stages=3)
    out = {}
    for autotune in (False, True):
        os.environ["AUTOSEARCH_CUDNN_BENCHMARK"] = str(int(autotune))
        ratios = []
        for seed in range(3):
            rng = random.Random(seed)
            genes = {**space.default(), "stages": 3, "block": "basic"}
            for s in (1, 2, 3):
                genes[f"stage{s}.depth"] = rng.choice((1, 2, 3))
                genes[f"stage{s}.width"] = rng.choice((16, 32, 64))
            torch.manual_seed(seed)
            model = space.build(
                space.make(genes), input_shape=data.input_shape, num_classes=data.num_classes
            )
            config = _config(
                epochs=3,
                batch_size=BATCH,
                lr=0.1,
                device="cuda",
                precision="bf16",
                channels_last=True,
            )
            ratios.append(_run(model, data, config)["first_epoch_vs_steady"])
        label = "cudnn_benchmark" if autotune else "default"
        out[label] = {"first_epoch_vs_steady": ratios, "worst": max(ratios)}
    os.environ.pop("AUTOSEARCH_CUDNN_BENCHMARK")
    return out


_WORKER = r"""
import sys, time, json, pathlib, torch
from autosearch.data import load_data
from autosearch.training.train import TrainConfig, train
from search_spaces import ResNetSpace
torch.set_num_threads(2)
import dataclasses
from autosearch.data import Split
data = load_data({data!r})
data = dataclasses.replace(data, train=Split(x=data.train.x[:12000], y=data.train.y[:12000]))
space = ResNetSpace(max_stages=3)
def resnet20():
    ref = space.reference("resnet20")
    return space.build(ref, input_shape=data.input_shape, num_classes=data.num_classes)
config = TrainConfig(
    epochs=1, batch_size=256, lr=0.1, device="cuda", precision="bf16", channels_last=True
)
torch.zeros(1, device="cuda")
train(resnet20(), data, config, seed=10_000)  # a pool's worker is warm after its first trial
torch.cuda.synchronize()
go = pathlib.Path({go!r})
print("READY", flush=True)
while not go.exists():
    time.sleep(0.01)
seconds, cpu = [], time.process_time()
for t in range({trials}):
    start = time.perf_counter()
    torch.manual_seed(t)
    train(resnet20(), data, config, seed=t)
    seconds.append(time.perf_counter() - start)
torch.cuda.synchronize()
print("TRIALS", json.dumps({{"seconds": seconds, "cpu": time.process_time() - cpu}}), flush=True)
print("END", time.time(), flush=True)
"""


def bench_workers(data_spec: str, total: int) -> dict:
    """Trials per hour with 1, 2, 4 and 8 worker processes on the GPU, each way of
    sharing it: plain processes (the GPU time-sliced between their contexts) and under
    the CUDA MPS daemon the platform starts for workers that share a GPU
    (autosearch.workers._mps, as ProcessExecutor does)."""
    from autosearch.workers import _mps

    out: dict = {}

    def measure(n: int, env: dict[str, str], label: str) -> float:
        """Trials an hour of ``n`` warm workers; beside it (under ``profile``) what each
        trial took, the host's CPU cores the workers kept busy and the GPU's utilization
        (nvidia-smi, sampled every 100 ms) while they ran."""
        with tempfile.TemporaryDirectory() as tmp:
            go = Path(tmp) / "go"
            script = Path(tmp) / "w.py"
            script.write_text(_WORKER.format(data=data_spec, go=str(go), trials=max(1, total // n)))
            procs = [
                subprocess.Popen(
                    [sys.executable, str(script)],
                    stdout=subprocess.PIPE,
                    text=True,
                    env={**os.environ, **env},
                )
                for _ in range(n)
            ]
            for p in procs:
                assert p.stdout is not None
                while "READY" not in (p.stdout.readline() or "READY"):
                    pass
            smi = subprocess.Popen(
                [
                    *("nvidia-smi", "--query-gpu=utilization.gpu"),
                    *("--format=csv,noheader,nounits", "-lms", "100"),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            start = time.time()
            go.touch()
            ends, trials, used = [], [], 0.0
            for p in procs:
                text, _ = p.communicate(timeout=600)
                ends.append(float(text.split("END")[-1]))
                done = json.loads(text.split("TRIALS")[-1].split("END")[0])
                trials += done["seconds"]
                used += done["cpu"]
            wall = max(ends) - start
            smi.terminate()
            busy = [float(v) for v in smi.communicate()[0].split() if v.strip().isdigit()]
        profile[f"{label}{n}"] = {
            "trial_s_median": statistics.median(trials),
            "trial_s_max": max(trials),
            "host_cores_busy": used / wall,  # the workers' CPU seconds over the wall
            "gpu_utilization_mean": statistics.mean(busy) if busy else None,
        }
        return max(1, total // n) * n / wall * 3600

    profile: dict = {}
    out["profile"] = profile
    for n in (1, 2, 4, 8):
        out[f"trials_per_hour_{n}"] = measure(n, {}, "plain_")
    for n in (2, 4, 8):
        out[f"gain_{n}_vs_1"] = out[f"trials_per_hour_{n}"] / out["trials_per_hour_1"]
    try:
        with _mps.daemon(required=True) as env:
            for n in (2, 4, 8):
                out[f"mps_trials_per_hour_{n}"] = measure(n, env, "mps_")
                out[f"mps_gain_{n}_vs_1"] = (
                    out[f"mps_trials_per_hour_{n}"] / out["trials_per_hour_1"]
                )
    except Exception as exc:  # a container that forbids MPS: said, the rest stands
        out["mps"] = f"could not start: {exc}"[:300]
    return out


class _FloatBatchNorm(nn.BatchNorm2d):
    """Batch norm on a bf16 input in float32, cast back. Under vmap, batch norm's batching
    rule needs its input and weights in one dtype, which autocast's bf16 activations and
    float32 weights are not ("Expected grad_output to have type BFloat16 but got Float"
    on the H200, 2026-11-29; the CPU fails in the forward)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float()).to(x.dtype)


def fused_images_per_s(data, k: int, *, device: str = "cuda", steps: int = 30) -> float:
    """Images a second of ``k`` ResNet-20s trained as one fused model (horizontal fusion,
    HFTA's idea, with torch.func: the k models' weights stacked, one vmapped forward and
    backward, each model on a batch of its own, one fused SGD step for all), bf16
    autocast on a GPU."""
    from torch.func import functional_call, grad_and_value, stack_module_state, vmap

    models = [_resnet20(data, seed=s).to(device).train() for s in range(k)]
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")
    for module in base.modules():  # see _FloatBatchNorm
        if type(module) is nn.BatchNorm2d:
            module.__class__ = _FloatBatchNorm
    kind = torch.device(device).type

    def loss(p, b, x, y):
        with torch.autocast(kind, dtype=torch.bfloat16):
            out = functional_call(base, (p, b), (x,))
        return F.cross_entropy(out.float(), y)

    step = vmap(grad_and_value(loss), in_dims=(0, 0, 0, 0), randomness="different")
    weights = list(params.values())
    sgd = torch.optim.SGD(weights, lr=0.05, momentum=0.9, nesterov=True)
    n = k * BATCH
    x = data.normalize(data.train.x[:n].to(device)).reshape(k, BATCH, *data.input_shape)
    y = data.train.y[:n].to(device).reshape(k, BATCH)

    def once() -> None:
        grads, _ = step(params, buffers, x, y)
        for w, name in zip(weights, params, strict=True):
            w.grad = grads[name]
        sgd.step()

    for _ in range(3):
        once()
    if kind == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        once()
    if kind == "cuda":
        torch.cuda.synchronize()
    return n * steps / (time.perf_counter() - start)


def bench_fused(data) -> dict:
    """Several candidates of one shape on a GPU as one fused model: images a second of
    1, 2, 4, 8 and 16 ResNet-20s fused, against one ResNet-20 in the trainer (bf16,
    channels_last, CUDA graphs: the single-trial fast path), on the same GPU."""
    from autosearch.data import Split

    small = dataclasses.replace(data, train=Split(x=data.train.x[:12000], y=data.train.y[:12000]))
    config = _config(
        epochs=3, batch_size=BATCH, lr=0.1, device="cuda", precision="bf16", channels_last=True
    )
    out: dict = {"trainer_images_per_s": _run(_resnet20(small), small, config)["images_per_s"]}
    for k in (1, 2, 4, 8, 16):
        try:
            rate = fused_images_per_s(data, k)
        except Exception as exc:
            out[f"fused_{k}"] = f"{type(exc).__name__}: {exc}"[:300]
            break
        out[f"fused_{k}_images_per_s"] = rate
        out[f"fused_{k}_vs_trainer"] = rate / out["trainer_images_per_s"]
    return out


def bench_placement(data) -> dict:
    """The placement rule's size of a trial against what the GPU's allocator held while
    it trained: ResNet-20 and two wider candidates (bf16, channels_last, batch 256, two
    epochs on 4,096 images), the allocator's peak counted from before each (the CUDA
    context is in neither) as trials train, then with cuDNN's autotuner off, then with
    CUDA graphs off too (where the rule's missing bytes are), and how many of each the
    rule puts on this GPU."""
    from autosearch.data import Split
    from autosearch.training.placement import per_gpu, step_need
    from search_spaces import ResNetSpace

    space = ResNetSpace(max_stages=3)
    small = dataclasses.replace(data, train=Split(x=data.train.x[:4096], y=data.train.y[:4096]))
    config = _config(
        epochs=2, batch_size=BATCH, lr=0.1, device="cuda", precision="bf16", channels_last=True
    )
    free = torch.cuda.mem_get_info()[0]
    out: dict = {"free_gib": free / 2**30}
    for width in (16, 32, 64):
        genes = {**space.reference("resnet20").genes}
        for s in (1, 2, 3):
            genes[f"stage{s}.width"] = width * 2 ** (s - 1)
        model = space.build(
            space.make(genes), input_shape=data.input_shape, num_classes=data.num_classes
        )
        need = step_need(
            model,
            data.input_shape,
            batch=BATCH,
            precision="bf16",
            data_bytes=int(small.train.x.nbytes),
        )
        peaks = {}
        for label, autotune, graphs in (
            ("peak_allocated_gib", True, True),  # as trials train
            ("without_autotuner_gib", False, True),  # cuDNN's benchmark workspaces out
            ("without_either_gib", False, False),  # and the CUDA graph's private pool
        ):
            os.environ["AUTOSEARCH_CUDNN_BENCHMARK"] = str(int(autotune))
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            _run(copy.deepcopy(model), small, dataclasses.replace(config, cuda_graphs=graphs))
            peaks[label] = (torch.cuda.max_memory_allocated() - base) / 2**30
        os.environ.pop("AUTOSEARCH_CUDNN_BENCHMARK")
        out[f"width_{width}"] = {
            "predicted_gib": (need.total - need.context) / 2**30,
            **peaks,
            "per_gpu": per_gpu(need, free),
        }
    return out


def bench_batch(data, epochs: int) -> dict:
    fixed = _run(
        _resnet20(data),
        data,
        _config(
            epochs=epochs,
            batch_size=BATCH,
            lr=0.1,
            device="cuda",
            precision="bf16",
            channels_last=True,
        ),
    )
    from autosearch.training._batch import batch_cap, find_batch_size, grown
    from autosearch.training.runtime import resolve

    config = _config(
        epochs=epochs, batch_size=BATCH, lr=0.1, device="cuda", precision="bf16", channels_last=True
    )
    cap = batch_cap(config, data)  # the trainer's own rule, said here as it decides
    fits = find_batch_size(
        _resnet20(data), data, config, resolve(device="cuda", precision="bf16"), limit=cap
    )
    chosen, said = grown(config, fits, cap=cap, images=len(data.train))
    auto = _run(_resnet20(data), data, dataclasses.replace(config, auto_batch_size=True))
    return {
        "batch_256": fixed,
        "auto_batch_size": chosen.batch_size,
        "rule": said,
        "auto": auto,
        "speedup": auto["images_per_s"] / fixed["images_per_s"],
        "accuracy_points_lost": 100 * (fixed["val_accuracy"] - auto["val_accuracy"]),
        "target": "within 0.5 point of batch 256 at >= 1.5x its images/s",
    }


def bench_study(data_spec: str) -> dict:
    from autosearch import TrainConfig, create_study
    from controllers import RandomSearch
    from search_spaces import ResNetSpace

    with tempfile.TemporaryDirectory() as tmp:
        study = create_study(
            "gpu",
            controller=RandomSearch(
                ResNetSpace(max_stages=3, depths=(1, 2, 3), widths=(16, 32, 64)), seed=0
            ),
            data=data_spec,
            train=TrainConfig(epochs=2, batch_size=BATCH, lr=0.1),
            storage=f"sqlite:///{tmp}/s.db",
        )
        start = time.perf_counter()
        study.optimize(6)
        seconds = time.perf_counter() - start
        best = study.best()
        return {
            "seconds": seconds,
            "trials_per_hour": 6 / seconds * 3600,
            "complete": study.trials.count("complete"),
            "best_val_accuracy": best.metrics["accuracy"],
        }


def bench_subnet(data, device: str = "cuda", subnets: int = 30) -> dict:
    """Seconds to evaluate one subnet of a Fashion-MNIST supernet on ``device``."""
    import numpy as np

    from autosearch import SupernetConfig
    from autosearch.weight_sharing.supernet import SubnetEvaluator
    from search_spaces import ResNetSpace

    space = ResNetSpace(max_stages=3, depths=(1, 2, 3), widths=(8, 16, 24, 32)).supernet(
        fixed={"stages": 3, "block": "basic"}
    )
    torch.manual_seed(0)
    net = space.build_supernet(input_shape=data.input_shape, num_classes=data.num_classes)
    config = SupernetConfig(eval_images=2000, calibration_images=256, test_accuracy=False)
    evaluator = SubnetEvaluator(net, space, data, config, seed=0, device=device)
    rng = np.random.default_rng(0)
    seconds, params = [], []
    for _ in range(subnets):
        arch = space.sample(rng)
        start = time.perf_counter()
        model, _metrics = evaluator.evaluate(arch)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        params.append(sum(p.numel() for p in model.parameters()))
    return {
        "device": device,
        "subnets": subnets,
        "params_median": statistics.median(params),
        "first_s": seconds[0],
        "median_s": statistics.median(seconds[1:]),
        "max_s": max(seconds[1:]),
        "target": "<= 0.1 s a subnet on the GPU",
    }


def _script_json(name: str, *arguments: str, timeout: int = 900) -> dict:
    """Run another benchmark of this folder and return the JSON it prints."""
    done = subprocess.run(
        [sys.executable, str(HERE / name), *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode:
        return {"error": f"{name} exited {done.returncode}: {done.stderr.strip()[-500:]}"}
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="fashion-mnist")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--baseline", help="folder holding the package before the change")
    parser.add_argument("--baseline-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workers-trials", type=int, default=16)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--out", help="also write each section's JSON here as it ends")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA GPU here; benchmarks/gpu.py measures only on one"}))
        return
    import logging

    logging.getLogger("autosearch").setLevel(logging.WARNING)
    from autosearch.data import load_data

    data = load_data(args.data)
    if args.baseline_child:
        before = trainer_configs(data, args.epochs, graphs=False)
        print(json.dumps({**before, "syncs": sync_count(data)}))
        return
    sections = {
        "trainer": lambda: bench_trainer(data, args.epochs, args.baseline, args.data),
        "warmup": lambda: bench_warmup(data),
        "workers": lambda: bench_workers(args.data, args.workers_trials),
        "fused": lambda: bench_fused(data),
        "placement": lambda: bench_placement(data),
        "batch": lambda: bench_batch(data, args.epochs),
        "study": lambda: bench_study(args.data),
        "subnet": lambda: bench_subnet(data),
        "ws_example": lambda: _script_json(
            "ws_example.py", "--device", "cuda", "--then-workers", "4", "--profile", "20"
        ),
        "int8": lambda: _script_json("int8_estimate.py", "--device", "cuda", "--data", args.data),
    }
    out: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "data": args.data,
        "train_images": len(data.train),
    }
    for name in args.only or list(sections):
        start = time.perf_counter()
        try:
            out[name] = sections[name]()
        except Exception as exc:  # one section's failure is reported; the rest still run
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        out[name + "_s"] = time.perf_counter() - start
        if args.out:
            Path(args.out).write_text(json.dumps(out, indent=2))
        print(name, json.dumps(out[name]), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
