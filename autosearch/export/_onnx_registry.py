"""The ONNX exporter's table of ATen-to-ONNX functions, built once a process.

``torch.onnx.export(..., dynamo=True)`` builds it at every call (onnxscript reading the
source of its ~500 functions): about a third of a small network's export, paid again by
every export in a process (a study's best and its variants, a notebook's exports).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["registry_built_once"]

_REGISTRIES: dict[tuple, Any] = {}  # by the arguments torch built each with
_REGISTRY_LOCK = threading.Lock()


@contextlib.contextmanager
def registry_built_once() -> Iterator[None]:
    """While held, torch's exporter gets the registry of an opset built before in this
    process: it changes a registry only for a custom translation table, which
    autosearch never passes. Where torch's exporter is not laid out as expected, the
    export goes on as torch's, building its own."""
    try:
        from torch.onnx._internal.exporter._registration import ONNXRegistry
    except ImportError:
        yield
        return
    build = ONNXRegistry.__dict__.get("from_torchlib")
    if not isinstance(build, classmethod):
        yield
        return

    def built_once(cls: type, *args: Any, **kwargs: Any) -> Any:  # torch's own defaults
        key = (args, tuple(sorted(kwargs.items())))
        if key not in _REGISTRIES:
            _REGISTRIES[key] = build.__func__(cls, *args, **kwargs)
        return _REGISTRIES[key]

    with _REGISTRY_LOCK:
        ONNXRegistry.from_torchlib = classmethod(built_once)  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            ONNXRegistry.from_torchlib = build  # type: ignore[method-assign,assignment]
