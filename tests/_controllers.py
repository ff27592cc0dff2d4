"""Every registered controller with its defaults, for the tests that run them all."""

from __future__ import annotations

from autosearch.registry import controllers


def registered_controller(name, space, seed, **options):
    """Controller ``name`` over ``space``; the zero-cost warm-up, whose proxies a study
    computes, ranks a small pool by FLOPs and parameters (its data-free setting)."""
    cls = controllers.get(name)
    if name == "zero_cost":
        return cls(space, seed=seed, pool=32, first=4, scores="cost", **options)
    return cls(space, seed=seed, **options)
