"""Latency without a stopwatch per candidate: a lookup table of measured layers.

As Once-for-All and HW-NAS-Bench do, a network's latency is predicted as the sum of its
parts' latencies, each measured once per device and kept in a table. The parts are
found by running the network once, at the batch size asked for, under a tracer:

* each **leaf module** call (a convolution, a batch norm, an activation, a linear
  layer, ...) is one part, keyed by its class, its configuration (``extra_repr``), its
  parameters' shapes and its input and output shapes;
* each **operation outside leaf modules** (a residual addition, a concatenation, a
  functional ReLU or pooling in a block's ``forward``) is one part, keyed by the aten
  operation and its arguments (tensors by shape and dtype);
* each call of a **container module** costs the host's measured call overhead
  (``module_call``), the Python a network spends between its kernels.

A part missing from the table is measured on the spot, with the same module or
operation and the same arguments as in the traced network, on one CPU thread, and
added to the table: the table of this machine fills as a search meets new layers, and
is kept on disk (``$AUTOSEARCH_CACHE/latency/``, or ``$AUTOSEARCH_LATENCY_TABLES``) by
device and torch version. Measure it with the machine otherwise idle: a part timed
while something else ran stays slow in the table (delete the file to measure again). A table
measured on another device (``autosearch latency-table STUDY_FILE --out FILE``, run
there) is read from
its file and never filled here: a layer it lacks is an error naming the layer.

The file format (JSON, ``format`` ``autosearch-latency/1``)::

    {"format": "autosearch-latency/1",
     "device": "cpu:Intel(R) Xeon(R) Processor",  # what measured it
     "torch": "2.9.1", "threads": 1,
     "entries": {"<part key>": <milliseconds per call>, ..., "module_call": <ms>}}
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import logging
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from autosearch._compat import TorchDispatchMode, tree_flatten
from autosearch._files import NotReadable, read_json
from autosearch.errors import AutosearchError
from autosearch.scoring.cost import check_threads, cpu_threads, seconds_per_call

__all__ = [
    "FORMAT",
    "LatencyTable",
    "LatencyTableError",
    "Part",
    "host_device",
    "host_table",
    "latency_table",
    "parts",
    "read",
]

logger = logging.getLogger(__name__)

FORMAT = "autosearch-latency/1"
MODULE_CALL = "module_call"
_THREADS = 1
# A module with at most this many leaf modules under it is timed whole (a block).
MAX_UNIT_LEAVES = 16
_WARMUP, _REPLAYS = 2, 9  # replays of a network whose parts are measured


class LatencyTableError(AutosearchError):
    """A latency table that cannot be read or used: its file, device, torch version or
    format differs from what is needed, or it lacks a layer a network uses."""


def host_device() -> str:
    """This machine's CPU, as tables name their device: ``cpu:<model name>``."""
    name = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE)
        name = found.group(1).strip() if found else ""
    return f"cpu:{name or platform.processor() or platform.machine() or 'unknown'}"


_no_grad = torch.no_grad


def _torch_version() -> str:
    return torch.__version__.split("+")[0]


# Tracing ------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Part:
    """One timed piece of a traced network: its table key and how to run it again
    (the module or operation with the arguments it was called with)."""

    key: str
    run: Callable[[], object]


def _shape(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return value


def _signature(values: object) -> str:
    flat, _ = tree_flatten(values)
    return ",".join(str(_shape(v)) for v in flat)


def _module_key(module: nn.Module, inputs: tuple, output: object) -> str:
    """A module part's key: its class, then (a leaf) its configuration and weights'
    shapes, or (a block of leaves) a digest of its whole structure, then its input and
    output shapes."""
    if next(module.children(), None) is None:
        weights = ",".join(f"{list(p.shape)}" for p in module.parameters(recurse=False))
        inner = f"({module.extra_repr()})[{weights}]"
    else:
        shapes = ",".join(f"{list(p.shape)}" for p in module.parameters())
        structure = f"{module!r}|{shapes}".encode()
        inner = "#" + hashlib.sha256(structure).hexdigest()[:16]
    return f"{type(module).__name__}{inner}|in={_signature(inputs)}|out={_signature(output)}"


class _Tracer(TorchDispatchMode):
    """Collects the parts of one forward pass (see the module's docstring).

    The mode sees only the operations outside units: entering a unit (a module timed
    whole) takes the mode off torch's stack and leaving it puts it back, so the many
    operations inside units run at torch's own speed, not through Python."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.parts: list[Part] = []
        self.containers = 0
        self._unit: nn.Module | None = None
        self._leaves = _leaf_counts(model)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self._unit is None:
            key = f"{func}|{_signature((args, kwargs))}"
            self.parts.append(Part(key=key, run=lambda f=func, a=args, k=kwargs: f(*a, **k)))
        return out

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """The mode on torch's stack for the forward pass, and the module hooks that
        find its parts; all taken off after, however the pass ends."""
        pre = nn.modules.module.register_module_forward_pre_hook(self.before)
        post = nn.modules.module.register_module_forward_hook(self.after)
        self.__enter__()
        try:
            yield
        finally:
            pre.remove()
            post.remove()
            if self._unit is None:  # else a unit raised: the mode is off the stack already
                self.__exit__(None, None, None)
            self._unit = None

    def before(self, module: nn.Module, inputs: tuple) -> None:
        if self._unit is not None:
            return
        if self._leaves.get(id(module), 1) <= MAX_UNIT_LEAVES:
            self._unit = module
            self.__exit__(None, None, None)  # the unit's own operations are not parts
        else:
            self.containers += 1

    def after(self, module: nn.Module, inputs: tuple, output: object) -> None:
        if self._unit is module:
            self._unit = None
            self.__enter__()
            self.parts.append(
                Part(
                    key=_module_key(module, inputs, output), run=functools.partial(module, *inputs)
                )
            )


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters(), torch.empty(0)).device


def _leaf_counts(model: nn.Module) -> dict[int, int]:
    """Leaf modules under each module of ``model`` (a leaf counts itself)."""
    counts: dict[int, int] = {}

    def count(module: nn.Module) -> int:
        children = list(module.children())
        counts[id(module)] = sum(count(c) for c in children) if children else 1
        return counts[id(module)]

    count(model)
    return counts


def parts(
    model: nn.Module, input_shape: Sequence[int], *, batch: int = 1
) -> tuple[list[Part], int]:
    """The parts of one inference forward pass of ``batch`` images (on the model's
    device, in eval mode; the model's mode is restored), and how many container modules
    were called. A part's key holds shapes and dtypes, not the device."""
    tracer = _Tracer(model)
    was_training = model.training
    model.eval()
    # Random images from a generator of its own: tracing leaves torch's global stream as it was.
    x = torch.randn(batch, *input_shape, generator=torch.Generator().manual_seed(0))
    x = x.to(_device(model))
    try:
        with torch.no_grad(), tracer.tracing():
            model(x)
    finally:
        model.train(was_training)
    return tracer.parts, tracer.containers


# Timing ---------------------------------------------------------------------------------
def _time_ms(run: Callable[[], object], *, min_seconds: float = 0.002, repeats: int = 5) -> float:
    """Median milliseconds per call (:func:`autosearch.scoring.cost.seconds_per_call`)."""
    samples = seconds_per_call(run, warmup=2, repeats=repeats, min_seconds=min_seconds)
    return statistics.median(samples) * 1e3


class _Probe(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _module_call_ms() -> float:
    """What calling a module costs the host beyond its kernels (``nn.Module.__call__``
    and a forward that returns at once)."""
    probe, x = _Probe(), torch.zeros(1)
    return _time_ms(lambda: probe(x), min_seconds=0.01)


# The table --------------------------------------------------------------------------------
@dataclass(kw_only=True)
class LatencyTable:
    """Measured milliseconds per call of network parts on one device.

    A table of this machine (:func:`host_table`) measures and adds the parts it lacks;
    a table read from another device's file (``fill=False``) refuses them.
    """

    device: str
    torch: str
    threads: int = _THREADS
    entries: dict[str, float] = field(default_factory=dict)
    fill: bool = True
    path: Path | None = None
    _added: int = 0

    def __post_init__(self) -> None:
        try:
            check_threads(self.threads)  # it reaches torch's thread pool
        except ValueError as exc:
            raise LatencyTableError(f"the latency table of {self.device}: {exc}") from None

    @property
    def name(self) -> str:
        return f"{self.device} (torch {self.torch}, {self.threads} thread)"

    # Predicting ------------------------------------------------------------------------
    @_no_grad()  # (the class's field `torch` shadows the module for a type checker)
    def predict(self, model: nn.Module, input_shape: Sequence[int], *, batch: int = 1) -> float:
        """Predicted milliseconds per image of a forward pass of ``batch`` images on
        this table's device (the convention of :func:`autosearch.scoring.cost.latency`).
        A model on another device (a supernet's subnet on the GPU) is traced where it is,
        with no copy; where the table lacks a part it finds, a CPU copy is traced
        again and the parts are timed on the CPU."""
        was_training = model.training
        model.eval()  # the parts are replayed in inference mode too: no statistics move
        try:
            with cpu_threads(self.threads):
                found, containers = parts(model, input_shape, batch=batch)
                missing = self._missing(found)
                if missing and _device(model).type != "cpu":
                    found, containers = parts(copy.deepcopy(model).cpu(), input_shape, batch=batch)
                    missing = self._missing(found)
                if missing:
                    self._measure(found, missing)
                total = containers * self.entries[MODULE_CALL]
                total += sum(self.entries[p.key] for p in found)
        finally:
            model.train(was_training)
        if self._added:
            try:
                self.save()
            except LatencyTableError as exc:  # the table serves this process all the same
                logger.warning("%s; this machine's table is kept in memory only", exc)
        return total / batch

    def _missing(self, found: list[Part]) -> set[str]:
        """The keys of ``found`` (and the module call's) this table lacks."""
        missing = {p.key for p in found if p.key not in self.entries}
        if MODULE_CALL not in self.entries:
            missing.add(MODULE_CALL)
        return missing

    def _measure(self, found: list[Part], missing: set[str]) -> None:
        """Time the parts the table lacks where they run: the traced network's parts are
        replayed in order (the caches as the network leaves them for each part), and
        each missing part's median time over the replays is kept."""
        if not self.fill:
            key = sorted(missing)[0]
            raise LatencyTableError(
                f"the latency table of {self.name} lacks {len(missing)} part(s) this network "
                f"uses, e.g. {key!r}; measure the study's space on that device again "
                "(autosearch latency-table --help)"
            )
        if MODULE_CALL in missing:
            self.entries[MODULE_CALL] = _module_call_ms()
            missing.discard(MODULE_CALL)
        samples: dict[str, list[float]] = {key: [] for key in missing}
        clock = time.perf_counter
        for replay in range(_WARMUP + _REPLAYS):
            for part in found:
                start = clock()
                part.run()
                elapsed = clock() - start
                if replay >= _WARMUP and part.key in samples:
                    samples[part.key].append(elapsed)
        for key, times in samples.items():
            self.entries[key] = statistics.median(times) * 1e3
        self._added += len(samples) + 1

    # Files --------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "device": self.device,
            "torch": self.torch,
            "threads": self.threads,
            "entries": dict(sorted(self.entries.items())),
        }

    def save(self, path: str | os.PathLike[str] | None = None) -> None:
        """Write the table whole (a temporary file, then renamed), merged with what
        another process of this machine added to the same file meanwhile."""
        path = Path(path) if path is not None else self.path
        if path is None:
            return
        if path.exists() and path == self.path:
            try:
                theirs = read(path, fill=True)
                if (theirs.device, theirs.torch) == (self.device, self.torch):
                    self.entries = {**theirs.entries, **self.entries}
            except LatencyTableError:
                pass  # a damaged cache file is replaced
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.to_json(), indent=0))
            tmp.replace(path)
        except OSError as exc:
            raise LatencyTableError(
                f"cannot write latency table {path}: {exc.strerror or exc}"
            ) from None
        self._added = 0


def read(path: str | os.PathLike[str], *, fill: bool = False) -> LatencyTable:
    """A table from its file; refused in one line if it is not a regular file of this
    format whose every field is what it should be (see :data:`_FIELDS`)."""
    path = Path(path)
    try:
        stored = read_json(path, limit=_MAX_BYTES)
    except NotReadable as exc:
        raise LatencyTableError(f"latency table {exc}") from None
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        got = stored.get("format") if isinstance(stored, dict) else type(stored).__name__
        raise LatencyTableError(
            f"{path} is not a latency table of format {FORMAT!r} (format {_short(got)})"
        )
    fields: dict[str, Any] = {}
    for name, parse in _FIELDS.items():
        if name not in stored:
            raise LatencyTableError(f"latency table {path} is damaged: it has no {name!r}")
        try:
            fields[name] = parse(stored[name])
        except (TypeError, ValueError) as exc:
            shown = "" if name == "entries" else f" is {_short(stored[name])}"
            raise LatencyTableError(f"latency table {path}: its {name}{shown}: {exc}") from None
    table = LatencyTable(**fields, fill=fill, path=path)
    if table.torch != _torch_version():
        raise LatencyTableError(
            f"latency table {path} was measured with torch {table.torch}, this is torch "
            f"{_torch_version()}: kernels differ between versions; measure it again with this one"
        )
    return table


# Reading a table's fields: each value of a file is parsed before it is used ------------
_MAX_BYTES = 64 << 20
# A part's time above this (ms, ~17 minutes a call) is not a measurement: a sum of such
# times overflows, and a latency nobody could wait for says nothing.
MAX_MS = 1e6


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _text(value: object, *, most: int = 200) -> str:
    if not isinstance(value, str) or not value or len(value) > most or not value.isprintable():
        raise ValueError(f"expected a printable text of 1 to {most} characters")
    return value


def _entries(value: object) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError("expected an object of part keys to milliseconds")
    entries = {}
    for key, ms in value.items():
        if isinstance(ms, bool) or not isinstance(ms, int | float) or not 0 <= ms <= MAX_MS:
            raise ValueError(
                f"it holds negative or non-finite times, or times over {MAX_MS:g} ms (part "
                f"{_short(key)}: {_short(ms)}); measure the table again (autosearch "
                "latency-table --help)"
            )
        entries[str(key)] = float(ms)
    return entries


_FIELDS: dict[str, Callable[[Any], Any]] = {
    "device": _text,
    "torch": lambda v: _text(v, most=40),
    "threads": check_threads,
    "entries": _entries,
}


def _cache_file(device: str, torch_version: str) -> Path:
    """Where this machine's table is kept: ``$AUTOSEARCH_LATENCY_TABLES``, else
    ``$AUTOSEARCH_CACHE/latency`` (``~/.cache/autosearch/latency``)."""
    from autosearch.data._cache import cache_dir

    folder = os.environ.get("AUTOSEARCH_LATENCY_TABLES") or cache_dir() / "latency"
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{device}-torch{torch_version}").strip("-")
    return Path(folder) / f"{slug[:180]}.json"


def host_table() -> LatencyTable:
    """This machine's table, from the disk cache (empty on first use: it fills as
    networks are predicted, and is saved after each)."""
    device, version = host_device(), _torch_version()
    path = _cache_file(device, version)
    if path.exists():
        try:
            table = read(path, fill=True)
            if table.device == device and table.threads == _THREADS:
                return table
        except LatencyTableError as exc:
            logger.warning("%s; measuring this machine's latency table again", exc)
    return LatencyTable(device=device, torch=version, path=path)


_OPEN: dict[str, LatencyTable] = {}


def latency_table(path: str | os.PathLike[str] | None = None) -> LatencyTable:
    """The table a process predicts with, read once: this machine's (``path`` None),
    or the one measured on another device in file ``path``."""
    key = str(_cache_file(host_device(), _torch_version())) if path is None else f"file:{path}"
    if key not in _OPEN:
        _OPEN[key] = host_table() if path is None else read(path)
    return _OPEN[key]
