"""What a study's records say: the Pareto front over every (architecture, variant)
point, and the most accurate point within a budget. Pure functions over records."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from autosearch.errors import ConfigError, StudyError
from autosearch.scoring import objective, pareto_mask
from autosearch.study.records import Record

__all__ = ["best", "front", "on_front", "table"]

# The columns that say which point a row is, before its genes and figures.
_ROW_COLUMNS = ("trial", "variant", "state", "kind", "confirms", "arch_id", "description")


def front(points: Sequence[Record], objectives: Sequence[str]) -> list[Record]:
    """The complete records no other complete record dominates on ``objectives``,
    ordered by the second objective (then trial)."""
    done = [r for r in points if r.state == "complete"]
    if not done:
        return []
    values = np.array([[r.metrics[o] for o in objectives] for r in done])
    mask = pareto_mask(values, [objective(o).direction for o in objectives])
    key = objectives[1] if len(objectives) > 1 else objectives[0]
    kept = [r for r, keep in zip(done, mask, strict=True) if keep]
    return sorted(kept, key=lambda r: (r.metrics[key], r.trial))


def best(
    points: Sequence[Record],
    *,
    max_flops: float | None,
    max_params: float | None,
    study: str,
    variant: str | None = None,
    prefer: Callable[[Record], bool] | None = None,
) -> Record:
    """The most accurate (validation) of the complete records of ``points`` (of
    ``variant`` only, if given) within the budget; ties go to fewer FLOPs. The error
    says what is closest when nothing fits. ``prefer``: choose among the records it
    accepts first (a supernet study's confirmed subnets), among all if none fits."""
    if prefer is not None:
        preferred = [r for r in points if prefer(r)]
        try:
            return best(
                preferred, max_flops=max_flops, max_params=max_params, study=study, variant=variant
            )
        except StudyError:
            pass
    done = [
        r for r in points if r.state == "complete" and (variant is None or r.variant == variant)
    ]
    if variant is not None and not done:
        measured = sorted({r.variant for r in points if r.state == "complete"})
        raise StudyError(
            f"study {study!r} has no complete {variant!r} record; measured variants: "
            f"{', '.join(measured) or 'none'}"
        )
    fits = [
        r
        for r in done
        if (max_flops is None or r.metrics["flops"] <= max_flops)
        and (max_params is None or r.metrics.get("params", math.inf) <= max_params)
    ]
    if fits:
        return max(fits, key=lambda r: (r.metrics["accuracy"], -r.metrics["flops"]))
    if not done:
        raise StudyError(
            f"study {study!r} has no complete trial yet; run trials first "
            "(study.optimize(n), or autosearch run FILE --n-trials N)"
        )
    smallest = min(done, key=lambda r: r.metrics["flops"])
    raise StudyError(
        f"no complete trial of {study!r} fits max_flops={max_flops}, "
        f"max_params={max_params}; the smallest has {smallest.metrics['flops']:.3g} "
        f"FLOPs and {smallest.metrics.get('params', math.nan):.3g} params (trial "
        f"{smallest.trial})"
    )


def on_front(done: Sequence[Record], metrics: Mapping[str, float]) -> bool:
    """Whether a candidate's base point (``metrics``) is on the accuracy-FLOPs front of
    the complete base records ``done``."""
    others = [
        (r.metrics["accuracy"], r.metrics["flops"])
        for r in done
        if r.state == "complete" and r.is_base and "flops" in r.metrics
    ]
    points = np.array([(metrics["accuracy"], metrics["flops"]), *others])
    return bool(pareto_mask(points, ["maximize", "minimize"])[0])


def table(records: Sequence[Record], *, multi_index: bool = False) -> Any:
    """The records as a pandas DataFrame, one row per (trial, variant): which point it is
    (``trial``, ``variant``, ``state``, ``kind``, ``confirms``, ``arch_id``,
    ``description``), a ``params_GENE`` column per gene and a ``metrics_NAME`` column per
    figure (as Optuna's ``trials_dataframe`` names ``params_*`` and ``user_attrs_*``; with
    ``multi_index``, the pairs ``("params", GENE)`` and ``("metrics", NAME)``), and the
    ``reason`` of a failure. A gene or figure a row does not have is NaN (None for genes
    that are names)."""
    try:
        import pandas as pd
    except ImportError:
        raise ConfigError(
            "records as a table need pandas: pip install pandas (or use study.records())"
        ) from None
    genes = sorted({g for r in records for g in r.arch})
    figures = sorted({m for r in records for m in r.metrics}, key=_figure_order)
    rows = []
    for r in records:
        row: dict[Any, Any] = {
            "trial": r.trial,
            "variant": r.variant,
            "state": r.state,
            "kind": r.kind,
            "confirms": r.confirms,
            "arch_id": r.arch.arch_id,
            "description": r.description,
        }
        row.update({("params", g): r.arch.get(g) for g in genes})
        row.update({("metrics", m): r.metrics.get(m, math.nan) for m in figures})
        row["reason"] = r.reason
        rows.append(row)
    columns: list[Any] = [*_ROW_COLUMNS, *(("params", g) for g in genes)]
    columns += [*(("metrics", m) for m in figures), "reason"]
    frame = pd.DataFrame(rows, columns=columns)
    if multi_index:
        frame.columns = pd.MultiIndex.from_tuples(
            [c if isinstance(c, tuple) else (c, "") for c in columns]
        )
    else:
        frame.columns = [c if isinstance(c, str) else f"{c[0]}_{c[1]}" for c in columns]
    return frame


def _figure_order(name: str) -> tuple[int, str]:
    """The figures users look at first (the objectives' usual ones), then the rest by name."""
    first = ("accuracy", "test_accuracy", "flops", "params", "latency", "reward")
    return (first.index(name), "") if name in first else (len(first), name)
