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
    "latency": "latency, ms per image (batch 1, one CPU thread, log scale)",
    "bytes": "saved weights, bytes (log scale)",
    "bops": "bit-operations = MACs × weight bits × activation bits (log scale)",
    "sparse_macs": "sparse-effective MACs per image (log scale)",
}


_SYMBOLS = {
    "base": "circle",
    "prune-l1": "diamond",
    "prune-channels": "triangle-up",
    "int8": "square",
    "qat-int8": "square-open",
    "distill": "star",
}


def _hover(record: Record) -> str:
    m = record.metrics
    test = f"<br>test accuracy {m['test_accuracy']:.4f}" if "test_accuracy" in m else ""
    latency = f"<br>latency {m['latency']:.3f} ms (batch 1, 1 thread)" if "latency" in m else ""
    return (
        f"trial {record.trial} · {html.escape(record.variant)}<br>{html.escape(record.description)}"
        f"<br>val accuracy {m['accuracy']:.4f}{test}<br>{m['flops']:.4g} FLOPs · "
        f"{m['params']:.4g} params{latency}"
    )


def pareto(study: Study, *, x: str = "flops", y: str = "accuracy") -> go.Figure:
    """Every complete (architecture, variant) point of ``y`` against ``x`` (log), the
    front over all of them as a step line, and each variant joined to its parent by a
    thin line. A marker's shape tells the variant.

    Hovering a point shows its trial number, variant, one-line description and metrics.
    """
    for name in (x, y):
        objective(name)  # unknown names raise with suggestions
    done = [r for r in study.records() if r.state == "complete" and x in r.metrics]
    front_keys = _front_keys(done, x, y)
    fig = go.Figure()
    fig.add_trace(_links(done, x, y))
    kinds = sorted({r.variant.partition("@")[0] for r in done}, key=lambda k: k != "base")
    for kind in kinds:
        members = [
            r for r in done if r.variant.partition("@")[0] == kind and _key(r) not in front_keys
        ]
        label = "trials" if kind == "base" else kind
        fig.add_trace(
            _points(members, x, y, name=label, color="#9aa5b1", mode="markers", kind=kind)
        )
    front = sorted((r for r in done if _key(r) in front_keys), key=lambda r: r.metrics[x])
    fig.add_trace(_points(front, x, y, name="Pareto front", color="#d1495b", mode="lines+markers"))
    trials = len({r.trial for r in done})
    fig.update_layout(
        title=f"{html.escape(study.name)}: {y} against {x} ({trials} trials, "
        f"{len(done)} points with variants)",
        xaxis={"title": _AXIS_TITLES.get(x, x), "type": "log"},
        yaxis={"title": _AXIS_TITLES.get(y, y)},
        template="plotly_white",
        hovermode="closest",
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


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
) -> go.Scatter:
    symbols = [_SYMBOLS.get(kind or r.variant.partition("@")[0], "circle") for r in records]
    return go.Scatter(
        x=[r.metrics[x] for r in records],
        y=[r.metrics[y] for r in records],
        mode=mode,
        name=name,
        line={"shape": "hv", "color": color},
        marker={"size": 9, "color": color, "symbol": symbols},
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
