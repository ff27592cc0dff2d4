"""NNI model spaces as autosearch search spaces.

    from nni.nas.hub.pytorch import NasBench201
    from search_spaces import from_nni

    space = from_nni(NasBench201)            # or from_nni("package.module:MySpace", width=2)
    study = autosearch.create_study("nb201-nni", controller=RegularizedEvolution(space, seed=0))

The space's genes are the NNI model space's mutables (``LayerChoice``, ``nni.choice``
values, ``Repeat`` depths), found by ``ModelSpace.simplify()``; ``build`` returns the NNI
model frozen at the architecture. Studies store the model space's import path and
keyword arguments, so a stored study rebuilds it. NNI is an optional extra
(``pip install 'autosearch[nni]'``), imported only when an NNI space is used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import torch

from autosearch.architecture import Architecture
from autosearch.errors import ConfigError, InvalidArchitectureError
from autosearch.registry import register_space, resolve_loaded
from autosearch.space import Categorical, Domain, NetworkSpec, SearchSpace
from search_spaces import _nni_net

__all__ = ["NNISpace", "from_nni", "nni_available"]

_INSTALL = "NNI spaces need NNI 3: pip install 'autosearch[nni]' (nni and pytorch-lightning)"


def nni_available() -> bool:
    try:
        import nni.nas.nn.pytorch  # noqa: F401
    except ImportError:
        return False
    return True


def _require_nni() -> None:
    try:
        import nni.nas.nn.pytorch  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{_INSTALL} ({exc})") from None


def from_nni(model_space: Any, **kwargs: Any) -> NNISpace:
    """An autosearch space of the NNI model space ``model_space`` built with ``kwargs``.

    ``model_space`` is an NNI ``ModelSpace`` class (or any importable callable that
    returns one), or its import path ``"package.module:Name"``. The keyword arguments
    must be JSON values (they are stored with the study); the number of classes and
    input channels are filled in from the data when the factory takes them as
    ``num_classes`` / ``num_labels`` and ``in_channels``.
    """
    _require_nni()
    if not isinstance(model_space, type) and hasattr(model_space, "trace_kwargs"):  # an instance
        model_space, kwargs = model_space.trace_symbol, _init_kwargs(model_space, kwargs)
    if isinstance(model_space, str):
        path = model_space
    else:
        module = getattr(model_space, "__module__", None)
        name = getattr(model_space, "__qualname__", None)
        if not module or not name or "<locals>" in name:
            raise ConfigError(
                f"from_nni takes an NNI ModelSpace class (from_nni(NasBench201)), an instance "
                f"(from_nni(NasBench201())), or an import path ('package.module:Name'), "
                f"defined at module level so stored studies can rebuild it; got {model_space!r}"
            )
        path = f"{module}:{name}"
    try:
        json.dumps(kwargs)
    except TypeError as exc:
        raise ConfigError(f"from_nni keyword arguments must be JSON values: {exc}") from None
    return NNISpace(factory=path, kwargs=kwargs)


def _factory(path: str) -> Any:
    """The stored model-space factory, resolved without importing a module the study
    names: NNI's own (its hub), ours, or one the caller's code has imported."""
    return resolve_loaded(
        path,
        what="NNI model space",
        trusted=("nni", "search_spaces"),
        how="Import the module that defines it before opening the study.",
    )


def _init_kwargs(instance: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments an NNI model space instance was made with (NNI traces
    them), positional ones named after the class's parameters, then ``extra``."""
    params = _nni_net._parameters(instance.trace_symbol)
    args = list(getattr(instance, "trace_args", ()) or ())
    if args and params is None:
        raise ConfigError(
            f"{type(instance).__name__}(...) was made with positional arguments autosearch "
            "cannot name; pass its class and keyword arguments: from_nni(Cls, name=value)"
        )
    names = [n for n in (params or {}) if n != "self"]
    return {**dict(zip(names, args, strict=False)), **instance.trace_kwargs, **extra}


@register_space("nni")
@dataclass(frozen=True, kw_only=True)
class NNISpace(SearchSpace):
    """An NNI 3 model space (see the module docstring). ``factory`` is its import
    path, ``kwargs`` its JSON keyword arguments."""

    network_needs: ClassVar[tuple[str, ...]] = ("nni", "json", "inspect", "importlib")

    factory: str = "search_spaces.nni_examples:SmallCNN"
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "kwargs", dict(self.kwargs))

    def __hash__(self) -> int:  # kwargs is a dict: hash its JSON form
        return hash((self.factory, json.dumps(self.kwargs, sort_keys=True), self.budget_input))

    @classmethod
    def unavailable(cls) -> str | None:
        return None if nni_available() else _INSTALL

    @classmethod
    def example(cls) -> NNISpace:
        return cls(factory="search_spaces.nni_examples:SmallCNN")

    @cached_property
    def _space(self) -> Any:
        """The NNI model space, at the budget's channels and classes."""
        _require_nni()
        factory = _factory(self.factory)
        channels, _, _ = self.budget_input
        kwargs = _nni_net.space_kwargs(factory, self.kwargs, channels, self.budget_classes)
        return _nni_net.model_space(self.factory, json.dumps(kwargs, sort_keys=True))

    @cached_property
    def _domains(self) -> dict[str, Domain]:
        from nni.mutable import Categorical as NNICategorical

        domains: dict[str, Domain] = {}
        for label, mutable in self._space.simplify().items():
            if not isinstance(mutable, NNICategorical):
                raise ConfigError(
                    f"NNI mutable {label!r} is a {type(mutable).__name__}; autosearch searches "
                    "categorical choices (LayerChoice, InputChoice, nni.choice, Repeat): "
                    "discretise it with nni.choice"
                )
            values = list(mutable.values)
            if not all(isinstance(v, int | float | str | bool) for v in values):
                raise ConfigError(
                    f"NNI mutable {label!r} chooses among {values!r}; autosearch genes must be "
                    "numbers, strings or booleans"
                )
            domains[label] = Categorical(tuple(values), default=mutable.default())
        return domains

    def domains(self) -> Mapping[str, Domain]:
        return self._domains

    def network(
        self, arch: Architecture, *, input_shape: Sequence[int], num_classes: int
    ) -> NetworkSpec:
        self.validate(arch)
        factory = _factory(self.factory)
        kwargs = _nni_net.space_kwargs(factory, self.kwargs, int(input_shape[0]), num_classes)
        return NetworkSpec(
            module="search_spaces._nni_net",
            factory="build",
            kwargs={"factory": self.factory, "kwargs": kwargs, "sample": dict(arch)},
        )

    def check_input(self, arch: Architecture, input_shape: Sequence[int]) -> None:
        """Run the frozen network once on one image of ``input_shape``."""
        spec = self.network(arch, input_shape=input_shape, num_classes=self.budget_classes)
        try:
            with torch.no_grad():
                spec.build().eval()(torch.zeros(1, *input_shape))
        except Exception as exc:
            params = _nni_net._parameters(_factory(self.factory)) or {}
            takes = any(name in params for name in _nni_net._CHANNEL_ARGS)
            why = (
                ""
                if takes
                else (
                    f" ({self.factory} takes no in_channels argument, so it is built for "
                    "3-channel images: give it RGB data, or use a space that takes in_channels)"
                )
            )
            raise InvalidArchitectureError(
                f"{self.describe(arch)} does not take images of shape {tuple(input_shape)}"
                f"{why}: {type(exc).__name__}: {exc}"
            ) from None

    def describe(self, arch: Architecture) -> str:
        name = self.factory.rpartition(":")[2]
        genes = " ".join(f"{k}={v}" for k, v in arch.items())
        return f"nni {name} {genes}"

    def size(self) -> int:
        return math.prod(len(d.values()) for d in self._domains.values())
