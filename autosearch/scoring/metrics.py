"""The metric vocabulary: every number a trial records, said once.

Scoring (objective directions), plots (axis titles), the report and CLI tables
(column headers and formats) and export READMEs all read this table, so a metric is
named, scaled and explained the same way everywhere. Cost conventions: FLOPs = 2 × MACs
of conv/linear layers for one image (see autosearch.scoring.cost).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from autosearch.errors import ConfigError, UnknownNameError
from autosearch.scoring.pareto import Direction

__all__ = ["METRICS", "Metric", "declare", "declared", "metric", "objective_names"]


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One recorded number.

    Attributes:
        name: The key in a record's ``metrics``.
        title: What it is, in words (axis titles, export READMEs).
        header: Short column header of tables, in the shown unit.
        scale: Shown value = value / scale (FLOPs in millions: ``MFLOPs``).
        format: Format spec of the shown value.
        direction: Which way is better (None: neither; a count or a setting).
        objective: Whether a study may optimise it.
        log: Drawn on a log axis (costs spanning decades).
        description: One line for ``--help`` and docs.
        bounds: The values it can take (a stored value outside is damaged).
    """

    name: str
    title: str
    header: str
    scale: float = 1.0
    format: str = ".4g"
    direction: Direction | None = None
    objective: bool = False
    log: bool = False
    description: str = ""
    bounds: tuple[float, float] = (-math.inf, math.inf)

    def parse(self, value: object) -> float:
        """``value`` as this metric: a finite number within :attr:`bounds`.

        Raises:
            ValueError: saying what it holds and what it may.
        """
        low, high = self.bounds
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{self.name} is {_short(value)}, not a number")
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError(f"{self.name} is {value!r}, outside [{low:g}, {high:g}]")
        return float(value)

    def cell(self, metrics: Mapping[str, float]) -> str:
        """This metric of ``metrics`` as a table cell ("–" when not measured)."""
        value = metrics.get(self.name)
        if value is None or not math.isfinite(value):
            return "–"
        return f"{value / self.scale:{self.format}}"

    @property
    def axis_title(self) -> str:
        return f"{self.title} (log scale)" if self.log else self.title


# No network costs more than this per image (a stored cost beyond is damaged); a latency
# beyond a thousand seconds an image is no measurement either.
_MOST_COST, _MOST_MS = 1e24, 1e6


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _cost(name: str, title: str, header: str, scale: float, fmt: str, description: str) -> Metric:
    return Metric(
        name=name,
        title=title,
        header=header,
        scale=scale,
        format=fmt,
        direction="minimize",
        objective=True,
        log=True,
        description=description,
        bounds=(0.0, _MOST_MS if name.startswith("latency") else _MOST_COST),
    )


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            name="accuracy",
            title="validation accuracy",
            header="val acc",
            format=".4f",
            direction="maximize",
            objective=True,
            description="validation top-1 accuracy (fraction); the search signal",
            bounds=(0.0, 1.0),
        ),
        Metric(
            name="test_accuracy",
            title="test accuracy (held out of the search)",
            header="test acc",
            format=".4f",
            direction="maximize",
            description="test top-1 accuracy (fraction); reported, never searched on",
            bounds=(0.0, 1.0),
        ),
        _cost(
            "flops",
            "FLOPs per image (2 × MACs)",
            "MFLOPs",
            1e6,
            ".3f",
            "FLOPs per image = 2 x MACs of conv/linear layers",
        ),
        _cost(
            "macs",
            "MACs per image",
            "MMACs",
            1e6,
            ".3f",
            "multiply-accumulates per image of conv/linear layers",
        ),
        _cost(
            "sparse_macs",
            "sparse-effective MACs per image",
            "sparse MMACs",
            1e6,
            ".3f",
            "MACs x weight density of each conv/linear layer",
        ),
        _cost("params", "parameters", "k params", 1e3, ".1f", "number of parameters"),
        _cost(
            "bops",
            "bit-operations (MACs × weight bits × activation bits)",
            "GBOPs",
            1e9,
            ".3f",
            "bit-operations = MACs x weight bits x activation bits",
        ),
        _cost("bytes", "saved weights, bytes", "kB", 1e3, ".1f", "size of the saved weights"),
        _cost(
            "latency",
            "latency, ms per image (batch 1, one CPU thread)",
            "latency ms",
            1.0,
            ".3f",
            "median ms per image, batch 1, one CPU thread (measured)",
        ),
        _cost(
            "latency_batched",
            "ms per image (batch 32, one CPU thread)",
            "ms/img (b32)",
            1.0,
            ".4f",
            "median ms per image in batches of 32, one CPU thread (measured)",
        ),
        _cost(
            "energy",
            "energy per image, millijoules",
            "mJ",
            1.0,
            ".3f",
            "energy per image in millijoules (from a benchmark table)",
        ),
        _cost(
            "train_seconds",
            "training time, seconds",
            "train s",
            1.0,
            ".1f",
            "training time in seconds (measured, or from a benchmark table)",
        ),
        Metric(
            name="reward",
            title="reward (the scalar single-objective controllers maximise)",
            header="reward",
            format=".4f",
            direction="maximize",
            description="the study's reward of this point",
        ),
        Metric(
            name="finetune_seconds",
            title="seconds deriving the variant",
            header="derive s",
            format=".1f",
            description="time to derive (and fine-tune) a variant",
        ),
        Metric(
            name="world_size",
            title="training processes (DDP)",
            header="procs",
            format=".0f",
            description="processes that trained the candidate",
        ),
        Metric(
            name="stopped_at_epoch",
            title="stopped early after epoch",
            header="stopped at",
            format=".0f",
            description="the epoch after which early stopping ended it",
        ),
        *(
            Metric(
                name=name,
                title=f"{title} (zero-cost proxy, at initialization)",
                header=name,
                format=".4g",
                direction="maximize",
                description=f"{title} of the untrained network on one batch "
                "(autosearch.evaluation.proxies)",
            )
            for name, title in (
                ("synflow", "synaptic flow"),
                ("naswot", "NASWOT activation-pattern score"),
                ("jacob_cov", "Jacobian covariance score"),
                ("snip", "SNIP connection sensitivity"),
                ("grad_norm", "gradient norm"),
                ("expressivity", "AZ-NAS expressivity"),
                ("progressivity", "AZ-NAS progressivity"),
                ("trainability", "AZ-NAS trainability"),
                ("complexity", "AZ-NAS complexity (multiply-accumulates)"),
                ("meco", "MeCo least correlation eigenvalue"),
            )
        ),
        Metric(
            name="proxy_seconds",
            title="seconds computing the zero-cost proxies",
            header="proxies s",
            format=".2f",
            description="time to compute the candidate's zero-cost proxies",
            bounds=(0.0, math.inf),
        ),
    )
}


def metric(name: str) -> Metric:
    """The metric called ``name`` (UnknownNameError with suggestions otherwise)."""
    try:
        return METRICS[name]
    except KeyError:
        raise UnknownNameError("metric", name, METRICS) from None


def objective_names() -> list[str]:
    return sorted(name for name, m in METRICS.items() if m.objective)


_DECLARED: dict[str, Metric] = {}  # this process's user-declared metrics


def declare(name: str, direction: str) -> Metric:
    """A figure of a user's evaluator made an objective a study may optimise: ``name``
    with its ``direction`` (``"maximize"`` or ``"minimize"``), known to this process's
    vocabulary from now on. Declaring the same again is a no-op.

    Raises:
        ConfigError: a name autosearch measures itself, one declared with the other
            direction, or a direction that is neither.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"a declared metric's name must be an identifier, got {name!r}")
    if direction not in ("maximize", "minimize"):
        raise ConfigError(
            f"metric {name!r}: direction must be 'maximize' or 'minimize', got {direction!r}"
        )
    known = METRICS.get(name)
    if known is not None and name not in _DECLARED:
        raise ConfigError(
            f"metric {name!r} is autosearch's own ({known.description or known.title}); "
            "declare figures of your own under other names"
        )
    if known is not None and known.direction != direction:
        raise ConfigError(
            f"metric {name!r} is declared to {known.direction} already in this process, "
            f"not to {direction}"
        )
    made = Metric(
        name=name,
        title=name.replace("_", " "),
        header=name[:12],
        direction=direction,  # type: ignore[arg-type]
        objective=True,
        description=f"declared by the study ({direction})",
    )
    METRICS[name] = _DECLARED[name] = made
    return made


def declared(names: Mapping[str, str] | None) -> dict[str, str]:
    """Declare each ``name: direction`` of ``names``; the mapping, checked."""
    if names is None:
        return {}
    if not isinstance(names, Mapping):
        raise ConfigError(
            f"metrics must map names to 'maximize' or 'minimize', got {type(names).__name__}"
        )
    for name, direction in names.items():
        declare(name, direction)
    return dict(names)
