"""Networks of an NNI model space, frozen at one sample (the model file of
:class:`search_spaces.nni_space.NNISpace`).

Unlike the other model files this one needs NNI: the network is whatever the NNI
model space builds. NNI is imported when a network is built, not before.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Mapping
from typing import Any

import torch.nn as nn

_CLASS_ARGS = ("num_classes", "num_labels", "n_classes")
_CHANNEL_ARGS = ("in_channels", "input_channels", "in_chans")


def import_factory(path: str) -> Any:
    """``"package.module:Name"`` → the object it names."""
    import importlib

    module, _, name = path.partition(":")
    target: Any = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def space_kwargs(factory: Any, kwargs: Mapping[str, Any], channels: int, classes: int) -> dict:
    """``kwargs`` with the input channels and classes filled in where the factory takes
    them under a usual name (and the caller did not set them)."""
    params = _parameters(factory)
    if params is None:
        return dict(kwargs)
    filled = dict(kwargs)
    for names, value in ((_CLASS_ARGS, classes), (_CHANNEL_ARGS, channels)):
        for name in names:
            if name in params and name not in filled:
                filled[name] = value
                break
    return filled


def _parameters(factory: Any) -> Mapping[str, inspect.Parameter] | None:
    """The factory's parameters. NNI wraps a ModelSpace's ``__init__`` in a closure
    without ``__wrapped__``; the original is found among the closure's cells."""
    wrappers: list[Any] = [getattr(factory, "__init__", None)] if inspect.isclass(factory) else []
    for _ in range(8):  # wrappers of wrappers, a few levels deep
        inner = [
            cell.cell_contents
            for fn in wrappers
            for cell in getattr(fn, "__closure__", None) or ()
            if inspect.isfunction(cell.cell_contents)
        ]
        for fn in inner:
            if fn.__name__ == "__init__":
                return inspect.signature(fn).parameters
        wrappers = inner
    try:
        return inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=8)
def model_space(factory: str, kwargs_json: str) -> Any:
    """The NNI model space, built once per (factory, kwargs)."""
    try:
        import nni.nas.nn.pytorch  # noqa: F401
    except ImportError:
        raise ImportError(
            "this network is an NNI 3 model space's, so it needs NNI: pip install nni "
            "pytorch-lightning"
        ) from None

    return import_factory(factory)(**json.loads(kwargs_json))


def build(factory: str, kwargs: dict[str, Any], sample: dict[str, Any]) -> nn.Module:
    """The network of the NNI model space ``factory(**kwargs)`` frozen at ``sample``."""
    space = model_space(factory, json.dumps(kwargs, sort_keys=True))
    return space.freeze(sample)
