"""How a search moves through a space's genes: a uniform draw, one gene redrawn (a
mutation that changes the network), every network one gene away. Pure functions of
the gene domains and the space's ``make`` (which canonicalizes): the budget is the
space's to check (:class:`autosearch.space.SearchSpace`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from autosearch.architecture import Architecture, Gene
from autosearch.errors import InvalidArchitectureError
from autosearch.space.domains import Domain

__all__ = ["MAX_MUTATION_TRIES", "draw", "mutation", "neighbours"]

MAX_MUTATION_TRIES = 100

Make = Callable[[Mapping[str, Gene]], Architecture]


def draw(domains: Mapping[str, Domain], rng: np.random.Generator) -> dict[str, Gene]:
    """Each gene drawn uniformly from its domain."""
    return {gene: domain.sample(rng) for gene, domain in domains.items()}


def mutation(
    domains: Mapping[str, Domain],
    arch: Architecture,
    rng: np.random.Generator,
    make: Make,
    describe: Callable[[Architecture], str],
) -> Architecture:
    """``arch`` (canonical) with one gene redrawn to another of its values, so that
    the network differs. Genes that the canonical form resets give the same network,
    so the draw repeats, at most ``MAX_MUTATION_TRIES`` times."""
    movable = [(g, d) for g, d in domains.items() if len(d.values()) > 1]
    if not movable:
        raise InvalidArchitectureError(f"space {arch.space!r} has one point: nothing to mutate")
    for _ in range(MAX_MUTATION_TRIES):
        gene, domain = movable[int(rng.integers(len(movable)))]
        others = [v for v in domain.values() if v != arch[gene]]
        child = make({**arch, gene: others[int(rng.integers(len(others)))]})
        if child != arch:
            return child
    raise InvalidArchitectureError(
        f"no mutation of {describe(arch)} changed the network in "
        f"{MAX_MUTATION_TRIES} tries; the space may be too constrained"
    )


def neighbours(domains: Mapping[str, Domain], arch: Architecture, make: Make) -> list[Architecture]:
    """Every distinct network one gene away from ``arch`` (canonical), in gene order."""
    found: dict[str, Architecture] = {}
    for gene, domain in domains.items():
        for value in domain.values():
            if value != arch[gene]:
                child = make({**arch, gene: value})
                if child != arch:
                    found.setdefault(child.arch_id, child)
    return list(found.values())
