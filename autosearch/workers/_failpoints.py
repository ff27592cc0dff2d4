"""Failpoints: named places in the platform's own steps where a chaos test can make a
worker die on purpose, exactly there (FoundationDB's BUGGIFY, FreeBSD's fail(9)).

A random SIGKILL from outside seldom lands inside the few milliseconds of the
transaction that ends a trial; a failpoint does. ``$AUTOSEARCH_FAILPOINTS`` arms them:
``end_trial.inside=kill@0.05,epoch.saved=stop@0.01`` (the action, and the chance per
pass: ``kill`` is SIGKILL, ``stop`` SIGSTOP: the chaos test sends SIGCONT, or the worker
is taken over). Unset (always, outside benchmarks/chaos.py), a failpoint costs one
dictionary lookup. Before it acts, a failpoint writes one line to stderr
(``autosearch failpoint NAME: ACTION``), so that the test counts where its kills landed.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import sys

from autosearch.errors import ConfigError

__all__ = ["ENV", "POINTS", "check_armed", "failpoint"]

ENV = "AUTOSEARCH_FAILPOINTS"
# Where they are (a name armed that is not here is refused, not ignored).
POINTS = (
    "end_trial.before",  # a trial (or job claim) about to be ended
    "end_trial.inside",  # its rows written, not committed (a database), or half written
    "end_trial.after",  # ended and committed; nothing after it done yet
    "store.weights",  # the trained weights uploaded, the trial not yet ended
    "tell.before",  # the trial stored, the controller not yet told
    "epoch.saved",  # an epoch's checkpoint written, the next epoch not begun
)
_ACTIONS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


@functools.cache
def _armed() -> dict[str, tuple[str, float]]:
    spec = os.environ.get(ENV, "").strip()
    armed = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, rest = part.partition("=")
        action, _, given = rest.partition("@")
        try:
            chance = float(given or 1.0)
        except ValueError:
            chance = -1.0
        if name not in POINTS or action not in _ACTIONS or not 0 <= chance <= 1:
            raise ConfigError(
                f"{ENV}: {part!r} is not NAME=ACTION@CHANCE with NAME one of "
                f"{', '.join(POINTS)}, ACTION one of {', '.join(_ACTIONS)} and CHANCE in [0, 1]"
            )
        armed[name] = (action, chance)
    return armed


_rng = random.Random()


def check_armed() -> None:
    """Refuse a ``$AUTOSEARCH_FAILPOINTS`` that names no failpoint, before any work
    (a misspelt one would otherwise stop a worker at its first pass, mid-trial).

    Raises:
        ConfigError: an entry that is not ``NAME=ACTION@CHANCE`` of a known NAME.
    """
    _armed()


def failpoint(name: str) -> None:
    """Act as ``$AUTOSEARCH_FAILPOINTS`` says at ``name`` (nothing when it is unset)."""
    armed = _armed()
    if not armed or name not in armed:
        return
    action, chance = armed[name]
    if _rng.random() < chance:
        print(f"autosearch failpoint {name}: {action}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), _ACTIONS[action])
