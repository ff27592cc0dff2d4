"""Name → class registries for search spaces and controllers.

Plugins register themselves when their package is imported; a lookup imports the
plugin package lazily, so the core never imports a plugin at import time. Names read
from a stored study resolve only here (and in the plugins' own registries: NNI model
spaces, Optuna samplers), never through a module path or attribute taken from data.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

from autosearch.controller import Controller
from autosearch.errors import ConfigError, UnknownNameError
from autosearch.space import SearchSpace

__all__ = [
    "Registry",
    "controllers",
    "register_controller",
    "register_space",
    "spaces",
]

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """A registry that refuses duplicates and suggests close names on a miss."""

    def __init__(self, kind: str, *, plugins: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._plugins = plugins
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(cls: T) -> T:
            existing = self._entries.get(name)
            if existing is not None and existing.__qualname__ != cls.__qualname__:
                raise ConfigError(f"{self.kind} name {name!r} is already registered by {existing}")
            cls.name = name  # type: ignore[attr-defined]
            self._entries[name] = cls
            return cls

        return decorator

    def get(self, name: str) -> T:
        if name not in self._entries:
            self._load_plugins()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self._entries) from None

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._entries)

    def _load_plugins(self) -> None:
        for package in self._plugins:
            importlib.import_module(package)


spaces: Registry[type[SearchSpace]] = Registry("search space", plugins=("search_spaces",))
controllers: Registry[type[Controller]] = Registry("controller", plugins=("controllers",))
register_space = spaces.register
register_controller = controllers.register
