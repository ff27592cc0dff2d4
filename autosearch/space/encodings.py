"""Architectures as vectors, for predictors and rankers: one scaled entry per gene, or
one indicator per gene value; and how many gene assignments a space holds."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from autosearch.architecture import Architecture
from autosearch.space.domains import Domain

__all__ = ["one_hot", "ordinal", "size"]


def ordinal(domains: Mapping[str, Domain], arch: Architecture) -> np.ndarray:
    """A fixed-length float vector in [0, 1], one entry per gene (its value's position
    in its domain)."""
    return np.array([d.encode(arch[g]) for g, d in domains.items()], dtype=np.float64)


def one_hot(domains: Mapping[str, Domain], arch: Architecture) -> np.ndarray:
    """One indicator per gene value: a categorical encoding, for genes whose values are
    not ordered, or not evenly."""
    parts = []
    for gene, domain in domains.items():
        values = domain.values()
        row = np.zeros(len(values))
        row[values.index(arch[gene])] = 1.0
        parts.append(row)
    return np.concatenate(parts)


def size(domains: Mapping[str, Domain]) -> int:
    """The number of gene assignments (an upper bound on distinct networks)."""
    return int(np.prod([len(d.values()) for d in domains.values()], dtype=object))
