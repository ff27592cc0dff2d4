"""Results as a table: ``study.records_dataframe()`` holds every figure, gene and
variant of ``study.records()``, laid out as Optuna's ``trials_dataframe`` lays a study
out (``params_*`` columns, a MultiIndex on request)."""

from __future__ import annotations

import math
import sys

import pytest

import autosearch
from autosearch import ConfigError

pd = pytest.importorskip("pandas")


def test_the_table_holds_every_record_gene_and_figure(make_study):
    study = make_study("table", variants=("base", "int8"), objectives=("accuracy", "flops"))
    study.optimize(3)
    records = study.records()
    frame = study.records_dataframe()
    assert len(frame) == len(records) and set(frame["variant"]) == {"base", "int8"}
    assert list(frame.columns[:7]) == [
        "trial",
        "variant",
        "state",
        "kind",
        "confirms",
        "arch_id",
        "description",
    ]
    for record, (_, row) in zip(records, frame.iterrows(), strict=True):
        assert (row["trial"], row["variant"], row["state"]) == (
            record.trial,
            record.variant,
            record.state,
        )
        assert row["arch_id"] == record.arch.arch_id and row["reason"] == record.reason
        for gene, value in record.arch.items():
            assert row[f"params_{gene}"] == value
        for name, value in record.metrics.items():
            assert row[f"metrics_{name}"] == pytest.approx(value)
        absent = {c[len("metrics_") :] for c in frame.columns if c.startswith("metrics_")}
        for name in absent - set(record.metrics):
            assert math.isnan(row[f"metrics_{name}"])
    figures = [c for c in frame.columns if c.startswith("metrics_")]
    assert figures[:3] == ["metrics_accuracy", "metrics_test_accuracy", "metrics_flops"]
    base = study.records_dataframe(variants=False)
    assert set(base["variant"]) == {"base"} and len(base) == 3


def test_a_multi_index_groups_genes_and_figures(make_study):
    study = make_study("multi")
    study.optimize(2)
    frame = study.records_dataframe(multi_index=True)
    assert ("metrics", "accuracy") in frame.columns and ("trial", "") in frame.columns
    assert set(frame["params"].columns) == set(study.records()[0].arch)


def test_a_failed_trial_is_a_row_with_its_reason(make_study, monkeypatch):
    from autosearch.evaluation import runner

    def broken(*args, **kwargs):
        raise autosearch.TrialFailed("the data loader broke")

    monkeypatch.setattr(runner, "train_candidate", broken)
    study = make_study("failed")
    study.optimize(1)
    (row,) = study.records_dataframe().to_dict("records")
    assert row["state"] == "failed" and "the data loader broke" in row["reason"]


def test_without_pandas_the_error_says_how_to_install(make_study, monkeypatch):
    study = make_study("nopandas")
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now fails
    with pytest.raises(ConfigError, match="need pandas: pip install pandas"):
        study.records_dataframe()
