"""Tabular evaluation: NB201 studies answered from a benchmark table made here."""

from __future__ import annotations

import csv
import itertools
import json

import numpy as np
import pytest

import autosearch
from autosearch import ConfigError, DataError, ExportError, StudyError, Table
from autosearch.cli import main
from controllers import NSGA2, RandomSearch
from search_spaces import NB201Space, ResNetSpace
from search_spaces.nb201 import OPERATIONS


def _score(space: NB201Space, text: str) -> float:
    """A made-up but structured accuracy (percent): 3×3 convs help, 'none' hurts."""
    arch = space.from_string(text)
    ops = list(arch.values())
    return (
        60 + 5 * ops.count("nor_conv_3x3") + 2 * ops.count("nor_conv_1x1") - 3 * ops.count("none")
    )


@pytest.fixture
def nb201_table(tmp_path):
    space = NB201Space()
    path = tmp_path / "nb201.csv"
    rows = []
    # Every architecture except those with 'none' on the 0→1 edge: four in five are found.
    for ops in itertools.product(OPERATIONS, repeat=6):
        if ops[0] == "none":
            continue
        genes = dict(zip(space.domains(), ops, strict=True))
        text = space.to_string(space.make(genes))
        acc = _score(space, text)
        rows.append(
            {
                "arch": text,
                "val_accuracy": acc,
                "test_accuracy": acc - 1,
                "train_time": 100 + 10 * ops.count("nor_conv_3x3"),
            }
        )
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path, {r["arch"]: r for r in rows}


def test_a_tabular_study_looks_results_up_instead_of_training(nb201_table, tmp_path, monkeypatch):
    from autosearch.evaluation import runner

    path, rows = nb201_table
    monkeypatch.setattr(runner, "train_candidate", lambda *a, **k: pytest.fail("trained"))
    space = NB201Space()
    study = autosearch.create_study(
        "tab",
        controller=RandomSearch(space, seed=0),
        table=Table(path=str(path)),
        objectives=("accuracy", "train_seconds"),
        storage=f"sqlite:///{tmp_path}/tab.db",
    )
    records = study.optimize(30)
    found = [r for r in records if r.state == "complete"]
    missing = [r for r in records if r.state == "failed"]
    assert found and missing  # the table leaves a few architectures out
    for r in found:
        row = rows[space.to_string(r.arch)]
        assert r.accuracy == pytest.approx(row["val_accuracy"] / 100)  # percent detected
        assert r.test_accuracy == pytest.approx(row["test_accuracy"] / 100)
        assert r.metrics["train_seconds"] == row["train_time"]
        assert r.metrics["params"] == space.cost(r.arch).params
    assert all("is not in table" in r.reason for r in missing)
    again = autosearch.load_study("tab", storage=f"sqlite:///{tmp_path}/tab.db")
    assert again.definition.table == Table(path=str(path)) and len(again.records()) == 30
    with pytest.raises(ExportError, match="looked up in a benchmark table"):
        again.export(again.best(), tmp_path / "x")


def test_json_tables_both_shapes(tmp_path):
    space = NB201Space()
    text = space.to_string(space.default())
    as_object = tmp_path / "a.json"
    as_object.write_text(json.dumps({text: {"val_accuracy": 0.91}}))
    as_rows = tmp_path / "b.json"
    as_rows.write_text(json.dumps([{"arch": text, "acc": 91.0}]))
    a = Table(path=str(as_object), test_accuracy=None, train_time=None)
    b = Table(path=str(as_rows), accuracy="acc", test_accuracy=None, train_time=None)
    assert a.evaluate(space, space.default())["accuracy"] == pytest.approx(0.91)
    assert b.evaluate(space, space.default())["accuracy"] == pytest.approx(0.91)


@pytest.mark.parametrize(
    ("rows", "match"),
    [  # H6b: a JSON table's rows were named from 2, as a CSV file's lines are
        ([{"arch": "x", "val_accuracy": 90}, {"arch": "y", "val_accuracy": -1}], r"row 2: "),
        ([{"arch": "x", "val_accuracy": "high"}], r"row 1: val_accuracy must be numbers"),
        ({"x": {"val_accuracy": 90}, "y": {"val_accuracy": 101}}, r"entry 'y': val_accuracy"),
    ],
)
def test_a_json_tables_rows_are_named_as_they_are_in_the_file(tmp_path, rows, match):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(rows))
    table = Table(path=str(path), test_accuracy=None, train_time=None)
    with pytest.raises(DataError, match=match):
        autosearch.create_study(
            "x", controller=RandomSearch(NB201Space()), table=table,
            storage=f"sqlite:///{tmp_path}/x.db",
        )  # fmt: skip


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("arch,acc\nx,1\n", "no column 'val_accuracy'; its columns are acc, arch"),
        ("arch,val_accuracy,test_accuracy,train_time\nx,1,1,1\nx,2,2,2\n", "lists x twice"),
        ("arch,val_accuracy,test_accuracy,train_time\nx,high,1,1\n", "must be numbers"),
        ("arch,val_accuracy,test_accuracy,train_time\n", "has no rows"),
        # Out of range (were accepted, then failed with "no trial number 0"):
        ("arch,val_accuracy\nx,-3\n", r"line 2: val_accuracy is -3.0; an accuracy is from 0"),
        ("arch,val_accuracy\nx,1e308\n", r"val_accuracy is 1e\+308; an accuracy is from 0"),
        ("arch,val_accuracy\nx,90\ny,100.5\n", r"line 3: val_accuracy is 100.5"),
        ("arch,val_accuracy,test_accuracy\nx,90,-1\n", r"test_accuracy is -1.0; an accuracy"),
        ("arch,val_accuracy,train_time\nx,90,-5\n", r"train_time is -5.0, below 0 s"),
    ],
)
def test_bad_tables_are_refused_before_anything_is_stored(tmp_path, content, match):
    path = tmp_path / "t.csv"
    path.write_text(content)
    with pytest.raises(DataError, match=match):
        autosearch.create_study(
            "x",
            controller=RandomSearch(NB201Space()),
            table=Table(path=str(path)),
            storage=f"sqlite:///{tmp_path}/x.db",
        )
    assert not (tmp_path / "x.db").exists()


def test_tables_need_a_space_with_a_string_form(nb201_table, tmp_path):
    path, _ = nb201_table
    with pytest.raises(StudyError, match="has none \\(to_string\\)"):
        autosearch.create_study(
            "x",
            controller=RandomSearch(ResNetSpace()),
            table=Table(path=str(path)),
            storage=f"sqlite:///{tmp_path}/x.db",
        )
    with pytest.raises(DataError, match="does not exist"):
        Table(path=str(tmp_path / "nope.csv")).rows()


def test_cli_search_over_a_table(nb201_table, tmp_path, monkeypatch, capsys):
    path, _ = nb201_table
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "search",
            "nb",
            "--space",
            "nb201",
            "--table",
            str(path),
            "--n-trials",
            "20",
            "--objectives",
            "accuracy,train_seconds",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "Pareto front" in out and "report:  runs/nb/report.html" in out and "export:" not in out
    assert (tmp_path / "runs" / "nb" / "report.html").is_file()


def test_cli_search_trains_any_registered_space(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "search",
                "m",
                "--space",
                "mobilenet",
                "--n-trials",
                "1",
                "--epochs",
                "1",
                "--max-params",
                "50000",
            ]
        )
        == 0
    )
    assert "best: trial 0, mobilenet" in capsys.readouterr().out
    assert (tmp_path / "runs" / "m" / "best" / "model.py").is_file()
    assert main(["search", "m2", "--space", "mobilnet"]) == 2
    assert "Did you mean 'mobilenet'" in capsys.readouterr().err


def test_a_table_of_fractions_holds_no_accuracy_above_1(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arch,val_accuracy\nx,0.5\ny,2\n")
    table = Table(path=str(path), test_accuracy=None, train_time=None, percent=False)
    with pytest.raises(DataError, match="val_accuracy is 2.0; an accuracy is a fraction from 0"):
        table.rows()


def test_percent_auto_detection_can_be_overridden(tmp_path):
    space = NB201Space()
    path = tmp_path / "t.csv"
    path.write_text(f"arch,val_accuracy\n{space.to_string(space.default())},0.5\n")
    fraction = Table(path=str(path), test_accuracy=None, train_time=None)
    percent = Table(path=str(path), test_accuracy=None, train_time=None, percent=True)
    assert fraction.evaluate(space, space.default())["accuracy"] == 0.5
    assert percent.evaluate(space, space.default())["accuracy"] == 0.005
    assert fraction.rows()[space.to_string(space.default())] == {"val_accuracy": 0.5}


def test_optional_columns_may_be_absent_and_the_cli_names_columns(tmp_path, monkeypatch, capsys):
    space = NB201Space()
    rng = __import__("numpy").random.default_rng(0)
    path = tmp_path / "own.csv"
    with path.open("w", newline="") as f:  # only the two required columns, named our way
        writer = csv.writer(f)
        writer.writerow(["cell", "val_acc"])
        cells = {space.to_string(space.sample(rng)) for _ in range(400)}
        for cell in sorted(cells):
            writer.writerow([cell, f"{rng.uniform(50, 90):.2f}"])
    table = Table(path=str(path), key="cell", accuracy="val_acc")
    found = table.evaluate(space, space.from_string(next(iter(table.rows()))))
    assert 0.5 <= found["accuracy"] <= 0.9 and "test_accuracy" not in found
    monkeypatch.chdir(tmp_path)
    argv = ["search", "own", "--space", "nb201", "--table", str(path), "--n-trials", "5"]
    assert main([*argv, "--table-columns", "key=cell,accuracy=val_acc"]) == 0
    assert "Pareto front" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:  # argparse refuses the option itself
        main([*argv, "--table-columns", "kee=cell"])
    assert refused.value.code == 2
    assert "NAME among key, accuracy, test_accuracy, train_time" in capsys.readouterr().err


def test_tables_name_further_metric_columns_for_a_multi_objective_study(tmp_path):
    space = NB201Space(operations=("none", "skip_connect", "nor_conv_3x3"))  # 729 cells
    lines = ["arch,val_accuracy,lat_ms,uj"]  # no test accuracy, no training time
    rng = np.random.default_rng(0)
    domains = space.domains()
    for values in itertools.product(*(d.values() for d in domains.values())):
        arch = space.make(dict(zip(domains, values, strict=True)))
        convs = sum(v == "nor_conv_3x3" for v in values)
        lines.append(
            f"{space.to_string(arch)},{60 + 5 * convs + rng.normal():.3f},"
            f"{1 + 0.5 * convs:.2f},{200 + 90 * convs}"
        )
    path = tmp_path / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    table = Table(path=str(path), metrics={"latency": "lat_ms", "energy": "uj"})
    url = f"sqlite:///{tmp_path}/mo.db"
    study = autosearch.create_study(
        "mo",
        controller=NSGA2(space, seed=0, objectives={"accuracy": "maximize", "latency": "minimize"}),
        table=table,
        objectives=("accuracy", "latency"),
        storage=url,
    )
    records = study.optimize(12)
    for r in records:
        row = table.rows()[space.to_string(r.arch)]
        assert r.metrics["latency"] == row["lat_ms"] and r.metrics["energy"] == row["uj"]
        assert "test_accuracy" not in r.metrics
    assert {round(p.metrics["latency"], 2) for p in study.pareto()} <= {
        round(r.metrics["latency"], 2) for r in records
    }
    again = autosearch.load_study("mo", storage=url)  # the stored table has its metrics
    assert again.definition.table == table and dict(again.definition.table.metrics) == {
        "latency": "lat_ms",
        "energy": "uj",
    }


@pytest.mark.parametrize(
    ("metrics", "error", "match"),
    [
        ({"latncy": "lat_ms"}, autosearch.UnknownNameError, "Did you mean 'latency'"),
        ({"accuracy": "acc"}, ConfigError, "has its own field"),
        ({"latency": ""}, ConfigError, "must be a name"),
    ],
)
def test_bad_table_metrics_are_refused_with_the_fix(metrics, error, match, tmp_path):
    with pytest.raises(error, match=match):
        Table(path=str(tmp_path / "t.csv"), metrics=metrics)


def test_a_named_metric_column_must_exist(tmp_path):
    space = NB201Space()
    path = tmp_path / "t.csv"
    path.write_text(f"arch,val_accuracy\n{space.to_string(space.default())},0.9\n")
    with pytest.raises(DataError, match="no column 'lat_ms'"):
        Table(path=str(path), metrics={"latency": "lat_ms"}).rows()
