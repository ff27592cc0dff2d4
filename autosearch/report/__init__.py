"""A self-contained HTML report of a study (plotly.js inlined: opens offline)."""

from __future__ import annotations

import html
import logging
from pathlib import Path

from autosearch.data import CleaningReport
from autosearch.errors import ExportError
from autosearch.report import plots
from autosearch.scoring.cost import CONVENTIONS
from autosearch.scoring.metrics import metric
from autosearch.study import Record, Study
from autosearch.study.overlays import figures as point_figures

__all__ = ["write_report"]

logger = logging.getLogger(__name__)

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3rem 0.7rem; text-align: right; }
th:nth-child(2), td:nth-child(2) { text-align: left; font-family: ui-monospace, monospace; }
.note { color: #666; font-size: 0.85rem; }
"""


_COLUMNS = (
    "accuracy",
    "test_accuracy",
    "flops",
    "sparse_macs",
    "params",
    "bytes",
    "latency",
    "latency_batched",
    "reward",
)


def _row(r: Record) -> str:
    cells = "".join(f"<td>{metric(n).cell(r.metrics)}</td>" for n in _COLUMNS)
    return (
        f"<tr><td>{r.trial}</td><td>{html.escape(r.description)}</td>"
        f"<td>{html.escape(r.variant)}</td>{cells}<td>{html.escape(point_figures(r))}</td></tr>"
    )


def _table(records: list[Record]) -> str:
    headers = "".join(f"<th>{html.escape(metric(n).header)}</th>" for n in _COLUMNS)
    head = f"<tr><th>trial</th><th>architecture</th><th>variant</th>{headers}<th>figures</th></tr>"
    return f"<table>{head}{''.join(map(_row, records))}</table>"


def _unreadable(study: Study) -> str:
    if not study.trials.unreadable:
        return ""
    items = "".join(f"<li>{html.escape(why)}</li>" for why in study.trials.unreadable.values())
    return f"<h2>Stored trials left out (unreadable)</h2><ul>{items}</ul>"


def _cleaning(study: Study) -> str:
    report = study.definition.data_report
    if not report:
        return ""
    lines = CleaningReport(**{k: v for k, v in report.items() if k != "imbalance"}).lines()
    files = "".join(f"<li>{html.escape(p)}</li>" for p in report["unreadable"][:20])
    return (
        f"<h2>Data cleaning</h2><ul>{''.join(f'<li>{html.escape(x)}</li>' for x in lines)}"
        f"</ul>"
        + (f"<details><summary>files left out</summary><ul>{files}</ul></details>" if files else "")
    )


def _figures(study: Study, points: list[Record]) -> str:
    """Every plot that has something to show, plotly.js inlined once (with the first)."""
    figures = [("Pareto front", plots.pareto(study))]
    if any("latency" in r.metrics for r in points):
        figures.append(("Accuracy, FLOPs and latency", plots.pareto(study, x="flops", z="latency")))
    if points:
        figures += [
            ("Search history", plots.history(study)),
            ("Hypervolume", plots.hypervolume(study)),
        ]
    if study.trials.curves():
        figures.append(("Learning curves", plots.learning_curves(study)))
    try:
        figures.append(("Gene importance", plots.importance(study)))
    except (ValueError, RuntimeError) as exc:  # too few trials, or genes that never varied
        logger.info("no importance plot: %s", exc)
    parts = []
    for i, (title, figure) in enumerate(figures):
        div = figure.to_html(include_plotlyjs=i == 0, full_html=False, div_id=f"plot-{i}")
        parts.append(f"<h2>{html.escape(title)}</h2><div class='plot'>{div}</div>")
    return "\n".join(parts)


def _costs(study: Study, records: list[Record]) -> str:
    seconds = sum(r.metrics.get("train_seconds", 0.0) for r in records)
    finetune = sum(r.metrics.get("finetune_seconds", 0.0) for r in study.records())
    stopped = sum(r.state == "stopped" for r in records)
    return (
        f"<p>Compute: {seconds:.1f} s training candidates"
        + (f", {finetune:.1f} s deriving variants" if finetune else "")
        + (f"; {stopped} trials stopped early" if stopped else "")
        + ".</p>"
    )


def _confirmations(study: Study) -> str:
    """A supernet study's confirmed subnets: inherited against trained accuracy."""
    rows = study.supernet.confirmations() if study.supernet else []
    if not rows:
        return ""
    cells = "".join(
        f"<tr><td>{c.trial}</td><td>{html.escape(c.description)}</td>"
        f"<td>{c.flops / 1e6:.2f}</td><td>{c.inherited:.4f}</td>"
        f"<td>{'-' if c.confirmed is None else f'{c.confirmed:.4f}'}</td>"
        f"<td>{'-' if c.confirmed_by is None else c.confirmed_by}</td>"
        f"<td>{html.escape(c.state)}</td></tr>"
        for c in rows
    )
    return (
        "<h2>Confirmed by training</h2><p>Subnets of the supernet's front trained from "
        "scratch with the study's training config (validation accuracy); "
        "<code>best()</code> prefers them.</p><table><tr><th>trial</th><th>architecture</th>"
        "<th>MFLOPs</th><th>inherited</th><th>confirmed</th><th>by trial</th><th>state</th>"
        f"</tr>{cells}</table>"
    )


def _populations(study: Study, done: list[Record]) -> str:
    """Each trial trained as a population (a confirmation's, or an architecture's):
    every member's accuracy and adapted setting by epoch, and who copied whom."""
    parts = []
    for r in sorted(done, key=lambda r: r.trial):
        if "population_size" not in r.metrics:
            continue
        stored = study.trials.get(r.trial).user_attrs.get("result", {}).get("population", {})
        if not stored.get("members"):  # stored before members were kept
            continue
        setting = next(iter(stored["members"][0]["settings"]))
        figure = plots.population(stored, setting=setting)
        div = figure.to_html(include_plotlyjs=False, full_html=False, div_id=f"pop-{r.trial}")
        parts.append(
            f"<h3>Trial {r.trial}: {html.escape(r.description)}, member {stored['winner']} "
            f"won ({r.metrics['accuracy']:.4f})</h3><div class='plot'>{div}</div>"
        )
    if not parts:
        return ""
    return "<h2>Trained as populations</h2>" + "\n".join(parts)


def _proxies(done: list[Record]) -> str:
    """How well each zero-cost proxy the study computed, and the estimate (their log
    ranks summed over the candidates that have them all), ranks its trained candidates:
    Spearman's rho and Kendall's tau against validation accuracy."""
    from scipy import stats

    from autosearch.evaluation.proxies import PROXIES
    from autosearch.scoring.ranks import combined

    computed = [n for n in PROXIES if any(n in r.metrics for r in done)]
    whole = [r for r in done if all(n in r.metrics for n in computed)]
    estimate: list[tuple[float, float]] = []  # (the estimate, accuracy) of each candidate
    if len(computed) > 1 and len(whole) > 2:
        ranks = combined({n: [r.metrics[n] for r in whole] for n in computed})
        estimate = [(float(e), r.metrics["accuracy"]) for e, r in zip(ranks, whole, strict=True)]
    rows: list[str] = []
    for name in [*PROXIES, "estimate", "flops", "params"]:
        if name == "estimate":
            pairs = estimate
        else:
            pairs = [(r.metrics[name], r.metrics["accuracy"]) for r in done if name in r.metrics]
        if len(pairs) < 3 or (name in ("flops", "params") and not rows):
            continue
        scores, accuracies = zip(*pairs, strict=True)
        rho, tau = stats.spearmanr(scores, accuracies)[0], stats.kendalltau(scores, accuracies)[0]
        rows.append(
            f"<tr><td>{len(pairs)}</td><td>{html.escape(name)}</td>"
            + "".join(f"<td>{'–' if v != v else f'{v:.3f}'}</td>" for v in (rho, tau))
            + "</tr>"
        )
    if not rows:
        return ""
    seconds = [r.metrics["proxy_seconds"] for r in done if "proxy_seconds" in r.metrics]
    return (
        "<h2>Zero-cost proxies</h2><p>Each candidate scored at its initialization on one "
        f"batch of training images ({sum(seconds) / max(len(seconds), 1):.2f} s a candidate), "
        "ranked against its validation accuracy (trained, or on the supernet; the estimate: "
        "the proxies' log ranks summed, AZ-NAS's aggregation; FLOPs and parameters beside "
        "them, for scale).</p><table><tr><th>candidates</th><th>estimator</th>"
        f"<th>Spearman ρ</th><th>Kendall τ</th></tr>{''.join(rows)}</table>"
    )


def write_report(study: Study, path: str | Path) -> Path:
    """Write the study's summary, Pareto plot and tables to one HTML file."""
    records = study.records(variants=False)
    points = [r for r in study.records() if r.state == "complete"]
    done = sorted(
        (r for r in records if r.state == "complete"), key=lambda r: -r.metrics["accuracy"]
    )
    failed = [r for r in study.records() if r.state == "failed"]
    figures = _figures(study, points)
    failures = "".join(
        f"<li>trial {r.trial} ({html.escape(r.variant)}): {html.escape(r.description)}: "
        f"{html.escape(r.reason)}</li>"
        for r in failed
    )
    body = f"""
<h1>autosearch study {html.escape(study.name)}</h1>
<p>Space <b>{html.escape(study.space.name)}</b>,
controller <b>{html.escape(study.controller.name)}</b>,
objectives {html.escape(", ".join(study.definition.objectives))}, reward
<code>{html.escape(str(study.definition.reward))}</code>, variants
{html.escape(", ".join(v.name for v in study.definition.variants))};
{len(done)} complete trials ({len(points)} measured points with their variants),
{len(failed)} failures, {len(records)} trials in all. Figures marked estimated (open
markers in the plots) are the search's shortcuts: int8 accuracy by fake quantization,
latency from the lookup table; the front's points are measured for real.
Storage: <code>{html.escape(study.storage_url)}</code>.</p>
{_costs(study, records)}
{figures}
<h2>Pareto front over every (architecture, variant)</h2>{_table(study.pareto())}
<h2>Top architectures (by validation accuracy)</h2>{_table(done[:10])}
{_confirmations(study)}
{_populations(study, done)}
{_proxies(done)}
{f"<h2>Failures</h2><ul>{failures}</ul>" if failed else ""}
{_unreadable(study)}
{_cleaning(study)}
<p class="note">Candidates are ranked on the validation split; test accuracy is held out and
shown for reference only. {html.escape(CONVENTIONS)}</p>
"""
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.touch()
    except OSError as exc:
        raise ExportError(
            f"cannot write the report to {out}: {exc.strerror or exc}; choose a writable path "
            "with --out"
        ) from None
    out.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>autosearch: "
        f"{html.escape(study.name)}</title><style>{_STYLE}</style></head><body>{body}</body></html>"
    )
    return out
