"""Plotly figures of studies.

* :func:`pareto` — accuracy against a cost (2-D, or 3-D with ``z``), every variant
  joined to its parent, the front drawn; several studies overlaid when given a list;
* :func:`history` — each trial's accuracy and the best so far;
* :func:`hypervolume` — the area the accuracy / cost front dominates, trial by trial;
* :func:`learning_curves` — validation accuracy per epoch of every trial;
* :func:`compare` — best-so-far curves of several studies (controllers) side by side;
* :func:`importance` — which genes matter most for accuracy (Optuna's fANOVA);
* :func:`population` — a population's accuracy and adapted setting per member, exploits.

Cost axes show FLOPs per image = 2 × MACs of conv/linear layers (see autosearch.scoring.cost).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from autosearch.compress import parse_variant
from autosearch.errors import ConfigError
from autosearch.report.population import population
from autosearch.scoring import objective, pareto_mask
from autosearch.scoring.metrics import metric
from autosearch.scoring.pareto import hypervolume as front_hypervolume
from autosearch.study import Record, Study
from autosearch.study.overlays import figures

__all__ = [
    "compare",
    "history",
    "hypervolume",
    "importance",
    "learning_curves",
    "pareto",
    "population",
]

_PALETTE = ("#d1495b", "#00798c", "#edae49", "#30638e", "#66a182", "#8d96a3", "#5b2a86")

_SYMBOLS = {
    "base": "circle",
    "prune-l1": "diamond",
    "prune-channels": "triangle-up",
    "int8": "square",
    "qat-int8": "square-open",
    "distill": "star",
}


_HOVER = ("accuracy", "test_accuracy", "flops", "params", "latency")


def _hover(record: Record) -> str:
    lines = [f"{metric(n).header}: {metric(n).cell(record.metrics)}" for n in _HOVER]
    lines.append(f"figures: {figures(record)}")
    head = f"trial {record.trial} · {_text(record.variant)}"
    return "<br>".join([head, _text(record.description), *lines])


def _kind(record: Record) -> str:
    return parse_variant(record.variant).kind


def _axis(name: str) -> dict[str, str]:
    found = metric(name)
    return {"title": found.axis_title, **({"type": "log"} if found.log else {})}


def pareto(
    study: Study | Sequence[Study],
    *,
    x: str = "flops",
    y: str = "accuracy",
    z: str | None = None,
) -> go.Figure:
    """Every complete (architecture, variant) point of ``y`` against ``x`` (log), the
    front over all of them as a step line, and each variant joined to its parent by a
    thin line. A marker's shape tells the variant.

    With ``z`` the points are drawn in 3-D (``x`` and ``z`` on log axes). Given several
    studies, each is drawn in its own colour with its own front.

    Hovering a point shows its trial number, variant, one-line description and metrics.
    """
    for name in (x, y, *([z] if z else [])):
        objective(name)  # unknown names raise with suggestions
    studies = [study] if isinstance(study, Study) else list(study)
    if not studies:
        raise ConfigError("pareto() needs a study, or a list of studies to overlay")
    if z is not None:
        return _pareto_3d(studies, x, y, z)
    fig = go.Figure()
    points = 0
    for i, one in enumerate(studies):
        done = [r for r in one.records() if r.state == "complete" and x in r.metrics]
        points += len(done)
        colour = _PALETTE[i % len(_PALETTE)]
        prefix = f"{_text(one.name)}: " if len(studies) > 1 else ""
        fig.add_traces(_study_traces(done, x, y, colour=colour, prefix=prefix))
    if len(studies) == 1:
        trials = len({r.trial for r in studies[0].records() if r.state == "complete"})
        title = (
            f"{_text(studies[0].name)}: {y} against {x} ({trials} trials, "
            f"{points} points with variants)"
        )
    else:
        title = f"{y} against {x}: " + ", ".join(_text(s.name) for s in studies)
    fig.update_layout(
        title=title,
        xaxis=_axis(x),
        yaxis=_axis(y),
        template="plotly_white",
        hovermode="closest",
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def _study_traces(
    done: list[Record], x: str, y: str, *, colour: str, prefix: str
) -> list[go.Scatter]:
    """One study's points in 2-D: links from parents to variants, a trace per variant
    kind (off the front), and the front (in the study's colour when overlaid)."""
    overlay = bool(prefix)
    front_keys = _front_keys(done, x, y)
    traces = [_links(done, x, y)]
    for kind in sorted({_kind(r) for r in done}, key=lambda k: k != "base"):
        members = [r for r in done if _kind(r) == kind and _key(r) not in front_keys]
        traces.append(
            _points(
                members,
                x,
                y,
                name=prefix + ("trials" if kind == "base" else kind),
                color=colour if overlay else "#9aa5b1",
                mode="markers",
                kind=kind,
                opacity=0.45 if overlay else 1.0,
            )
        )
    front = sorted((r for r in done if _key(r) in front_keys), key=lambda r: r.metrics[x])
    traces.append(
        _points(front, x, y, name=prefix + "Pareto front", color=colour, mode="lines+markers")
    )
    return traces


def _pareto_3d(studies: list[Study], x: str, y: str, z: str) -> go.Figure:
    fig = go.Figure()
    for i, one in enumerate(studies):
        done = [r for r in one.records() if r.state == "complete" and x in r.metrics]
        done = [r for r in done if z in r.metrics]
        values = np.array([[r.metrics[o] for o in (y, x, z)] for r in done]).reshape(-1, 3)
        mask = (
            pareto_mask(values, [objective(o).direction for o in (y, x, z)])
            if len(done)
            else np.zeros(0, bool)
        )
        for on_front, label in ((False, "points"), (True, "Pareto front (3 objectives)")):
            members = [r for r, m in zip(done, mask, strict=True) if bool(m) == on_front]
            fig.add_trace(
                go.Scatter3d(
                    x=[r.metrics[x] for r in members],
                    y=[r.metrics[z] for r in members],
                    z=[r.metrics[y] for r in members],
                    mode="markers",
                    name=(f"{_text(one.name)}: " if len(studies) > 1 else "") + label,
                    marker={
                        "size": 5 if on_front else 3,
                        "color": _PALETTE[i % len(_PALETTE)] if on_front else "#9aa5b1",
                    },
                    text=[_hover(r) for r in members],
                    hovertemplate="%{text}<extra></extra>",
                )
            )
    fig.update_layout(
        title=f"{y} against {x} and {z}",
        # Few ticks per axis and a camera off the diagonal, so that the three axis
        # titles and their numbers do not overlap at the view the page opens with.
        scene={
            "xaxis": {**_axis(x), "nticks": 5},
            "yaxis": {**_axis(z), "nticks": 5},
            "zaxis": {**_axis(y), "nticks": 5},
            "camera": {"eye": {"x": 1.9, "y": -1.5, "z": 0.8}},
        },
        height=640,
        margin={"l": 0, "r": 0, "t": 50, "b": 0},
        template="plotly_white",
    )
    return fig


def _finished(study: Study) -> list[Record]:
    """Base records of trials that trained (complete or stopped early), in trial order."""
    return [
        r
        for r in study.records(variants=False)
        if r.state in ("complete", "stopped") and r.accuracy is not None
    ]


def _accuracy_study(study: Study, records: list[Record], *, name: str = "") -> Any:
    """An in-memory Optuna study of ``records``' trials valued by validation accuracy
    (maximised), with their genes and learning curves: what Optuna's own figures
    (``optuna.visualization``) draw from. A stored study's values are its best point's
    objectives, and its trials include attempts given up: these are the records'."""
    import optuna

    stored = {t.number: t for t in study.trials.all()}
    scored = optuna.create_study(direction="maximize", study_name=name or study.name)
    for record in records:
        trial = stored[record.trial]
        scored.add_trial(
            optuna.trial.create_trial(
                params=trial.params,
                distributions=trial.distributions,
                value=record.metrics["accuracy"],
                intermediate_values=dict(trial.intermediate_values),
                user_attrs={"description": record.description},
            )
        )
    return scored


def history(study: Study) -> go.Figure:
    """Each trial's validation accuracy and the best so far (Optuna's optimization
    history of the trials that trained)."""
    from optuna.visualization import plot_optimization_history

    fig = plot_optimization_history(
        _accuracy_study(study, _finished(study)), target_name="validation accuracy"
    )
    fig.update_layout(
        title=f"{_text(study.name)}: validation accuracy by trial", template="plotly_white"
    )
    return fig


def hypervolume_of(points: Sequence[tuple[float, float]], reference_cost: float) -> float:
    """Area dominated by (accuracy, cost) points, maximising accuracy from 0 and
    minimising log10(cost) up to log10(``reference_cost``)
    (autosearch.scoring.pareto.hypervolume)."""
    logged = [(accuracy, math.log10(cost)) for accuracy, cost in points if cost > 0]
    reference = (0.0, math.log10(reference_cost))
    return front_hypervolume(logged, reference, ["maximize", "minimize"]) if logged else 0.0


def hypervolume(study: Study, *, x: str = "flops") -> go.Figure:
    """The hypervolume of the (validation accuracy, log ``x``) front after each trial:
    the area of accuracy × decades of cost it dominates, with the reference at accuracy
    0 and twice the costliest point's cost. It only grows; flat stretches are trials
    that did not improve the front."""
    objective(x)
    done = [r for r in study.records() if r.state == "complete" and x in r.metrics]
    reference = 2 * max((r.metrics[x] for r in done), default=1.0)
    trials = sorted({r.trial for r in done})
    values = [
        hypervolume_of(
            [(r.metrics["accuracy"], r.metrics[x]) for r in done if r.trial <= t], reference
        )
        for t in trials
    ]
    fig = go.Figure(
        go.Scatter(
            x=trials,
            y=values,
            mode="lines+markers",
            line={"shape": "hv", "color": "#00798c"},
            name="hypervolume",
        )
    )
    fig.update_layout(
        title=f"{_text(study.name)}: hypervolume of the accuracy / {x} front",
        xaxis={"title": "trial"},
        yaxis={"title": f"accuracy × decades of {x} dominated (reference: 0, {reference:.3g})"},
        template="plotly_white",
    )
    return fig


def learning_curves(study: Study, *, limit: int = 50) -> go.Figure:
    """Validation accuracy after each epoch, one line per trial (Optuna's intermediate
    values; the ``limit`` most accurate trials, the rest left out to keep it readable)."""
    from optuna.visualization import plot_intermediate_values

    curves = study.trials.curves()
    ranked = sorted(curves, key=lambda t: -max(curves[t].values()))[:limit]
    chosen = set(ranked)
    records = [r for r in _finished(study) if r.trial in chosen]
    fig = plot_intermediate_values(_accuracy_study(study, records))
    fig.update_layout(
        title=f"{_text(study.name)}: learning curves ({len(records)} of {len(curves)} trials)",
        xaxis={"title": "epoch"},
        yaxis=_axis("accuracy"),
        template="plotly_white",
    )
    return fig


def compare(studies: Sequence[Study]) -> go.Figure:
    """Best validation accuracy so far against trials, one line per study, labelled by
    study and controller: how fast each search finds good networks (Optuna's
    optimization history of several studies)."""
    from optuna.visualization import plot_optimization_history

    scored = [
        _accuracy_study(one, _finished(one), name=f"{one.name} ({one.controller.name})")
        for one in studies
    ]
    fig = plot_optimization_history(scored, target_name="validation accuracy")
    fig.update_layout(title="best validation accuracy so far", template="plotly_white")
    return fig


def importance(study: Study) -> go.Figure:
    """How much each gene explains validation accuracy (Optuna's fANOVA over the
    trials that finished; needs at least two)."""
    import optuna
    from optuna.visualization import plot_param_importances

    complete = [
        r
        for r in study.records(variants=False)
        if r.state == "complete" and "accuracy" in r.metrics
    ]
    if len(complete) < 2:
        raise ValueError(
            f"parameter importance needs at least 2 complete trials; {study.name!r} has "
            f"{len(complete)}"
        )
    fig = plot_param_importances(
        _accuracy_study(study, complete),
        evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0),
        target_name="validation accuracy",
    )
    fig.update_layout(
        title=f"{_text(study.name)}: gene importance for validation accuracy (fANOVA)",
        template="plotly_white",
    )
    return fig


def _text(value: object) -> str:
    """``value`` shown as plain text in a plotly label: plotly reads ``<``, ``>`` and
    ``&`` as its markup (links, bold), and shows quotes as they are (``&quot;`` would be
    shown as those six characters)."""
    return html.escape(str(value), quote=False)


def _key(record: Record) -> tuple[int, str]:
    return (record.trial, record.variant)


def _links(records: list[Record], x: str, y: str) -> go.Scatter:
    """Thin segments from each trial's base point to each of its variants."""
    base = {r.trial: r for r in records if r.is_base}
    xs: list[float | None] = []
    ys: list[float | None] = []
    for r in records:
        parent = base.get(r.trial)
        if r.is_base or parent is None:
            continue
        xs += [parent.metrics[x], r.metrics[x], None]
        ys += [parent.metrics[y], r.metrics[y], None]
    return go.Scatter(
        x=xs,
        y=ys,
        mode="lines",
        name="variant of",
        line={"color": "#c8cdd3", "width": 1},
        hoverinfo="skip",
    )


def _points(
    records: list[Record],
    x: str,
    y: str,
    *,
    name: str,
    color: str,
    mode: str,
    kind: str | None = None,
    opacity: float = 1.0,
) -> go.Scatter:
    # An open marker: the point's figures are estimates (not measured yet).
    symbols = [
        _SYMBOLS.get(kind or _kind(r), "circle") + ("-open" if figures(r) != "measured" else "")
        for r in records
    ]
    return go.Scatter(
        x=[r.metrics[x] for r in records],
        y=[r.metrics[y] for r in records],
        mode=mode,
        name=name,
        line={"shape": "hv", "color": color},
        marker={"size": 9, "color": color, "symbol": symbols, "opacity": opacity},
        text=[_hover(r) for r in records],
        hovertemplate="%{text}<extra></extra>",
    )


def _front_keys(records: list[Record], x: str, y: str) -> set[tuple[int, str]]:
    """(trial, variant) points no other point beats on both ``x`` and ``y``."""
    if not records:
        return set()
    values = np.array([[r.metrics[y], r.metrics[x]] for r in records])
    mask = pareto_mask(values, [objective(y).direction, objective(x).direction])
    return {_key(r) for r, keep in zip(records, mask, strict=True) if keep}
