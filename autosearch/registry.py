"""Name → class registries for search spaces and controllers.

Plugins register themselves when their package is imported; a lookup loads the
plugins lazily, so the core never imports a plugin at import time: the packages that
declare the ``autosearch.spaces`` / ``autosearch.controllers`` entry points (this
distribution's ``search_spaces`` and ``controllers``, and any installed third-party
package), each entry point a module that registers its classes when imported, or a
class registered under the entry point's name. Names read from a stored study resolve
only here (and in the plugins' own registries: NNI model spaces, Optuna samplers), never
through a module path or attribute taken from data: what is imported is what is
installed.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
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

    def __init__(self, kind: str, *, group: str) -> None:
        self.kind = kind
        self.group = group  # the entry-point group plugins declare
        self._entries: dict[str, T] = {}
        self._loaded = False

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
        """Load every installed plugin of the group, once a process: importing a module
        registers what it defines; a class named by an entry point is registered under
        the entry point's name. A plugin that fails to load is refused in one line."""
        if self._loaded:
            return
        for point in sorted(entry_points(group=self.group), key=lambda p: p.name):
            try:
                found = point.load()
            except Exception as exc:
                raise ConfigError(
                    f"the {self.kind} plugin {point.name!r} ({point.value}) cannot be loaded: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            if isinstance(found, type) and point.name not in self._entries:
                self.register(point.name)(found)  # type: ignore[arg-type]
        self._loaded = True


spaces: Registry[type[SearchSpace]] = Registry("search space", group="autosearch.spaces")
controllers: Registry[type[Controller]] = Registry("controller", group="autosearch.controllers")
register_space = spaces.register
register_controller = controllers.register
