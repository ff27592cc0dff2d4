"""The shared training stack: precision, checkpoints with exact resume, DDP under torchrun."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from autosearch import TrainConfig, TrialFailed
from autosearch.data import cutout
from autosearch.training.runtime import resolve
from autosearch.training.train import train

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
    with pytest.raises(ValueError, match="precision=.fp8. cannot be used: expected one of auto"):
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
    from autosearch.training._optim import make_schedule

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
    schedule = make_schedule(optimizer, config, steps_per_epoch=25, epochs=4)
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
    holes = cutout(x, 3, torch.Generator().manual_seed(0))
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
    from autosearch.training.train import train

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
    killed = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, timeout=1800)
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
    from autosearch.training.runtime import init_distributed, leave_distributed, resolve
    from autosearch.training.train import train

    def main():
        init_distributed("cpu")  # gloo, even on a machine with GPUs
        runtime = resolve(device="cpu", precision="fp32")
        for name, data, epochs, stream, workers in {runs!r}:
            os.environ.pop("AUTOSEARCH_LOADER_WORKERS", None)
            os.environ.update(workers)
            model = _net()
            config = TrainConfig(
                epochs=epochs, batch_size=64, lr=0.05, crop_padding=1, device="cpu"
            )
            result = train(model, load_data(data, stream=stream), config, seed=3, runtime=runtime)
            torch.save(
                {{"params": model.state_dict(), "world": result.world_size,
                  "accuracy": result.val_accuracy}},
                os.path.join({out!r}, f"{{name}}-rank{{runtime.rank}}.pt"),
            )
        leave_distributed()  # together, before the interpreter's teardown

    if __name__ == "__main__":  # loader workers import this script
        main()
    """
)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, digits_folder) -> dict[str, list[dict]]:
    """``_net`` trained by 2 torchrun processes (gloo, 1 thread each), once for the
    module: on the digits in memory (2 epochs) and on the digits folder streamed from
    its files by one loader worker (3 epochs); by run, each rank's parameters, world
    size and validation accuracy."""
    out = tmp_path_factory.mktemp("ddp")
    runs = [
        ("memory", "digits", 2, False, {}),
        ("streamed", f"folder:{digits_folder}", 3, True, {"AUTOSEARCH_LOADER_WORKERS": "1"}),
    ]
    code = out / "ddp.py"
    code.write_text(_DDP_RUN.format(tests=str(ROOT / "tests"), out=str(out), runs=runs))
    subprocess.run(
        [
            str(Path(sys.executable).with_name("torchrun")),
            "--standalone",
            "--nproc-per-node=2",
            str(code),
        ],
        cwd=out,
        env={**os.environ, "OMP_NUM_THREADS": "1", "AUTOSEARCH_CACHE": str(out / "cache")},
        check=True,
        timeout=1800,
    )
    return {
        name: [torch.load(out / f"{name}-rank{r}.pt", weights_only=True) for r in (0, 1)]
        for name, *_ in runs
    }


@pytest.mark.slow
def test_two_torchrun_processes_match_one_process(digits, two_ranks):
    ranks = two_ranks["memory"]
    assert ranks[0]["world"] == ranks[1]["world"] == 2
    single = _net()
    config = TrainConfig(epochs=2, batch_size=64, lr=0.05, crop_padding=1, device="cpu")
    train(single, digits, config, seed=3)
    for name, value in single.state_dict().items():
        assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
        torch.testing.assert_close(ranks[0]["params"][name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_study_runs_under_torchrun_with_rank_0_storing(tmp_path, parallel):
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
            train=TrainConfig(epochs=1, batch_size=128, lr=0.1, parallel=PARALLEL),
            n_trials=2,
        )
        """
        ).replace("PARALLEL", repr(parallel))
    )
    cli = Path(sys.executable).with_name("autosearch")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # One of the two exports its best (FSDP's weights, stored whole, rebuilt); DDP's says
    # where its export would come from.
    no_export = ["--no-export"] if parallel == "ddp" else []
    done = subprocess.run(
        [str(cli), "run", "tiny.py", "--nproc-per-node", "2", *no_export],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("Pareto front") == 1  # rank 0 alone reports
    best = tmp_path / "runs" / "ddp" / "best"
    if no_export:
        assert not best.exists() and "not written (--no-export)" in done.stdout, done.stdout
    else:
        assert (best / "model.onnx").is_file() and (best / "model.safetensors").is_file()
    study = autosearch.load_study("ddp", storage=f"sqlite:///{tmp_path}/runs/ddp/study.db")
    records = study.records()
    assert len(records) == 2 and all(r.state == "complete" for r in records)
    assert all(r.metrics["world_size"] == 2 for r in records)


def test_batch_size_finder_takes_the_largest_batch_that_fits(digits):
    from autosearch.training._batch import find_batch_size

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


@pytest.fixture
def streamed(digits_folder, tmp_path, monkeypatch):
    """The digits folder, streamed from its files."""
    from autosearch.data import load_data
    from autosearch.data.loading import load_named

    monkeypatch.setenv("AUTOSEARCH_CACHE", str(tmp_path / "cache"))
    load_named.cache_clear()
    return load_data(f"folder:{digits_folder}", stream=True)


def test_a_streamed_folder_trains_the_same_with_any_number_of_workers(streamed, monkeypatch):
    config = TrainConfig(epochs=3, batch_size=32, lr=0.2, crop_padding=1, device="cpu")
    runs = {}
    for workers in ("0", "2"):
        monkeypatch.setenv("AUTOSEARCH_LOADER_WORKERS", workers)
        loader, _ = streamed.train.loader(64, seed=0)
        assert loader.num_workers == int(workers)
        model = _net()
        runs[workers] = (train(model, streamed, config, seed=5), model.state_dict())
    (result, weights), (_, other) = runs["0"], runs["2"]
    assert result.val_accuracy > 0.7  # it learned from the files (chance: 0.1)
    for name, value in weights.items():
        assert torch.equal(value, other[name]), name


def test_no_loader_worker_is_forked_from_the_training_process():
    """A training process has threads (queue feeders, pin-memory, gloo); a worker forked
    from it can inherit a lock another thread held and wait on it forever (a DDP rank's
    evaluation worker did, in CI). Every DataLoader in the package is built by
    ``_stream._loader``, whose workers start from a fork server."""
    import ast

    from autosearch.data import _stream

    package = Path(_stream.__file__).parents[1]
    calls = []
    for source in package.rglob("*.py"):
        tree = ast.parse(source.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                callee = node.func if isinstance(node, ast.Call) else None
                name = getattr(callee, "id", getattr(callee, "attr", None))
                if name in ("DataLoader", "_Loader"):  # _Loader: _stream's DataLoader
                    calls.append(f"{source.relative_to(package)}:{function.name}")
    assert calls and set(calls) == {"data/_stream.py:_loader"}, calls
    assert _stream.worker_context().get_start_method() in {"forkserver", "spawn"}


def test_a_script_reads_files_in_workers_only_under_its_main_guard(streamed, tmp_path):
    """Each loader worker imports the main script: from its unguarded top level that
    would run the script again, so there the files are read in the process itself."""
    body = textwrap.dedent(
        f"""
        import os
        os.environ["AUTOSEARCH_LOADER_WORKERS"] = "1"
        os.environ["AUTOSEARCH_CACHE"] = {os.environ["AUTOSEARCH_CACHE"]!r}
        from autosearch.data import load_data
        data = load_data("folder:" + {str(streamed.name.removeprefix("folder:"))!r}, stream=True)
        loader, _ = data.train.loader(64, seed=0)
        images, labels = next(iter(loader))
        print(loader.num_workers, type(loader.multiprocessing_context).__name__, len(labels))
        """
    )
    guarded = (
        "def main():\n"
        + textwrap.indent(body, "    ")
        + '\nif __name__ == "__main__":\n    main()\n'
    )
    runs = {}
    for name, code in (("unguarded", body), ("guarded", guarded)):
        (tmp_path / f"{name}.py").write_text(code)
        runs[name] = subprocess.run(
            [sys.executable, f"{name}.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert runs[name].returncode == 0, runs[name].stderr
    assert runs["unguarded"].stdout.split() == ["0", "NoneType", "64"]
    assert "unguarded.py line 7 reads image files from the top level" in runs["unguarded"].stderr
    assert runs["guarded"].stdout.split() == ["1", "ForkServerContext", "64"]
    assert "top level" not in runs["guarded"].stderr


def test_streamed_ranks_read_disjoint_shares_of_one_permutation(streamed):
    shares = [streamed.train.loader(16, seed=3, rank=r, world_size=2, workers=0)[1] for r in (0, 1)]
    for sampler in shares:
        sampler.set_epoch(4)
    first, second = (list(s) for s in shares)
    assert len(first) == len(second) == math.ceil(len(streamed.train) / 2)
    assert set(first) | set(second) == set(range(len(streamed.train)))
    # Disjoint but for the one sample the sampler repeats to even out an odd split.
    assert len(set(first) & set(second)) == len(streamed.train) % 2


def test_an_interrupted_streamed_run_resumes_to_the_same_weights(streamed, tmp_path):
    config = TrainConfig(epochs=3, lr=0.05, crop_padding=1, cutout=2, device="cpu")
    straight = _net()
    train(straight, streamed, config, seed=2)

    def stop_after_2(result):
        if result.epoch == 2:
            raise KeyboardInterrupt

    checkpoint = tmp_path / "run.pt"
    with pytest.raises(KeyboardInterrupt):
        train(_net(), streamed, config, seed=2, checkpoint=checkpoint, on_epoch=stop_after_2)
    resumed = _net(seed=9)
    result = train(resumed, streamed, config, seed=2, checkpoint=checkpoint)
    assert [e.epoch for e in result.history] == [1, 2, 3]
    for name, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name


def test_training_images_stay_on_the_gpu_only_when_they_fit():
    from autosearch.training._feed import resident as _resident

    gpu = torch.device("cuda", 0)
    assert _resident(400, gpu, free=1000) == gpu
    assert _resident(600, gpu, free=1000) == torch.device("cpu")  # over half the free memory
    assert _resident(10**12, torch.device("cpu")) == torch.device("cpu")


@pytest.mark.slow
def test_two_torchrun_processes_train_a_streamed_folder(streamed, two_ranks):
    ranks = two_ranks["streamed"]
    assert ranks[0]["world"] == ranks[1]["world"] == 2
    for name, value in ranks[0]["params"].items():
        assert torch.equal(value, ranks[1]["params"][name]), name
    single = train(
        _net(),
        streamed,
        TrainConfig(epochs=3, batch_size=64, lr=0.05, crop_padding=1, device="cpu"),
        seed=3,
    )
    # Each rank read half of every global batch; the result is as good as one process's.
    assert ranks[0]["accuracy"] == ranks[1]["accuracy"]
    assert abs(ranks[0]["accuracy"] - single.val_accuracy) < 0.05


def test_a_study_searches_a_folder_too_large_for_memory(
    digits_folder, tmp_path, monkeypatch, make_study
):
    from autosearch.data.loading import load_named

    monkeypatch.setenv("AUTOSEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTOSEARCH_DATA_MEMORY", "1K")  # far less than the 115 kB decoded
    load_named.cache_clear()
    study = make_study(
        data=f"folder:{digits_folder}",
        variants=("base", "int8"),
        train=TrainConfig(epochs=2, batch_size=32, lr=0.1),
    )
    assert study.data.streamed
    study.optimize(n_trials=2)
    records = study.records(variants=True)
    assert len(records) == 4 and all(r.state == "complete" for r in records)
    for record in records:  # learned (chance is 0.1), int8 too
        assert record.metrics["accuracy"] > 0.3 and 0.3 < record.metrics["test_accuracy"] <= 1
    assert (
        study.definition.data_report["read"] == 1798
        and study.definition.data_report["duplicates"] == 1
    )


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_file_deleted_during_streamed_training_fails_the_trial_in_one_line(
    digits_folder, tmp_path, monkeypatch, make_study, workers
):
    """Issue 43, F3: the trial's reason was the DataLoader worker's whole traceback."""
    import shutil

    from autosearch.data.loading import load_named

    folder = tmp_path / "digits"
    shutil.copytree(digits_folder, folder)
    monkeypatch.setenv("AUTOSEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTOSEARCH_DATA_MEMORY", "1K")
    monkeypatch.setenv("AUTOSEARCH_LOADER_WORKERS", workers)
    load_named.cache_clear()
    study = make_study(data=f"folder:{folder}", train=TrainConfig(epochs=1, batch_size=32))
    assert study.data.streamed
    gone = study.data.train.files[0]
    Path(gone).unlink()
    (record,) = study.optimize(n_trials=1)
    assert record.state == "failed"
    assert record.reason == (
        f"DataError: {gone} was removed since the folder was scanned; load the data again"
    )
