"""Plotly figures of a study.

Cost axes show FLOPs per image = 2 × MACs of conv/linear layers (see autosearch.cost).
"""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go

from autosearch.scoring import objective, pareto_mask
from autosearch.study import Record, Study

__all__ = ["pareto"]

_AXIS_TITLES = {
    "accuracy": "validation accuracy",
    "flops": "FLOPs per image (2 × MACs, log scale)",
    "macs": "MACs per image (log scale)",
    "params": "parameters (log scale)",
}


def _hover(record: Record) -> str:
    m = record.metrics
    test = f"<br>test accuracy {m['test_accuracy']:.4f}" if "test_accuracy" in m else ""
    return (
        f"trial {record.trial} · {html.escape(record.variant)}<br>{html.escape(record.description)}"
        f"<br>val accuracy {m['accuracy']:.4f}{test}<br>{m['flops']:.4g} FLOPs · "
        f"{m['params']:.4g} params"
    )


def pareto(study: Study, *, x: str = "flops", y: str = "accuracy") -> go.Figure:
    """Every complete trial as a point of ``y`` against ``x`` (log), the front as a step line.

    Hovering a point shows its trial number, one-line description and metrics.
    """
    for name in (x, y):
        objective(name)  # unknown names raise with suggestions
    done = [r for r in study.records() if r.state == "complete"]
    front_ids = _front_ids(done, x, y)
    others = [r for r in done if r.trial not in front_ids]
    front = sorted((r for r in done if r.trial in front_ids), key=lambda r: r.metrics[x])
    fig = go.Figure()
    fig.add_trace(_points(others, x, y, name="trials", color="#9aa5b1", mode="markers"))
    fig.add_trace(_points(front, x, y, name="Pareto front", color="#d1495b", mode="lines+markers"))
    fig.update_layout(
        title=f"{html.escape(study.name)}: {y} against {x} ({len(done)} trials)",
        xaxis={"title": _AXIS_TITLES.get(x, x), "type": "log"},
        yaxis={"title": _AXIS_TITLES.get(y, y)},
        template="plotly_white",
        hovermode="closest",
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def _points(
    records: list[Record], x: str, y: str, *, name: str, color: str, mode: str
) -> go.Scatter:
    return go.Scatter(
        x=[r.metrics[x] for r in records],
        y=[r.metrics[y] for r in records],
        mode=mode,
        name=name,
        line={"shape": "hv", "color": color},
        marker={"size": 9, "color": color},
        text=[_hover(r) for r in records],
        hovertemplate="%{text}<extra></extra>",
    )


def _front_ids(records: list[Record], x: str, y: str) -> set[int]:
    """Trials no other trial beats on both ``x`` and ``y``."""
    if not records:
        return set()
    values = np.array([[r.metrics[y], r.metrics[x]] for r in records])
    mask = pareto_mask(values, [objective(y).direction, objective(x).direction])
    return {r.trial for r, keep in zip(records, mask, strict=True) if keep}
