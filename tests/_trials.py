"""Helpers for the tests that kill workers and read what the storage holds after."""

from __future__ import annotations


def the_resume(trials, cut):
    """The trial that resumed ``cut``: two workers may both claim its resume at once
    (more likely on a loaded machine), and the later one gives its trial up as a
    duplicate; exactly one resume holds it."""
    resumes = [t for t in trials if t.user_attrs.get("resumes") == cut.number]
    held = [t for t in resumes if "superseded" not in t.user_attrs]
    assert len(held) == 1, [(t.number, t.state.name, dict(t.user_attrs)) for t in resumes]
    assert all("duplicate" in t.user_attrs["superseded"] for t in resumes if t not in held)
    return held[0]
