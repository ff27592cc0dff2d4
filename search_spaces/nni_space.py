"""NNI model spaces as autosearch search spaces.

    from nni.nas.hub.pytorch import NasBench201
    from search_spaces import from_nni

    space = from_nni(NasBench201)            # or from_nni(MySpace, width=2)
    study = autosearch.create_study("nb201-nni", controller=RegularizedEvolution(space, seed=0))

The space's genes are the NNI model space's mutables (``LayerChoice``, ``nni.choice``
values, ``Repeat`` depths), found by ``ModelSpace.simplify()``; ``build`` returns the NNI
model frozen at the architecture. NNI is an optional extra
(``pip install 'autosearch-nas[nni]'``), imported only when an NNI space is used.

A study stores the model space's registered name and its JSON keyword arguments. Opening
a stored study looks the name up in a registry that code filled: NNI's own hub spaces,
autosearch's example, and whatever :func:`register_nni_space` (or :func:`from_nni`, which
registers what it is given) was called with in this process. A stored name never makes
autosearch import a module or reach an attribute; the stored keyword arguments reach
only the registered model space's own constructor, checked against its parameters.
Code that opens a study of its own model space (a worker, ``autosearch status``)
registers it first, at module level beside the class, as it imports its own spaces.
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
from autosearch.errors import ConfigError, InvalidArchitectureError, suggest
from autosearch.registry import register_space
from autosearch.space import SIZE_LIMITS, Categorical, Domain, NetworkSpec, SearchSpace
from search_spaces import _nni_net

__all__ = ["NNISpace", "from_nni", "nni_available", "register_nni_space"]

_INSTALL = "NNI spaces need NNI 3: pip install 'autosearch-nas[nni]' (nni and pytorch-lightning)"


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

    ``model_space`` is an NNI ``ModelSpace`` class (or a module-level callable that
    returns one), an instance of one, a name given to :func:`register_nni_space`, or
    the import path of a class (``"package.module:Name"``), which this call (the
    caller's own code) imports. What it is given is registered, so that stored studies
    of it open in this process. The keyword arguments must be JSON values (they are
    stored with the study); the number of classes and input channels are filled in
    from the data when the factory takes them as ``num_classes`` / ``num_labels`` and
    ``in_channels``.
    """
    _require_nni()
    if not isinstance(model_space, type) and hasattr(model_space, "trace_kwargs"):  # an instance
        model_space, kwargs = model_space.trace_symbol, _init_kwargs(model_space, kwargs)
    if not (isinstance(model_space, str) or callable(model_space)):
        raise ConfigError(
            "from_nni takes an NNI ModelSpace class (from_nni(NasBench201)), an instance "
            f"(from_nni(NasBench201())), or its registered name; got {model_space!r}"
        )
    if isinstance(model_space, str):
        name = model_space
        if _lookup(name) is None:
            register_nni_space(_import_named(name), name=name)
    else:
        name = register_nni_space(model_space)
    try:
        json.dumps(kwargs)
    except TypeError as exc:
        raise ConfigError(f"from_nni keyword arguments must be JSON values: {exc}") from None
    return NNISpace(factory=name, kwargs=kwargs)


# The NNI model spaces a stored study may name: name -> class or factory. Code fills it;
# a stored study only reads it.
_FACTORIES: dict[str, Any] = {}
# Registered on the first lookup (they need NNI): NNI's own hub spaces, by
# "nni.nas.hub.pytorch:Name" and by their defining module's path, and autosearch's
# example. Fixed names in fixed modules.
_NNI_HUB = (
    "AmoebaNet",
    "AutoFormer",
    "DARTS",
    "ENAS",
    "MobileNetV3Space",
    "NASNet",
    "NasBench101",
    "NasBench201",
    "PNAS",
    "ProxylessNAS",
    "ShuffleNetSpace",
)
_EXAMPLES = ("SmallCNN",)
_known: list[bool] = []  # non-empty once the hub and the example are registered


def register_nni_space(factory: Any, *, name: str | None = None) -> str:
    """Make an NNI model space (a ``ModelSpace`` class, or a module-level callable that
    returns one) known to stored studies by ``name`` (default ``"module:QualName"``,
    what :func:`from_nni` stores); returns the name. Call it at module level beside the
    class, so that every process that imports the module (workers included) can open
    studies of it. A name registered to another factory is refused."""
    if not callable(factory):
        raise ConfigError(
            f"register_nni_space takes an NNI ModelSpace class or a factory returning one, "
            f"got {factory!r}"
        )
    path = _import_path(factory)
    name = path if name is None else name
    if not isinstance(name, str) or not name:
        raise ConfigError(f"an NNI model space's name must be a non-empty string, got {name!r}")
    existing = _lookup(name)
    if existing is not None and existing is not factory:
        raise ConfigError(f"NNI model space name {name!r} is already registered by {existing!r}")
    _FACTORIES[name] = factory
    _FACTORIES.setdefault(path, factory)
    return name


def _import_path(factory: Any) -> str:
    """Where an export's model file imports ``factory`` from: its own module and name."""
    module = getattr(factory, "__module__", None)
    name = getattr(factory, "__qualname__", None)
    if not module or not name or "<locals>" in name:
        raise ConfigError(
            f"from_nni takes an NNI ModelSpace class (from_nni(NasBench201)), an instance "
            f"(from_nni(NasBench201())), or an import path ('package.module:Name'), "
            f"defined at module level so stored studies can rebuild it; got {factory!r}"
        )
    return f"{module}:{name}"


def _import_named(path: str) -> Any:
    """The class at import path ``path``, imported because the caller's own code named it
    in ``from_nni`` (a name read from a study resolves only through the registry)."""
    import importlib

    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(
            f"from_nni({path!r}): an import path is 'package.module:Name'; or pass the class"
        )
    try:
        target: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"from_nni({path!r}): cannot import {module!r} ({exc})") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"from_nni({path!r}): module {module!r} has no {attr!r}")
        target = getattr(target, part)
    return target


def _lookup(name: str) -> Any:
    if name not in _FACTORIES and not _known and nni_available():
        _register_known()
    return _FACTORIES.get(name)


def _register_known() -> None:
    """Register NNI's hub spaces and autosearch's example (once)."""
    _known.append(True)
    import nni.nas.hub.pytorch as hub

    from search_spaces import nni_examples

    for module, prefix, names in (
        (hub, "nni.nas.hub.pytorch", _NNI_HUB),
        (nni_examples, "search_spaces.nni_examples", _EXAMPLES),
    ):
        for attr in names:
            factory = getattr(module, attr, None)
            if factory is not None:
                _FACTORIES.setdefault(f"{prefix}:{attr}", factory)
                _FACTORIES.setdefault(_import_path(factory), factory)


def _factory(name: str) -> Any:
    """The registered model space a (stored) name stands for; never anything else."""
    found = _lookup(name)
    if found is None:
        close = suggest(name, _FACTORIES)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise ConfigError(
            f"NNI model space {name!r} is not registered{hint}: a stored study names code "
            "only through registries, and autosearch never imports or calls anything else "
            "it names. Register it in the code that opens the study: "
            "search_spaces.register_nni_space(MySpace)"
        )
    return found


def _kwargs(factory: Any, kwargs: Mapping[str, Any], channels: int, classes: int) -> dict:
    """The model space's keyword arguments (channels and classes filled in), refused in
    one line where the factory names its parameters and lacks one of them."""
    filled = _nni_net.space_kwargs(factory, kwargs, channels, classes)
    params = _nni_net._parameters(factory)
    takes_any = params is None or any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [] if takes_any else sorted(set(filled) - set(params or {}) - {"self"})
    if unknown:
        raise ConfigError(
            f"NNI model space {_import_path(factory)} takes no argument "
            f"{', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(n for n in params or {} if n != 'self') or 'none'}"
        )
    return filled


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
    """An NNI 3 model space (see the module docstring). ``factory`` is its registered
    name (:func:`register_nni_space`), ``kwargs`` its JSON keyword arguments."""

    network_needs: ClassVar[tuple[str, ...]] = ("nni", "json", "inspect", "importlib")

    factory: str = "search_spaces.nni_examples:SmallCNN"
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.factory, str) or not isinstance(self.kwargs, Mapping):
            raise ConfigError(
                f"NNISpace takes factory= a registered model space's name and kwargs= a "
                f"mapping, got factory={self.factory!r}, kwargs={self.kwargs!r}"
            )
        if not all(isinstance(k, str) for k in self.kwargs):
            raise ConfigError(f"NNISpace kwargs must be named by strings, got {self.kwargs!r}")
        object.__setattr__(self, "kwargs", dict(self.kwargs))
        # The model space is built with these as given: a size no machine holds (a
        # stored stem_out_channels=10**6) is refused here, not in an allocation.
        limit = SIZE_LIMITS["channels"]
        for name, value in self.kwargs.items():
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit:
                raise ConfigError(
                    f"NNISpace kwargs {name}={value!r}: sizes above {limit} are refused (the "
                    "model space is built with its keyword arguments as given)"
                )

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
        kwargs = _kwargs(factory, self.kwargs, channels, self.budget_classes)
        try:
            return _nni_net.model_space(_import_path(factory), json.dumps(kwargs, sort_keys=True))
        except (TypeError, ValueError) as exc:  # arguments its constructor refuses
            raise ConfigError(
                f"NNI model space {self.factory} cannot be made with {kwargs}: "
                f"{type(exc).__name__}: {exc}"
            ) from None

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
        kwargs = _kwargs(factory, self.kwargs, int(input_shape[0]), num_classes)
        return NetworkSpec(
            module="search_spaces._nni_net",
            factory="build",
            # Where the model file imports it from: the registered factory's own module.
            kwargs={"factory": _import_path(factory), "kwargs": kwargs, "sample": dict(arch)},
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
        name = self.factory.rpartition(":")[2] or self.factory
        genes = " ".join(f"{k}={v}" for k, v in arch.items())
        return f"nni {name} {genes}"

    def size(self) -> int:
        return math.prod(len(d.values()) for d in self._domains.values())
