"""A population's story as a figure: each member's validation accuracy and its adapted
setting, epoch by epoch, and every exploit (which member copied whom, when)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from autosearch.errors import ConfigError

__all__ = ["population"]

_PALETTE = ("#d1495b", "#00798c", "#edae49", "#30638e", "#66a182", "#8d96a3", "#5b2a86", "#222")


def population(record: Mapping[str, Any] | str | Path, *, setting: str = "lr") -> go.Figure:
    """Each member's validation accuracy (top) and ``setting`` (bottom) over the epochs,
    following its lineage: after an exploit a member's line continues from its donor's
    checkpoint, marked ``3 ← 1``. ``record``: a population's folder, its
    ``population.json``, or the record read."""
    state = _read(record) if not isinstance(record, Mapping) else record
    members = state.get("members") if isinstance(state, Mapping) else None
    if not (isinstance(members, list) and members and isinstance(state.get("rounds"), list)):
        raise ConfigError(
            "the population record holds no members to draw: pass a population's folder, "
            "its population.json, or a population trial's result['population']"
        )
    if setting not in members[0]["settings"]:
        raise ConfigError(
            f"the population adapts {', '.join(members[0]['settings'])}, not {setting!r}"
        )
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    for member in members:
        color = _PALETTE[member["id"] % len(_PALETTE)]
        name = f"member {member['id']}"
        scores = sorted((int(e), s) for e, s in member["scores"].items())
        fig.add_trace(
            go.Scatter(
                x=[e for e, _ in scores], y=[s for _, s in scores], mode="lines+markers",
                name=name, legendgroup=name, line={"color": color},
                hovertemplate=f"{name}<br>epoch %{{x}}: %{{y:.4f}}<extra></extra>",
            ),
            row=1, col=1,
        )  # fmt: skip
        xs, ys = [], []
        for segment in member["schedule"]:
            xs += [segment["from"], segment["to"]]
            ys += [segment["settings"][setting]] * 2
        fig.add_trace(
            go.Scatter(
                x=xs, y=ys, mode="lines", name=name, legendgroup=name, showlegend=False,
                line={"color": color, "shape": "hv"},
                hovertemplate=f"{name}<br>epoch %{{x}}: {setting} %{{y:.4g}}<extra></extra>",
            ),
            row=2, col=1,
        )  # fmt: skip
    exploits = [(r["epoch"], e) for r in state["rounds"] for e in r["exploits"]]
    if exploits:
        fig.add_trace(
            go.Scatter(
                x=[epoch for epoch, _ in exploits],
                y=[e["after"][setting] for _, e in exploits],
                mode="markers+text", name="exploit", marker={"symbol": "star", "size": 11},
                text=[f"{e['member']} ← {e['from']}" for _, e in exploits],
                textposition="top center",
                hovertemplate="%{text} at epoch %{x}<extra></extra>",
            ),
            row=2, col=1,
        )  # fmt: skip
    fig.update_yaxes(title_text="validation accuracy", row=1, col=1)
    fig.update_yaxes(title_text=html.escape(setting), type="log", row=2, col=1)
    fig.update_xaxes(title_text="epoch", row=2, col=1)
    fig.update_layout(
        title=f"population of {len(members)}: {len(exploits)} exploits in "
        f"{len(state['rounds'])} rounds",
        template="plotly_white",
        height=640,
    )
    return fig


def _read(where: str | Path) -> Mapping[str, Any]:
    path = Path(where)
    path = path / "population.json" if path.is_dir() else path
    try:
        state: Mapping[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the population record {path}: {exc}") from None
    return state
