"""What a study's records say: the Pareto front over every (architecture, variant)
point, and the most accurate point within a budget. Pure functions over records."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from autosearch.errors import StudyError
from autosearch.scoring import objective, pareto_mask
from autosearch.study.records import Record

__all__ = ["best", "front", "on_front"]


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
