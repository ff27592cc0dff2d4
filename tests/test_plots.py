from __future__ import annotations

import numpy as np
import pytest

import autosearch
from autosearch import UnknownNameError


def test_pareto_figure_shows_every_trial_and_the_front(make_study):
    study = make_study()
    study.optimize(4)
    fig = autosearch.report.plots.pareto(study)  # loaded lazily from `import autosearch`
    links, others, front = fig.data
    assert links.name == "variant of" and not links.x  # a study of base networks only
    assert fig.layout.xaxis.type == "log" and "2 × MACs" in fig.layout.xaxis.title.text
    assert len(others.x) + len(front.x) == 4
    front_trials = {r.trial for r in study.pareto()}
    assert len(front.x) == len(front_trials) and "lines" in front.mode
    assert list(front.x) == sorted(front.x)  # drawn left to right
    for record in study.records():
        hover = next(
            t for t in (*others.text, *front.text) if t.startswith(f"trial {record.trial} ")
        )
        assert record.description in hover
        assert (record.trial in front_trials) == (hover in front.text)


def test_pareto_figure_escapes_names_and_checks_axes(make_study):
    study = make_study("<b>x</b>")
    study.optimize(1)
    fig = autosearch.report.plots.pareto(study, x="params")
    assert "<b>x</b>" not in fig.layout.title.text and "&lt;b&gt;" in fig.layout.title.text
    with pytest.raises(UnknownNameError, match="Did you mean 'params'"):
        autosearch.report.plots.pareto(study, x="param")


def test_hypervolume_of_known_points():
    from autosearch.report.plots import hypervolume_of

    # Reference cost 1000 (3 decades). (0.5 at 10) dominates 0.5 x (3 - 1) = 1.0; (0.8 at
    # 100) adds (0.8 - 0.5) x (3 - 2) = 0.3; a dominated point adds nothing.
    assert hypervolume_of([(0.5, 10.0), (0.8, 100.0), (0.4, 500.0)], 1000.0) == pytest.approx(1.3)
    assert hypervolume_of([], 1000.0) == 0.0
    assert hypervolume_of([(0.9, 2000.0)], 1000.0) == 0.0  # beyond the reference


def test_history_hypervolume_and_learning_curves(make_study):
    from autosearch.report import plots

    study = make_study()
    study.optimize(4)
    records = study.records(variants=False)
    best, points = plots.history(study).data[1], plots.history(study).data[0]
    assert list(points.y) == [r.accuracy for r in records]
    assert list(best.y) == list(np.maximum.accumulate([r.accuracy for r in records]))
    volume = plots.hypervolume(study).data[0].y
    assert len(volume) == 4 and (np.diff(volume) >= 0).all()  # it only grows
    assert volume[-1] > 0
    curves = study.trials.curves()
    assert sorted(curves) == [r.trial for r in records]
    assert all(list(c) == [1] for c in curves.values())  # one epoch each (tiny_train)
    lines = plots.learning_curves(study).data  # Optuna's intermediate values
    assert sorted(line.name for line in lines) == [f"Trial{r.trial}" for r in records]
    assert all(list(line.y) == [curves[int(line.name[5:])][1]] for line in lines)


def test_overlaid_fronts_3d_comparison_and_importance(make_study):
    from autosearch.report import plots

    first, second = make_study("first"), make_study("second", seed=1)
    first.optimize(3)
    second.optimize(2)
    overlay = plots.pareto([first, second])
    assert {t.name for t in overlay.data} >= {"first: Pareto front", "second: Pareto front"}
    cube = plots.pareto(first, z="params")
    assert all(t.type == "scatter3d" for t in cube.data)
    assert sum(len(t.x) for t in cube.data) == 3
    scene = cube.layout.scene  # a view whose axis titles do not overlap, few ticks
    assert scene.camera.eye.x > 1.5 and {scene.xaxis.nticks, scene.zaxis.nticks} == {5}
    lines = plots.compare([first, second]).data  # Optuna's optimization history of both
    best = [t for t in lines if t.name.startswith("Best Value of")]
    assert [len(t.y) for t in best] == [3, 2] and best[0].name.endswith("first (random)")
    bars = plots.importance(first).data[0]
    assert set(bars.y) <= set(first.space.domains()) and sum(bars.x) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least 2 complete trials"):
        plots.importance(make_study("empty"))


def test_epoch_callbacks_report_every_epoch(make_study):
    seen = []
    study = make_study(train=autosearch.TrainConfig(epochs=2, batch_size=128, lr=0.1))
    study.optimize(2, epoch_callbacks=[lambda trial, epoch: seen.append((trial, epoch.epoch))])
    assert seen == [(0, 1), (0, 2), (1, 1), (1, 2)]
