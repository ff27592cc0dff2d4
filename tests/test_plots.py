from __future__ import annotations

import pytest

import autosearch
from autosearch import UnknownNameError


def test_pareto_figure_shows_every_trial_and_the_front(make_study):
    study = make_study()
    study.optimize(4)
    fig = autosearch.plots.pareto(study)  # loaded lazily from `import autosearch`
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
    fig = autosearch.plots.pareto(study, x="params")
    assert "<b>x</b>" not in fig.layout.title.text and "&lt;b&gt;" in fig.layout.title.text
    with pytest.raises(UnknownNameError, match="Did you mean 'params'"):
        autosearch.plots.pareto(study, x="param")
