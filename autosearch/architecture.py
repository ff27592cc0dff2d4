"""The genotype: an immutable, hashable, JSON-serialisable architecture."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from autosearch.errors import InvalidArchitectureError, MissingGeneError

__all__ = ["Architecture", "Gene"]

Gene = int | float | str | bool
_GENE_TYPES = (int, float, str, bool)


@dataclass(frozen=True, kw_only=True)
class Architecture(Mapping[str, Gene]):
    """A point of a search space: the space's name plus a flat, sorted gene mapping.

    Architectures compare, hash and serialise by content, so the same network
    proposed twice (by two workers, or after a resume) has the same :attr:`arch_id`.
    Build one through its space (``space.sample(rng)``, ``space.canonicalize``)
    so that genes the network ignores are reset and equal networks compare equal.

    Example:
        >>> a = Architecture(space="resnet", genes={"stage1.depth": 2})
        >>> a["stage1.depth"], a.to_json()
        (2, '{"genes":{"stage1.depth":2},"space":"resnet"}')
    """

    space: str
    genes: Mapping[str, Gene] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.space, str) or not self.space:
            raise InvalidArchitectureError(
                f"an architecture needs its space's name as a non-empty string, got {self.space!r}"
            )
        clean: dict[str, Gene] = {}
        for name in sorted(self.genes):
            value = self.genes[name]
            if not isinstance(name, str) or not isinstance(value, _GENE_TYPES):
                raise InvalidArchitectureError(
                    f"gene {name!r} = {value!r}: genes are str names with int, float, str or "
                    "bool values"
                )
            clean[name] = value
        # A read-only sorted copy: the caller's dict can change without touching us.
        object.__setattr__(self, "genes", _FrozenDict(clean))

    # Mapping protocol over the genes -------------------------------------------------
    def __getitem__(self, name: str) -> Gene:
        try:
            return self.genes[name]
        except KeyError:
            raise MissingGeneError(
                f"architecture of space {self.space!r} has no gene {name!r}; "
                f"its genes are {', '.join(self.genes)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.genes)

    def __len__(self) -> int:
        return len(self.genes)

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Architecture):
            return NotImplemented
        return self.space == other.space and dict(self.genes) == dict(other.genes)

    def __repr__(self) -> str:
        genes = ", ".join(f"{k}={v!r}" for k, v in self.genes.items())
        return f"Architecture({self.space}: {genes})"

    # Identity and serialisation ------------------------------------------------------
    def replace(self, **genes: Gene) -> Architecture:
        """Return a copy with some genes changed (``arch.replace(**{"stage1.depth": 3})``)."""
        return Architecture(space=self.space, genes={**self.genes, **genes})

    def to_dict(self) -> dict[str, Any]:
        return {"space": self.space, "genes": dict(self.genes)}

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace; the basis of :attr:`arch_id`."""
        return self._json

    @cached_property
    def _json(self) -> str:  # computed once: an architecture never changes
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @cached_property
    def arch_id(self) -> str:
        """A 16-hex-digit content hash of the canonical JSON."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: Any) -> Architecture:
        if not isinstance(data, Mapping) or set(data) != {"space", "genes"}:
            raise InvalidArchitectureError(
                "architecture JSON must be an object with exactly the keys 'space' and 'genes', "
                f"got {data!r:.200}"
            )
        if not isinstance(data["genes"], Mapping):
            raise InvalidArchitectureError(
                f"architecture 'genes' must be an object of name: value, got {data['genes']!r:.200}"
            )
        return cls(space=data["space"], genes=dict(data["genes"]))

    @classmethod
    def from_json(cls, text: str) -> Architecture:
        """Parse :meth:`to_json` output; malformed text raises InvalidArchitectureError."""
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as exc:
            raise InvalidArchitectureError(
                f"architecture JSON could not be parsed ({exc}); expected text like "
                '\'{"space": "resnet", "genes": {"stage1.depth": 2}}\''
            ) from None
        return cls.from_dict(data)


class _FrozenDict(dict):  # type: ignore[type-arg]
    """A dict that refuses mutation, so a frozen Architecture stays frozen."""

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("architecture genes are read-only; use Architecture.replace()")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))
