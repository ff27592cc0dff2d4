"""Scoring at the speed of a supernet evaluation: latency from a lookup table, int8
accuracy by fake quantization, and the front measured for real (issue 32)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import autosearch
from autosearch import Compression, SupernetConfig, TrainConfig
from autosearch.compress import derive
from autosearch.compress._fake_quant import _observer
from autosearch.errors import StudyError
from autosearch.latency import LatencyTable, LatencyTableError, parts, read
from autosearch.study.overlays import is_estimated
from autosearch.train import evaluate, train
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


@pytest.mark.slow
def test_the_int8_estimate_agrees_with_the_lowered_program(tiny_space, digits):
    """Fake quantization against the real oneDNN int8 program, on trained tiny nets:
    its logits are closer to the program's than the float network's are, and the median
    difference in validation accuracy is within the stated 0.3 points."""
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
        closer.append((simulated - program).abs().mean() < (floats - program).abs().mean())
        accuracy = [evaluate(m, digits.val, digits)[0] for m in (estimate.model, real.model)]
        differences.append(abs(accuracy[0] - accuracy[1]) * 100)
        assert estimate.saved_bytes == pytest.approx(real.saved_bytes, rel=0.3)
    assert all(closer)
    assert float(np.median(differences)) <= 0.3, differences


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
    study.train_supernet()
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
    stored = study.optuna_trial(trial).user_attrs["result"]
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
    from autosearch.cli.reading import table

    text = table(searched["study"].records())
    assert "figures" in text.splitlines()[0]
    assert "accuracy estimated (fake quantization)" in text and "measured" in text


@pytest.mark.slow
def test_a_study_resumed_on_another_machine_does_not_mix_latency_tables(searched, monkeypatch):
    import autosearch.latency as latency

    study = searched["study"]
    before = len(study.optuna_trials())
    monkeypatch.setattr(latency, "host_device", lambda: "cpu:another machine")
    latency._OPEN.clear()
    again = autosearch.load_study("est", storage=study.storage_url)
    with pytest.raises(
        StudyError,
        match="predicts latency with the table of cpu:.* this worker's is cpu:another machine",
    ) as info:
        again.optimize(1)
    assert "\n" not in str(info.value)
    assert len(again.optuna_trials()) == before  # nothing stored
    latency._OPEN.clear()


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
    for bad, message in ((tmp_path / "none.json", "does not exist"), ("", "Compression latency=.. cannot be used")):
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

    monkeypatch.setattr(type(study.measurer), "_measured", lambda self, record: fails(record))
    study.measurer.measure([point])
    again = study.record(point.trial, point.variant)
    assert again.metrics["measure_failed"] == 1 and not is_estimated(again)
    assert figures(again).endswith("its measurement failed")
    assert again.metrics["accuracy"] == point.metrics["accuracy"]  # the estimates stay
    study.measurer.measured(again, store=True)  # not tried again
    assert tried == [point.trial]
