"""Tabular evaluation: look architectures up in a benchmark table instead of training.

This is how controllers are compared at no compute cost (NAS-Bench-201 style). The
table is the user's: a CSV file, or JSON (an object keyed by architecture string, or
a list of rows), with a key column holding the space's string form of each
architecture (``NB201Space.to_string``), a validation-accuracy column, and optionally
a test-accuracy and a training-time column (the latter becomes the
``train_seconds`` metric, usable as a cost objective), and any further columns named
as metrics (a measured latency or energy per architecture: ``metrics={"latency":
"lat_ms"}``), so that a tabular study can be multi-objective on them.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autosearch._files import NotReadable, read_bounded, read_json
from autosearch.architecture import Architecture
from autosearch.errors import ConfigError, DataError, StudyError, TrialFailed, require
from autosearch.scoring.metrics import metric
from autosearch.space import SearchSpace

__all__ = ["Table"]


def _name(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and "\x00" not in value


def _shape(value: Any) -> bool:
    return (
        isinstance(value, tuple | list)
        and len(value) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 8192 for v in value)
    )


# (field, check, what is expected): a Table is checked when it is made (and so when a
# stored table study is read).
_CHECKS = (
    ("path", _name, "the path of a CSV or JSON file"),
    ("key", _name, "a column name"),
    ("accuracy", _name, "a column name"),
    ("test_accuracy", lambda v: v is None or _name(v), "a column name or None"),
    ("train_time", lambda v: v is None or _name(v), "a column name or None"),
    ("percent", lambda v: v is None or isinstance(v, bool), "True, False or None"),
    ("input_shape", _shape, "(channels, height, width), each from 1 to 8192"),
    (
        "num_classes",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 10**6,
        "a number of classes from 1 to 1000000",
    ),
)


@dataclass(frozen=True, kw_only=True)
class Table:
    """A benchmark table and how to read it.

    Attributes:
        path: CSV or JSON file.
        key: Column with the architecture string.
        accuracy: Validation-accuracy column (the search signal).
        test_accuracy: Test-accuracy column, reported only (read when present).
        train_time: Training-time column in seconds (read when present).
        percent: Whether accuracies are percentages; None decides from the values
            (any value above 1 means percent).
        metrics: Further columns, by the metric they hold (``{"latency": "lat_ms"}``):
            any metric autosearch knows (``autosearch.scoring.metrics.METRICS``: latency,
            energy, bytes...), in its unit; a table's value replaces a counted one.
        input_shape, num_classes: What FLOPs and parameters are counted at.
    """

    path: str
    key: str = "arch"
    accuracy: str = "val_accuracy"
    test_accuracy: str | None = "test_accuracy"
    train_time: str | None = "train_time"
    percent: bool | None = None
    metrics: Mapping[str, str] | tuple[tuple[str, str], ...] = ()
    input_shape: tuple[int, int, int] = (3, 32, 32)
    num_classes: int = 10

    def __post_init__(self) -> None:
        if isinstance(self.path, Path):
            object.__setattr__(self, "path", str(self.path))
        for name, ok, expected in _CHECKS:
            value = getattr(self, name)
            require(ok(value), f"Table {name}", value, expected)
        pairs = dict(self.metrics).items() if self.metrics else ()
        for name, column in pairs:
            metric(name)  # an unknown metric is refused with the known ones
            if name in ("accuracy", "test_accuracy", "train_seconds"):
                raise ConfigError(
                    f"Table metrics: {name!r} has its own field; name its column with "
                    "Table(accuracy=..., test_accuracy=..., train_time=...)"
                )
            if not isinstance(column, str) or not column:
                raise ConfigError(f"Table metrics: the column of {name!r} must be a name")
        # hashable (the table is read once per Table) and stored as JSON pairs
        object.__setattr__(self, "metrics", tuple(sorted((str(k), v) for k, v in pairs)))
        object.__setattr__(self, "input_shape", tuple(self.input_shape))

    def rows(self) -> Mapping[str, Mapping[str, float]]:
        """The table as {architecture string: {column: value}}, read once and checked."""
        return _load(self)

    def check_space(self, space: SearchSpace) -> None:
        if not callable(getattr(space, "to_string", None)):
            raise StudyError(
                f"tabular evaluation looks architectures up by their string form, and space "
                f"{space.name!r} has none (to_string); use a space that has one (NB201Space)"
            )

    def evaluate(self, space: SearchSpace, arch: Architecture) -> dict[str, float]:
        """The metrics of ``arch``: accuracies (fractions) and train_seconds from the
        table, FLOPs / MACs / params counted from the architecture."""
        key = space.to_string(arch)  # type: ignore[attr-defined]
        row = self.rows().get(key)
        if row is None:
            raise TrialFailed(
                f"architecture {key} is not in table {self.path} ({len(self.rows())} rows)"
            )
        cost = space.cost(arch, input_shape=self.input_shape, num_classes=self.num_classes)
        scale = _scale(self)
        metrics = {
            "accuracy": row[self.accuracy] / scale,
            "flops": float(cost.flops),
            "macs": float(cost.macs),
            "params": float(cost.params),
        }
        if self.test_accuracy and self.test_accuracy in row:
            metrics["test_accuracy"] = row[self.test_accuracy] / scale
        if self.train_time and self.train_time in row:
            metrics["train_seconds"] = row[self.train_time]
        for name, column in dict(self.metrics).items():
            metrics[name] = row[column]
        return metrics


_MAX_TABLE_BYTES = 1 << 30  # NAS-Bench-201's 15,625 rows are a few MB


def _read(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The table's rows, each with where it is in the file, as an error names it: a CSV
    file's line (its header is line 1), a JSON list's row (from 1), a JSON object's key."""
    try:
        if path.suffix.lower() != ".json":
            text = read_bounded(path, limit=_MAX_TABLE_BYTES).decode("utf-8-sig")
            rows = csv.DictReader(text.splitlines())
            return [(f"line {rows.line_num}", row) for row in rows]
        data = read_json(path, limit=_MAX_TABLE_BYTES)
    except NotReadable as exc:
        raise DataError(f"benchmark table {exc}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"benchmark table {path} is not UTF-8 text ({exc})") from None
    if isinstance(data, Mapping):
        return [
            (f"entry {k!r}", {"\0key": k, **v}) for k, v in data.items() if isinstance(v, Mapping)
        ]
    if isinstance(data, list):
        return [(f"row {i}", dict(r)) for i, r in enumerate(data, 1) if isinstance(r, Mapping)]
    raise DataError(f"benchmark table {path}: JSON must be an object or a list of rows")


class _Rows(dict[str, dict[str, float]]):
    """A read table's rows, with the highest value of its accuracy column."""

    top: float = 0.0


@functools.lru_cache(maxsize=8)
def _load(table: Table) -> _Rows:
    path = Path(table.path)
    placed = _read(path)
    raw = [row for _, row in placed]
    if not raw:
        raise DataError(f"benchmark table {path} has no rows")
    found = sorted(set(raw[0]) - {"\0key"})
    # Test accuracy and training time are optional: read when the table has them.
    optional = [c for c in (table.test_accuracy, table.train_time) if c and c in raw[0]]
    columns = [table.accuracy, *optional, *dict(table.metrics).values()]
    for column in [table.key, *columns] if "\0key" not in raw[0] else columns:
        if column not in raw[0]:
            raise DataError(
                f"benchmark table {path} has no column {column!r}; its columns are "
                f"{', '.join(found)}. Name the columns with Table(key=..., accuracy=..., "
                "metrics={...})"
            )
    rows = _Rows()
    for line, row in placed:
        key = str(row.get("\0key", row.get(table.key))).strip()
        if key in rows:
            raise DataError(f"benchmark table {path} lists {key} twice ({line})")
        try:
            values = {c: float(row[c]) for c in columns}
        except (TypeError, ValueError):
            raise DataError(
                f"benchmark table {path}, {line}: {', '.join(columns)} must be numbers, "
                f"got {[row.get(c) for c in columns]}"
            ) from None
        if not all(math.isfinite(v) for v in values.values()):
            raise DataError(f"benchmark table {path}, {line}: values must be finite")
        _check_ranges(table, values, f"benchmark table {path}, {line}")
        rows[key] = values
    rows.top = max(v[table.accuracy] for v in rows.values())
    return rows


def _check_ranges(table: Table, values: dict[str, float], where: str) -> None:
    """Each value within what its column can hold: accuracies from 0 to 1 (or percent,
    to 100), a training time of no fewer than 0 seconds, a metric within its bounds
    (autosearch.scoring.metrics)."""
    top = 1.0 if table.percent is False else 100.0
    accuracies = [c for c in (table.accuracy, table.test_accuracy) if c in values]
    for column in accuracies:
        if not 0.0 <= values[column] <= top:
            unit = "a fraction from 0 to 1" if top == 1.0 else "from 0 to 1, or percent to 100"
            raise DataError(f"{where}: {column} is {values[column]!r}; an accuracy is {unit}")
    if table.train_time in values and values[table.train_time] < 0:
        raise DataError(f"{where}: {table.train_time} is {values[table.train_time]!r}, below 0 s")
    for name, column in dict(table.metrics).items():
        try:
            metric(name).parse(values[column])
        except ValueError as exc:
            raise DataError(f"{where}: column {column!r}: {exc}") from None


def _scale(table: Table) -> float:
    """What the table's accuracies are divided by: 100 for percent, else 1 (decided
    from the values when the table is read, not at each evaluation)."""
    if table.percent is not None:
        return 100.0 if table.percent else 1.0
    return 100.0 if _load(table).top > 1.0 else 1.0
