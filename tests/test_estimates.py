"""Scoring at the speed of a supernet evaluation: latency from a lookup table, int8
accuracy by fake quantization, and the front measured for real (issue 32)."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import autosearch
from autosearch import Compression, SupernetConfig, TrainConfig
from autosearch.compress import derive
from autosearch.compress._fake_quant import _observer, histogram, quantization_errors
from autosearch.compress._quantize import has_vnni
from autosearch.errors import StudyError
from autosearch.scoring.cost import safetensors_size, saved_bytes
from autosearch.scoring.latency import (
    MAX_UNIT_LEAVES,
    LatencyTable,
    LatencyTableError,
    _leaf_counts,
    _module_key,
    _signature,
    _Tracer,
    parts,
    read,
)
from autosearch.study.overlays import is_estimated
from autosearch.training.train import evaluate, train
from controllers import RandomSearch
from search_spaces import ResNetSpace

TINY = TrainConfig(epochs=2, batch_size=64, lr=0.05)


def _space():
    return ResNetSpace(max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16)).supernet(
        fixed={"stages": 2, "block": "basic"}
    )


# The latency table ------------------------------------------------------------------------
def test_a_prediction_is_the_sum_of_its_parts_and_repeats_from_the_table(tiny_space, tmp_path):
    table = LatencyTable(device="cpu:test", torch=torch.__version__.split("+")[0])
    model = tiny_space.build(tiny_space.default(), input_shape=(1, 8, 8), num_classes=10)
    first = table.predict(model, (1, 8, 8), batch=1)
    found, containers = parts(model, (1, 8, 8))
    assert found and all(p.key in table.entries for p in found)
    expected = containers * table.entries["module_call"] + sum(table.entries[p.key] for p in found)
    assert first == pytest.approx(expected)
    # Built again (other weights, same structure): looked up, not measured again.
    entries = dict(table.entries)
    again = tiny_space.build(tiny_space.default(), input_shape=(1, 8, 8), num_classes=10)
    assert table.predict(again, (1, 8, 8), batch=1) == first and table.entries == entries
    # Batch 32 is predicted per image, from parts of that batch.
    assert table.predict(model, (1, 8, 8), batch=32) > 0
    assert any("float32[32," in key for key in table.entries)


_SAVED = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8]
_SAVED += [torch.uint8, torch.int32, torch.bool]


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=12),
        st.tuples(st.sampled_from(_SAVED), st.lists(st.integers(0, 5), max_size=3)),
        max_size=8,
    )
)
def test_a_state_dicts_saved_size_is_computed_byte_for_byte(drawn):
    """The size is computed from names, dtypes and shapes (nothing written, nothing
    copied off a GPU) and is exactly the length of what safetensors writes."""
    from safetensors.torch import save

    tensors = {name: torch.zeros(shape, dtype=dtype) for name, (dtype, shape) in drawn.items()}
    assert safetensors_size(tensors) == len(save(tensors))


def test_a_models_saved_size_is_what_safetensors_writes(tiny_space):
    from safetensors.torch import save

    model = tiny_space.build(tiny_space.default(), input_shape=(1, 8, 8), num_classes=10)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert saved_bytes(model) == len(save(state)) == saved_bytes(model.to("meta"))


class _EveryOperation(TorchDispatchMode):
    """The tracer's parts found the slow way: every operation through Python, the
    units' own skipped by a flag the module hooks set (what the tracer did before it
    took itself off torch's stack inside units)."""

    def __init__(self, model):
        super().__init__()
        self.keys, self.unit, self.seen = [], None, 0
        self.leaves = _leaf_counts(model)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen += 1
        if self.unit is None:
            self.keys.append(f"{func}|{_signature((args, kwargs or {}))}")
        return func(*args, **(kwargs or {}))

    def before(self, module, inputs):
        if self.unit is None and self.leaves.get(id(module), 1) <= MAX_UNIT_LEAVES:
            self.unit = module

    def after(self, module, inputs, output):
        if self.unit is module:
            self.unit = None
            self.keys.append(_module_key(module, inputs, output))


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), batch=st.sampled_from([1, 3]))
def test_a_trace_finds_the_parts_every_operation_would_and_sees_only_theirs(seed, batch):
    space = ResNetSpace(max_stages=3, depths=(1, 2, 3), widths=(8, 16, 24))
    arch = space.sample(np.random.default_rng(seed))
    model = space.build(arch, input_shape=(1, 8, 8), num_classes=10).eval()
    reference = _EveryOperation(model)
    x = torch.randn(batch, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    pre = torch.nn.modules.module.register_module_forward_pre_hook(reference.before)
    post = torch.nn.modules.module.register_module_forward_hook(reference.after)
    try:
        with torch.no_grad(), reference:
            model(x)
    finally:
        pre.remove()
        post.remove()
    seen = []
    real = _Tracer.__torch_dispatch__

    def counted(self, func, types, args=(), kwargs=None):
        seen.append(func)
        return real(self, func, types, args, kwargs)

    _Tracer.__torch_dispatch__ = counted
    try:
        found, _ = parts(model, (1, 8, 8), batch=batch)
    finally:
        _Tracer.__torch_dispatch__ = real
    assert [p.key for p in found] == reference.keys
    assert len(seen) == sum(p.key.startswith("aten.") for p in found)  # ops outside units
    assert len(seen) < reference.seen  # the units' own operations bypass Python


def test_a_trace_that_fails_inside_a_unit_leaves_torch_as_it_was(tiny_space):
    model = tiny_space.build(tiny_space.default(), input_shape=(1, 8, 8), num_classes=10)
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    handle = conv.register_forward_hook(lambda *_: (_ for _ in ()).throw(RuntimeError("boom")))
    try:
        with pytest.raises(RuntimeError, match="boom"):
            parts(model, (1, 8, 8))
    finally:
        handle.remove()
    assert torch._C._len_torch_dispatch_stack() == 0  # no mode left on torch's stack
    reference = _EveryOperation(model)  # the next trace works, its hooks not doubled
    pre = torch.nn.modules.module.register_module_forward_pre_hook(reference.before)
    post = torch.nn.modules.module.register_module_forward_hook(reference.after)
    x = torch.randn(1, 1, 8, 8)
    try:
        with torch.no_grad(), reference:
            model.eval()(x)
    finally:
        pre.remove()
        post.remove()
    assert [p.key for p in parts(model, (1, 8, 8))[0]] == reference.keys


def test_a_model_elsewhere_is_predicted_where_it_is_as_on_the_cpu(tiny_space):
    """A part's key holds shapes and dtypes, not the device: a model on another device
    (the meta device here, a supernet's subnet on the GPU in a search) is traced where
    it is, with no copy to the CPU, and predicted as its CPU twin is."""
    table = LatencyTable(device="cpu:test", torch=torch.__version__.split("+")[0])
    model = tiny_space.build(tiny_space.default(), input_shape=(1, 8, 8), num_classes=10)
    on_cpu = {batch: table.predict(model, (1, 8, 8), batch=batch) for batch in (1, 32)}
    entries = dict(table.entries)
    elsewhere = model.to("meta")  # a meta tensor cannot be copied back: no copy is made
    for batch, expected in on_cpu.items():
        assert table.predict(elsewhere, (1, 8, 8), batch=batch) == expected
    assert table.entries == entries


def test_predicting_a_model_in_training_mode_changes_nothing_of_it(tiny_space):
    table = LatencyTable(device="cpu:test", torch=torch.__version__.split("+")[0])
    model = tiny_space.build(tiny_space.default(), input_shape=(1, 8, 8), num_classes=10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    table.predict(model, (1, 8, 8), batch=32)  # its parts measured: replayed 11 times
    assert model.training
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # batch norm statistics too


def _saved(tmp_path, tiny_space):
    table = LatencyTable(
        device="cpu:a phone", torch=torch.__version__.split("+")[0], path=tmp_path / "t.json"
    )
    model = tiny_space.build(tiny_space.default(), input_shape=(1, 8, 8), num_classes=10)
    table.predict(model, (1, 8, 8))
    table.save()
    return tmp_path / "t.json", model


def test_a_foreign_table_predicts_what_it_holds_and_names_what_it_lacks(tiny_space, tmp_path):
    path, model = _saved(tmp_path, tiny_space)
    foreign = read(path)
    assert foreign.device == "cpu:a phone" and not foreign.fill
    assert foreign.predict(model, (1, 8, 8)) > 0  # every part is there
    default = tiny_space.default()
    other_width = next(w for w in (4, 8, 16) if w != default["stem.width"])
    wider = tiny_space.make({**default, "stem.width": other_width})
    other = tiny_space.build(wider, input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(LatencyTableError, match=r"lacks \d+ part\(s\).*e\.g\. '") as info:
        foreign.predict(other, (1, 8, 8))
    assert "\n" not in str(info.value) and "latency-table" in str(info.value)
    assert json.loads(path.read_text())["entries"] == foreign.entries  # nothing added


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: {**d, "torch": "1.13.0"}, "measured with torch 1.13.0"),
        (lambda d: {**d, "format": "other/2"}, "is not a latency table of format"),
        (lambda d: {**d, "entries": {"k": -1.0}}, "negative or non-finite"),
        (lambda d: {k: v for k, v in d.items() if k != "device"}, "is damaged"),
        (lambda d: [1, 2], "is not a latency table"),
    ],
)
def test_a_table_of_another_torch_format_or_damaged_is_refused(
    tiny_space, tmp_path, damage, message
):
    path, _ = _saved(tmp_path, tiny_space)
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    with pytest.raises(LatencyTableError, match=message) as info:
        read(path)
    assert "\n" not in str(info.value)


def test_a_truncated_or_missing_table_is_refused_in_one_line(tiny_space, tmp_path):
    path, _ = _saved(tmp_path, tiny_space)
    path.write_text(path.read_text()[:40])
    with pytest.raises(LatencyTableError, match="truncated or not JSON"):
        read(path)
    with pytest.raises(LatencyTableError, match="does not exist"):
        read(tmp_path / "none.json")


# int8 by fake quantization ---------------------------------------------------------------
@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    values=st.lists(st.floats(-1e6, 1e6, width=32), min_size=2, max_size=300),
    edges=st.lists(st.integers(0, 2048), max_size=50),
    scale=st.sampled_from([1e-30, 1e-6, 1.0, 3.0, 1e20]),
)
def test_the_first_histogram_counts_what_histc_counts(values, edges, scale):
    """An observer's first histogram, by bincount, against torch.histc itself: values
    anywhere, on bin edges (the ones histc's division puts on either side), at the top
    edge, repeated."""
    x = torch.tensor(values, dtype=torch.float32) * scale
    low, high = torch.aminmax(x)
    if not low < high:
        assert histogram(x, 2048, low, high) is None  # histc's own rule for an empty range
        return
    on_edges = low + torch.tensor(edges, dtype=torch.float32) * (high - low) / 2048
    x = torch.cat([x, on_edges.clamp(low, high)])
    counts = histogram(x, 2048, low, high)
    assert counts is not None and torch.equal(counts, torch.histc(x, 2048, min=low, max=high))


def test_the_observers_range_search_is_torchaos_step_for_step():
    from torchao.quantization.pt2e.observer import HistogramObserver

    generator = torch.Generator().manual_seed(0)
    for scale in (0.5, 1.0, 4.0):
        theirs = HistogramObserver(dtype=torch.uint8, quant_min=0, quant_max=255, eps=2**-12)
        ours = _observer(False)
        for _ in range(3):
            x = torch.randn(64, 8, 4, 4, generator=generator).relu() * scale
            x[0, 0, 0, 0] = 40 * scale  # an outlier the search clips
            theirs(x)
            ours(x)
        assert [t.tolist() for t in theirs.calculate_qparams()] == [
            t.tolist() for t in ours.calculate_qparams()
        ]


def _observed(kind: int, spread: float, outlier: float, reduce_range: bool, seed: int):
    """An observer of the estimate after one tensor of a kind an activation can be: after
    a ReLU (half the mass in the first bin), two-sided, skewed, nearly constant with a
    few far values."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(4096, generator=generator) * spread
    x = [x.relu(), x + outlier / 10, x.abs() ** 3, torch.where(x.abs() > 2.5 * spread, x, 0)][kind]
    x[0] = outlier * spread  # a far value the search may clip
    observer = _observer(reduce_range)
    observer(x)
    return observer


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    kind=st.integers(0, 3),
    spread=st.sampled_from([1e-4, 0.3, 1.0, 7.0]),
    outlier=st.sampled_from([1.0, 5.0, 60.0]),
    reduce_range=st.booleans(),
    seed=st.integers(0, 1000),
    steps=st.lists(st.tuples(st.integers(0, 2047), st.integers(0, 2047)), min_size=1, max_size=20),
)
def test_the_range_searchs_errors_computed_together_are_torchaos_to_the_bit(
    kind, spread, outlier, reduce_range, seed, steps
):
    """Many steps' quantization errors in one batch: each the float torchao's
    ``_compute_quantization_error`` returns for that step alone (empty destination bins
    included), and the whole search ends where torchao's own search ends."""
    from torchao.quantization.pt2e.observer import HistogramObserver

    observer = _observed(kind, spread, outlier, reduce_range, seed)
    steps = [(min(a, b), max(a, b)) for a, b in steps] + [(9, 9), (0, 2047)]
    assert quantization_errors(observer, steps) == [
        observer._compute_quantization_error(start, end) for start, end in steps
    ]
    theirs = HistogramObserver._non_linear_param_search(observer)  # torchao's, not ours
    assert [t.tolist() for t in observer._non_linear_param_search()] == [t.tolist() for t in theirs]


@pytest.mark.slow
def test_the_int8_estimate_agrees_with_the_lowered_program(tiny_space, digits):
    """Fake quantization against the real oneDNN int8 program, on trained tiny nets:
    its logits are closer to the program's than the float network's are, and the median
    difference in validation accuracy is within one image of the 360 (0.28 points; the
    target on real images is 0.3). Where the CPU has no VNNI (activations of 7 bits),
    measured on an AVX2-only EPYC: the logits of one net in four were as far as the
    float network's (mean difference 0.080 against 0.077; the others 0.096 / 0.140,
    0.072 / 0.133, 0.058 / 0.106, one thread) and the accuracies 3, 1, 1 and 4 images
    off (the float network's 2, 2, 1 and 2): there three of four nets must be closer, all
    of them together, and the median within two images."""
    rng = np.random.default_rng(0)
    config = TrainConfig(epochs=8, batch_size=64, lr=0.05)
    differences, closer = [], []
    images = digits.normalize(digits.val.take(torch.arange(len(digits.val)))).float()
    for i in range(4):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(i)  # the same networks whatever ran before
            model = tiny_space.build(tiny_space.sample(rng), input_shape=(1, 8, 8), num_classes=10)
        train(model, digits, config, seed=i)
        real = derive("int8", model, digits, config, seed=0)
        estimate = derive("int8", model, digits, config, seed=0, estimate=True)
        assert estimate.estimated and not real.estimated
        with torch.no_grad():
            program, simulated, floats = real.model(images), estimate.model(images), model(images)
        closer.append(
            ((simulated - program).abs().mean().item(), (floats - program).abs().mean().item())
        )
        accuracy = [evaluate(m, digits.val, digits)[0] for m in (estimate.model, real.model)]
        differences.append(round(abs(accuracy[0] - accuracy[1]) * len(digits.val)))  # images
        assert estimate.saved_bytes == pytest.approx(real.saved_bytes, rel=0.3)
    assert sum(ours < theirs for ours, theirs in closer) >= (4 if has_vnni() else 3), closer
    assert sum(ours for ours, _ in closer) < sum(theirs for _, theirs in closer), closer
    assert float(np.median(differences)) <= (1 if has_vnni() else 2), differences


# The study ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    root = tmp_path_factory.mktemp("estimates")
    study = autosearch.create_study(
        "est",
        controller=RandomSearch(_space(), seed=0),
        storage=f"sqlite:///{root}/est.db",
        train=TINY,
        supernet=SupernetConfig(sandwich=1),
        variants=("base", "int8"),
    )
    study.supernet.train()
    done = study.optimize(8)
    return {"root": root, "study": study, "done": done}


@pytest.mark.slow
def test_trials_are_scored_on_estimates_and_the_front_on_measurements(searched):
    study = searched["study"]
    records = study.records()
    assert len(records) == 16 and all(r.state == "complete" for r in records)
    front = {(r.trial, r.variant) for r in study.pareto()}
    estimated = 0
    for r in records:
        on_front = (r.trial, r.variant) in front
        if on_front:  # measured for real: int8 lowered, latency timed
            assert r.metrics["measured"] == 1 and not is_estimated(r), r
            assert r.metrics["latency"] > 0
            estimate = "accuracy_estimate" if r.variant == "int8" else "latency_estimate"
            assert estimate in r.metrics, r
        elif is_estimated(r):  # scored on estimates (a point measured may leave the front)
            estimated += 1
            if r.variant == "int8":
                assert r.metrics["estimated"] == 1 and "latency" not in r.metrics
            else:
                assert r.metrics["latency_predicted"] == 1 and r.metrics["latency"] > 0
    assert estimated >= len(records) // 2  # only the front and what it displaced measured
    # The trial's stored result keeps its estimates: measurements are laid over them.
    trial = next(iter(front))[0]
    stored = study.trials.get(trial).user_attrs["result"]
    assert any(
        p["metrics"].get("estimated") or p["metrics"].get("latency_predicted")
        for p in stored["points"]
    )
    # optimize() returned the base records as measured.
    returned = {r.trial: r for r in searched["done"]}
    for trial, variant in front:
        if variant == "base":
            assert returned[trial] == study.record(trial) and returned[trial].metrics["measured"]


@pytest.mark.slow
def test_best_and_export_use_measured_figures(searched, tmp_path):
    study = searched["study"]
    best = study.best(variant="int8")
    assert best.metrics.get("measured") == 1 and not best.metrics.get("estimated")
    off_front = [r for r in study.records() if r.metrics.get("estimated")]
    assert off_front, "every int8 point was on the front: the search is too small"
    reader = autosearch.load_study("est", storage=study.storage_url, read_only=True)
    out = reader.export(off_front[0], tmp_path / "export")  # read-only: measured, not stored
    card = json.loads((out / "arch.json").read_text())
    assert card["metrics"]["measured"] == 1 and card["metrics"]["latency"] > 0
    assert study.record(off_front[0].trial, "int8").metrics.get("estimated") == 1


@pytest.mark.slow
def test_status_says_which_figures_are_estimates(searched):
    from autosearch.cli._common import table

    text = table(searched["study"].records())
    assert "figures" in text.splitlines()[0]
    assert "accuracy estimated (fake quantization)" in text and "measured" in text


@pytest.mark.slow
def test_a_study_resumed_on_another_machine_does_not_mix_latency_tables(searched, monkeypatch):
    import autosearch.scoring.latency as latency

    study = searched["study"]
    before = len(study.trials.all())
    monkeypatch.setattr(latency, "host_device", lambda: "cpu:another machine")
    latency._OPEN.clear()
    again = autosearch.load_study("est", storage=study.storage_url)
    with pytest.raises(
        StudyError,
        match="predicts latency with the table of cpu:.* this worker's is cpu:another machine",
    ) as info:
        again.optimize(1)
    assert "\n" not in str(info.value)
    assert len(again.trials.all()) == before  # nothing stored
    latency._OPEN.clear()


def test_a_table_is_measured_for_a_study_whose_controller_is_named(tmp_path, monkeypatch, capsys):
    """Issue 43, L25: `latency-table` on a study file whose controller is given by name
    (with its space) ended in an AttributeError."""
    from autosearch.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "named.py").write_text(
        "from autosearch import StudySpec\n"
        "from search_spaces import ResNetSpace\n"
        "study = StudySpec(name='named', controller='random',\n"
        "                  space=ResNetSpace(max_stages=2, depths=(1,), widths=(8,)))\n"
    )
    assert main(["latency-table", "named.py", "--out", "t.json", "--samples", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["architectures"] == 1 and summary["entries"] == len(read("t.json").entries)


@pytest.mark.slow
def test_a_table_measured_on_the_device_serves_a_study_of_that_device(tmp_path):
    study_file = tmp_path / "tiny.py"
    study_file.write_text(
        "from autosearch import StudySpec, TrainConfig\n"
        "from controllers import RandomSearch\n"
        "from search_spaces import ResNetSpace\n"
        "space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16))\n"
        "study = StudySpec(name='tiny', controller=RandomSearch(space, seed=0), data='digits',\n"
        "                  train=TrainConfig(epochs=1, batch_size=64))\n"
    )
    out = tmp_path / "device.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "autosearch.cli",
            "latency-table",
            str(study_file),
            "--out",
            str(out),
            "--samples",
            "3",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["entries"] == len(read(out).entries) > 0
    space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16))
    study = autosearch.create_study(
        "device",
        controller=RandomSearch(space, seed=0),
        storage=f"sqlite:///{tmp_path}/d.db",
        train=TrainConfig(epochs=1, batch_size=64),
        compression=Compression(latency=str(out)),
    )
    study.optimize(3)
    records = study.records()
    # Predicted from the device's table, or failed naming the part it lacks.
    for r in records:
        assert r.state == "complete" or "lacks" in r.reason, r.reason
    assert any(r.state == "complete" for r in records)


def test_a_study_for_a_table_that_cannot_be_read_is_refused_before_anything_is_stored(tmp_path):
    space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(8, 16), stem_widths=(8, 16))
    for bad, message in (
        (tmp_path / "none.json", "does not exist"),
        ("", "latency=.. cannot be used"),
    ):
        with pytest.raises(autosearch.AutosearchError, match=message) as info:
            autosearch.create_study(
                "bad",
                controller=RandomSearch(space, seed=0),
                storage=f"sqlite:///{tmp_path}/bad.db",
                compression=Compression(latency=str(bad)),
            )
        assert "\n" not in str(info.value)
    if (tmp_path / "bad.db").exists():  # nothing stored
        import optuna

        assert not optuna.get_all_study_names(f"sqlite:///{tmp_path}/bad.db")


@pytest.mark.slow
def test_a_point_that_cannot_be_measured_says_so_and_is_not_tried_again(searched, monkeypatch):
    from autosearch.errors import ExportError
    from autosearch.study.overlays import figures

    study = searched["study"]
    point = next(r for r in study.records() if is_estimated(r))
    tried = []

    def fails(record):
        tried.append(record.trial)
        raise ExportError("its weights are gone")

    monkeypatch.setattr(type(study._measurer), "_measured", lambda self, record: fails(record))
    study._measurer.measure([point])
    again = study.record(point.trial, point.variant)
    assert again.metrics["measure_failed"] == 1 and not is_estimated(again)
    assert figures(again).endswith("its measurement failed")
    assert again.metrics["accuracy"] == point.metrics["accuracy"]  # the estimates stay
    study._measurer.measured(again, store=True)  # not tried again
    assert tried == [point.trial]


@pytest.mark.slow
def test_figures_gone_or_damaged_after_their_job_are_measured_again(searched, capsys):
    """A Done measuring job was taken as proof that the point's figures were stored: once
    they were gone (the row deleted) or damaged, measure_front(), status and run showed
    the estimates for ever. A job is done only while its figures are readable."""
    import sqlite3

    from autosearch.cli import main
    from autosearch.study.overlays import PREFIX

    study = searched["study"]
    point = next(r for r in study.pareto(measured=True) if r.metrics.get("measured") == 1)
    key = f"{PREFIX}{point.trial}:{point.variant}"
    db = searched["root"] / "est.db"
    for damage in ("delete", "{}", "[1, 2]", "delete"):
        if damage == "delete":
            with sqlite3.connect(db) as sql:
                gone = sql.execute("DELETE FROM study_user_attributes WHERE key = ?", (key,))
                assert gone.rowcount == 1
        else:
            study._storage.set_study_user_attr(study._study_id, key, damage)
        assert is_estimated(study.record(point.trial, point.variant))
        again = autosearch.load_study("est", storage=study.storage_url)
        again.pareto(measured=True)
        measured = again.record(point.trial, point.variant)
        assert measured.metrics["measured"] == 1 and not is_estimated(measured), damage
        assert measured.metrics["accuracy"] == point.metrics["accuracy"]
    jobs = again._measurer.jobs.names(finished=True)
    assert len([n for n in jobs if n.startswith(f"measure:{point.trial}:{point.variant}:")]) >= 4
    with sqlite3.connect(db) as sql:  # gone once more: status says the front is estimated
        sql.execute("DELETE FROM study_user_attributes WHERE key = ?", (key,))
    capsys.readouterr()
    assert main(["status", "--study", "est", "--storage", study.storage_url]) == 0
    assert "1 point(s) of the front show estimates, not measurements" in capsys.readouterr().out
    again.pareto(measured=True)
    assert not is_estimated(again.record(point.trial, point.variant))


# Overlays are data (issue 43: M6-M10) ------------------------------------------------------
TAMPERED = [
    {"accuracy": 1e308, "measured": 1.0},
    {"accuracy": float("nan"), "measured": 1.0},
    {"accuracy": -0.5, "latency": -3.0, "measured": 1.0},
    {"latency": 1e308, "measured": 1.0},
    {"flops": 1.0, "measured": 1.0},
    {"accuracy": "high"},
    [1, 2],
]


@pytest.mark.slow
@pytest.mark.parametrize("tampered", TAMPERED)
def test_a_tampered_overlay_is_left_out_and_the_point_measured_for_real(
    searched, tampered, tmp_path
):
    """M6-M8: NaN, negative or 1e308 figures were shown, and best(variant='int8')
    exported the trial they were tampered onto, with 1e308 in its arch.json."""
    from autosearch.study.overlays import PREFIX

    study = searched["study"]
    point = next(r for r in study.records() if r.variant == "int8" and is_estimated(r))
    key = f"{PREFIX}{point.trial}:int8"
    study._storage.set_study_user_attr(study._study_id, key, json.dumps(tampered))
    read_back = study.record(point.trial, "int8")
    assert is_estimated(read_back) and read_back.metrics == point.metrics  # left out
    best = study.best(variant="int8")  # measures what it picks: nothing tampered wins
    assert 0 <= best.metrics["accuracy"] <= 1 and not is_estimated(best)
    metrics = [best.metrics]
    if tampered == TAMPERED[0]:  # the export writes the record's figures: once is enough
        out = study.export(best, tmp_path / "best")
        metrics.append(json.loads((out / "arch.json").read_text())["metrics"])
        assert all(metrics[1][k] == v for k, v in best.metrics.items())
    assert all(
        math.isfinite(v) and (k not in ("accuracy", "test_accuracy") or 0 <= v <= 1)
        for figures in metrics
        for k, v in figures.items()
        if isinstance(v, float)
    )
    study._storage.set_study_user_attr(study._study_id, key, json.dumps({}))  # as it was: none


def test_an_overlay_lays_only_what_was_estimated():
    """M9: an overlay on a point that had no estimate rewrote its FLOPs to 1."""
    from autosearch.architecture import Architecture
    from autosearch.study.overlays import overlay, parse_overlay
    from autosearch.study.records import Record

    arch = Architecture(space="s")
    measured = Record(
        trial=0,
        arch=arch,
        description="",
        state="complete",
        metrics={"accuracy": 0.9, "flops": 2e6, "latency": 0.3, "measured": 1.0},
    )
    with pytest.raises(ValueError, match="'flops' is not a figure a measurement writes"):
        parse_overlay(json.dumps({"flops": 1.0}))
    assert overlay(measured, {"accuracy": 0.1, "latency": 9.0, "measured": 1.0}) == measured
    predicted = Record(
        trial=0,
        arch=arch,
        description="",
        state="complete",
        metrics={"accuracy": 0.9, "flops": 2e6, "latency": 0.3, "latency_predicted": 1.0},
    )
    laid = overlay(predicted, {"accuracy": 0.1, "latency": 0.4, "measured": 1.0})
    assert laid.metrics["accuracy"] == 0.9  # not estimated here: not laid
    assert laid.metrics["latency"] == 0.4 and laid.metrics["latency_estimate"] == 0.3


FIGURES = st.one_of(
    st.floats(), st.integers(-(10**30), 10**30), st.booleans(), st.none(), st.text(max_size=4)
)
NAMES = st.sampled_from(
    [
        "accuracy",
        "test_accuracy",
        "latency",
        "latency_batched",
        "bytes",
        "bops",
        "reward",
        "measured",
        "measure_failed",
        "flops",
        "params",
        "estimated",
        "x",
    ]
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    stored=st.dictionaries(NAMES, FIGURES, max_size=6),
    flags=st.sets(st.sampled_from(["estimated", "latency_predicted", "measured"]), max_size=2),
)
def test_whatever_an_overlay_holds_it_is_checked_like_a_result(stored, flags):
    from autosearch.architecture import Architecture
    from autosearch.scoring.metrics import METRICS
    from autosearch.study.overlays import overlay, parse_overlay
    from autosearch.study.records import Record

    try:
        parsed = parse_overlay(json.dumps(stored))
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    for name, value in parsed.items():
        assert math.isfinite(value)
        if name in METRICS:
            low, high = METRICS[name].bounds
            assert low <= value <= high
    base = {"accuracy": 0.5, "flops": 1e6, "params": 1e3, **{f: 1.0 for f in flags}}
    record = Record(
        trial=0,
        arch=Architecture(space="s"),
        description="",
        state="complete",
        metrics=base,
    )
    laid = overlay(record, parsed).metrics
    assert laid["flops"] == 1e6 and laid["params"] == 1e3  # never overlaid
    if not {"estimated", "latency_predicted"} & flags:
        assert laid == base


def _beside_a_measurer(study, point, calls, measure_here) -> None:
    """``study``'s measurer measures ``point`` in a thread; once it holds the point's job
    (its ``_measured`` called: ``calls`` not empty, waited on boundedly),
    ``measure_here()`` runs in this thread, then the first is joined."""
    import threading

    first = threading.Thread(target=study._measurer.measure, args=([point],))
    first.start()
    for _ in range(6000):
        if calls:
            break
        time.sleep(0.01)
    measure_here()
    first.join(timeout=120)


@pytest.mark.slow
def test_two_measurers_of_one_front_measure_each_point_once(searched, monkeypatch):
    """M10: two measure_front() at once measured every point twice, the last write
    winning. Now each point is a job: one measures, the other waits for its figures."""
    import threading

    import autosearch.study.measure as measure

    study = searched["study"]
    point = next(r for r in study.records() if r.variant == "int8" and is_estimated(r))
    other = autosearch.load_study("est", storage=study.storage_url)
    waiting, calls = threading.Event(), []

    def measured(self, record):
        calls.append(record.trial)
        waiting.wait(timeout=60)  # until the other measurer waits on this one (bounded)
        return {"accuracy": 0.5, "test_accuracy": 0.5, "measured": 1.0, "reward": 0.5}

    def pause(held):
        waiting.set()
        time.sleep(0.05)

    monkeypatch.setattr(type(study._measurer), "_measured", measured)
    monkeypatch.setattr(measure, "_pause", pause)
    _beside_a_measurer(study, point, calls, lambda: other._measurer.measure([point]))
    assert calls == [point.trial]
    assert study.record(point.trial, "int8").metrics["accuracy"] == 0.5


@pytest.mark.slow
def test_a_point_another_measurer_holds_is_left_for_after_the_free_ones(searched, monkeypatch):
    """Two workers of a pool reach the front together: the second took the next point
    only once the first had measured the one it held, so one worker measured the whole
    front while the other waited (a sixth of the guide example's time). Now
    it measures the free points first and waits for the held one after."""
    import threading

    import autosearch.study.measure as measure

    study = searched["study"]
    # two points of predicted latency, the last: other tests take the first int8 ones
    held, free = [r for r in study.records() if r.variant == "base" and is_estimated(r)][-2:]
    other = autosearch.load_study("est", storage=study.storage_url)
    release, calls, pauses = threading.Event(), [], []

    def measured(self, record):
        calls.append(record.trial)
        if record.trial == held.trial:
            release.wait(timeout=60)  # held until the other measurer moves on (bounded)
        else:
            release.set()
        return {"latency": 1.0, "latency_batched": 0.5, "measured": 1.0, "reward": 0.5}

    def pause(waiting_on):
        pauses.append(list(calls))  # what was measured when the other first waited
        release.set()
        time.sleep(0.05)

    monkeypatch.setattr(type(study._measurer), "_measured", measured)
    monkeypatch.setattr(measure, "_pause", pause)
    _beside_a_measurer(study, held, calls, lambda: other._measurer.measure([held, free]))
    assert sorted(calls) == sorted([held.trial, free.trial]) and calls[0] == held.trial
    assert all(free.trial in seen for seen in pauses), pauses  # no wait before the free one
    for point in (held, free):
        assert study.record(point.trial, "base").metrics["latency"] == 1.0


@pytest.fixture(scope="module")
def three_measurers(tmp_path_factory):
    """Three handles of one study, as three workers hold it (no trial run)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('measurers')}/m.db"
    space = ResNetSpace(max_stages=1, depths=(1,), widths=(8,))
    first = autosearch.create_study("m", controller=RandomSearch(space, seed=0), storage=url)
    return [first, *(autosearch.load_study("m", storage=url) for _ in range(2))]


_POINTS = iter(range(10_000, 10**9, 10))  # each example's points are new to the study


@pytest.mark.slow
@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(
    asked=st.lists(
        st.lists(st.integers(0, 5), min_size=1, max_size=6, unique=True), min_size=2, max_size=3
    ),
    seconds=st.lists(st.sampled_from([0.0, 0.005, 0.03]), min_size=6, max_size=6),
)
def test_measurers_at_once_measure_each_point_asked_for_once(three_measurers, asked, seconds):
    """Whatever points each worker asks for, in whatever order, however long each takes:
    every point asked for is measured exactly once, and its figures are stored."""
    import threading
    from collections import Counter
    from unittest import mock

    import autosearch.study.measure as measure
    from autosearch.architecture import Architecture
    from autosearch.study.overlays import PREFIX
    from autosearch.study.records import Record

    base, calls, lock = next(_POINTS), Counter(), threading.Lock()

    def point(i: int) -> Record:
        return Record(
            trial=base + i, arch=Architecture(space="s"), description="", state="complete"
        )

    def measured(self, record):
        with lock:
            calls[record.trial] += 1
        time.sleep(seconds[record.trial - base])
        return {"latency": 1.0, "measured": 1.0, "reward": 0.5}

    workers = [
        threading.Thread(target=study._measurer.measure, args=([point(i) for i in indices],))
        for study, indices in zip(three_measurers, asked, strict=False)
    ]
    with (
        mock.patch.object(measure.FrontMeasurer, "_measured", measured),
        mock.patch.object(measure, "_pause", lambda held: time.sleep(0.01)),
    ):
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=300)
    assert not any(worker.is_alive() for worker in workers)
    wanted = {base + i for indices in asked for i in indices}
    assert calls == Counter(wanted), (asked, calls)
    stored = three_measurers[0].optuna_study.user_attrs
    for trial in wanted:
        assert json.loads(stored[f"{PREFIX}{trial}:base"])["measured"] == 1


@pytest.mark.slow
def test_where_int8_cannot_be_lowered_one_line_says_why_and_the_estimate_stays(
    searched, monkeypatch, caplog
):
    """Issue 45, 6: on the GPU machines' torch 2.11 the lowering finds no quantized
    kernels, and measuring the front logged "measured trial 58 int8: " with nothing
    after it. Now one line names the torch version and the floor, and the point keeps
    its estimate, marked as one."""
    import logging

    from autosearch.study.overlays import PREFIX, figures

    study = searched["study"]
    point = next(r for r in study.records() if r.variant == "int8" and is_estimated(r))
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu128")
    with caplog.at_level(logging.WARNING):
        study._measurer.measure([point])
    said = [m for m in caplog.messages if f"trial {point.trial} (int8)" in m]
    assert len(said) == 1 and "torch >= 2.13" in said[0] and "torch 2.11.0" in said[0], said
    again = study.record(point.trial, "int8")
    assert again.metrics["accuracy"] == point.metrics["accuracy"]  # the estimate stays
    assert figures(again).startswith("accuracy estimated (fake quantization)")
    key = f"{PREFIX}{point.trial}:int8"
    study._storage.set_study_user_attr(study._study_id, key, json.dumps({}))  # as it was


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    values=st.lists(st.floats(-1e4, 1e4, width=32), min_size=1, max_size=64),
    scale=st.floats(2**-13, 10.0, width=32),
    reduce_range=st.booleans(),
    zero=st.integers(0, 255),
)
def test_the_estimates_rounding_is_the_fake_quantization_kernels(values, scale, reduce_range, zero):
    """The estimate rounds activations with five in-place passes instead of the fused op
    (about fifteen times faster on a CPU): the same values, bit for bit."""
    from autosearch.compress._fake_quant import fake_quantize

    quant_max = 127 if reduce_range else 255
    zero = min(zero, quant_max)
    x = torch.tensor(values, dtype=torch.float32)
    expected = torch.fake_quantize_per_tensor_affine(x, scale, zero, 0, quant_max)
    assert torch.equal(fake_quantize(x, scale, zero, quant_max), expected)


class _HalveInPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(0.5)


class _Reused(torch.nn.Module):
    """A network that hands one tensor to two blocks, changes tensors in place after
    a hook saw them (inside a block and between blocks), and calls each block twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.block = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 1), torch.nn.ReLU())
        # changes its input in place before its convolution reads it
        self.other = torch.nn.Sequential(_HalveInPlace(), torch.nn.Conv2d(4, 4, 3, padding=1))
        self.head = torch.nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x).relu_()
        y = self.block(x) + self.other(x)
        x.mul_(0.5)  # in place: not the tensor the hooks saw
        z = self.block(x) + self.other(y)  # each called again, on another tensor
        return self.head(z.mean((2, 3)))


def _subnet_space(name: str):
    """A space of each kind, its networks small (a few hundred thousand weights at most:
    the spaces' defaults reach tens of millions, seconds an estimate on digits)."""
    from search_spaces import DenseNetSpace, MobileNetSpace, NB201Space

    return {
        "resnet": lambda: ResNetSpace(max_stages=3, blocks=("basic",), widths=(8, 16, 32)),
        "bottleneck": lambda: ResNetSpace(max_stages=2, blocks=("bottleneck",), widths=(8, 16)),
        "mobilenet": lambda: MobileNetSpace(
            max_stages=3, widths=(16, 24, 32), head_widths=(640,), width_mults=(0.5, 1.0)
        ),
        "densenet": lambda: DenseNetSpace(max_blocks=3, layers=(2, 4, 6), growths=(12, 16)),
        "nb201": lambda: NB201Space(channels=4, cells=1),
    }[name]()


def _estimate_alone_at_every_hook(model, data, monkeypatch):
    """The estimate with every hook observing and rounding on its own (nothing shared)."""
    from autosearch.compress import _fake_quant

    with monkeypatch.context() as patched:
        patched.setattr(_fake_quant._Seen, "get", lambda self, x: None)
        return _fake_quant.estimate_int8(model, data, Compression(), seed=0).model


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(
    space=st.sampled_from(["resnet", "bottleneck", "mobilenet", "densenet", "nb201"]),
    draw=st.integers(0, 2**16),
)
def test_the_estimate_observes_and_rounds_a_shared_tensor_once_with_the_same_result(
    space, draw, digits
):
    """A block's input is its first layer's and its shortcut's too: observed once,
    rounded once. The estimate's outputs are those of every hook on its own, bit for
    bit, on subnets of every space."""
    from autosearch.compress._fake_quant import estimate_int8

    chosen = _subnet_space(space)
    torch.manual_seed(draw)
    arch = chosen.sample(np.random.default_rng(draw))
    model = chosen.build(arch, input_shape=digits.input_shape, num_classes=10).eval()
    x = digits.normalize(digits.val.x[:64])
    with pytest.MonkeyPatch.context() as monkeypatch:
        alone = _estimate_alone_at_every_hook(model, digits, monkeypatch)
    shared = estimate_int8(model, digits, Compression(), seed=0).model
    with torch.no_grad():
        assert torch.equal(shared(x), alone(x))


def test_a_layer_called_twice_or_an_input_changed_in_place_is_estimated_as_alone(
    digits, monkeypatch
):
    from autosearch.compress._fake_quant import estimate_int8

    torch.manual_seed(0)
    model = _Reused().eval()
    x = digits.normalize(digits.val.x[:64])
    alone = _estimate_alone_at_every_hook(model, digits, monkeypatch)
    shared = estimate_int8(model, digits, Compression(), seed=0).model
    with torch.no_grad():
        assert torch.equal(shared(x), alone(x))


class _Tied(torch.nn.Module):
    """One block in two places, one weight in two layers, a buffer and a plain list."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.block = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 1), torch.nn.BatchNorm2d(4))
        self.again = self.block
        self.twin = torch.nn.Conv2d(4, 4, 1)
        self.twin.weight = self.block[0].weight
        self.head = torch.nn.Linear(4, 10)
        self.register_buffer("offset", torch.ones(1))
        self.names = ["stem", "block"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.again(self.block(self.stem(x)).relu()) + self.twin(x.new_zeros(1, 4, 1, 1))
        return self.head(x.mean((2, 3))) + self.offset


def _same_copy(original, ours, theirs) -> None:
    """``ours`` is what ``copy.deepcopy`` made (``theirs``): the same modules, classes,
    attributes, tensors and sharing, and nothing shared with ``original``."""
    assert [(n, type(m)) for n, m in ours.named_modules(remove_duplicate=False)] == [
        (n, type(m)) for n, m in theirs.named_modules(remove_duplicate=False)
    ]
    ids = lambda model: {id(t) for t in [*model.parameters(), *model.buffers()]}  # noqa: E731
    assert not ids(ours) & ids(original)
    assert len(ids(ours)) == len(ids(theirs))  # tied tensors stay tied, no more, no fewer
    assert len({id(m) for m in ours.modules()}) == len({id(m) for m in theirs.modules()})
    ours_state, theirs_state = ours.state_dict(keep_vars=True), theirs.state_dict(keep_vars=True)
    assert ours_state.keys() == theirs_state.keys()
    for key, value in ours_state.items():
        assert type(value) is type(theirs_state[key]) and torch.equal(value, theirs_state[key])
        assert value.requires_grad == theirs_state[key].requires_grad
        assert value.data_ptr() != original.state_dict(keep_vars=True)[key].data_ptr()
    for (name, mine), (_, its) in zip(ours.named_modules(), theirs.named_modules(), strict=True):
        plain = lambda m: {  # noqa: E731
            k: v for k, v in vars(m).items() if k not in ("_parameters", "_buffers", "_modules")
        }
        assert plain(mine) == plain(its), name


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(
    space=st.sampled_from(["resnet", "bottleneck", "mobilenet", "densenet", "nb201"]),
    draw=st.integers(0, 2**16),
)
def test_the_estimates_copy_of_a_network_is_deepcopys(space, draw, digits):
    """The estimate copies its parent directly (each module a new object with its own
    tensors and containers) rather than through ``copy.deepcopy``: the same copy, on
    subnets of every space."""
    from autosearch.compress import _fake_quant

    chosen = _subnet_space(space)
    torch.manual_seed(draw)
    model = chosen.build(
        chosen.sample(np.random.default_rng(draw)), input_shape=digits.input_shape, num_classes=10
    )
    _same_copy(model, _fake_quant._copy(model), copy.deepcopy(model))


def test_the_estimate_on_its_copy_is_the_estimate_on_deepcopys_and_leaves_the_parent(digits):
    from autosearch.compress import _fake_quant

    space = _subnet_space("resnet")
    torch.manual_seed(0)
    model = space.build(
        space.sample(np.random.default_rng(0)), input_shape=digits.input_shape, num_classes=10
    ).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = digits.normalize(digits.val.x[:64])
    ours = _fake_quant.estimate_int8(model, digits, Compression(), seed=0)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(_fake_quant, "_copy", copy.deepcopy)
        theirs = _fake_quant.estimate_int8(model, digits, Compression(), seed=0)
    with torch.no_grad():
        assert torch.equal(ours.model(x), theirs.model(x))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_a_copy_keeps_shared_modules_and_tied_weights_shared_and_changes_nothing_of_the_original():
    from autosearch.compress._fake_quant import _copy

    torch.manual_seed(0)
    model = _Tied()
    ours = _copy(model)
    _same_copy(model, ours, copy.deepcopy(model))
    assert ours.again is ours.block and ours.twin.weight is ours.block[0].weight
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        expected = model(x)
        ours.eval()
        ours.register_forward_pre_hook(lambda m, inputs: (inputs[0] * 2,))
        ours.block[0].weight.mul_(3)
        ours.names.append("head")
        ours(x)
        assert model.training and not model._forward_pre_hooks
        assert model.names == ["stem", "block"]
        assert torch.equal(model(x), expected)  # its weights and batch-norm statistics as they were
