"""What a study's artifacts hold that no trial needs any more, swept when its search
ends: weights no trial, job or supernet refers to (a worker killed after uploading a
trial's weights and before storing the trial), and the checkpoints of architectures
whose trials are finished (a worker killed after storing its trial and before removing
its work).

Only the study's own weights are swept: those its trials and job claims uploaded (Optuna
records each upload on its trial), never another study's that shares the folder.

Nothing is swept while any trial or job claim of the study is unfinished: a worker
uploads a trial's weights before it stores the trial, and a claimed or superseded
trial resumes from its work. The sweep reads what is there first, then the trials, so
a file written meanwhile belongs to a trial that is unfinished when they are read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from optuna.trial import FrozenTrial

from autosearch._compat import ARTIFACT_ATTR_PREFIX
from autosearch.storage.artifacts import Artifacts
from autosearch.study import records
from autosearch.study.records import RESUME, claim_key, superseded

__all__ = ["Swept", "sweep"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Swept:
    """What a sweep removed: weights artifacts, and architectures' checkpoint folders."""

    weights: tuple[str, ...] = ()
    checkpoints: tuple[str, ...] = ()


def sweep(
    artifacts: Artifacts,
    trials: Iterable[FrozenTrial],
    claims: Iterable[FrozenTrial],
    *,
    kept: Iterable[str] = (),
) -> Swept:
    """Remove what no trial needs (nothing where a trial or job claim is unfinished).
    ``trials``, ``claims``: the study's trials and its job claims, read after calling;
    ``kept``: weights referred to elsewhere (the study's supernet)."""
    stored, checkpointed = artifacts.stored_weights(), artifacts.checkpointed()
    trials, claims = list(trials), list(claims)
    if any(not t.state.is_finished() for t in [*trials, *claims]):
        return Swept()
    referred = set(kept) | {w for t in trials if (w := records.weights_id(t))}
    referred |= {w for c in claims if (w := _job_weights(c))}
    uploaded = {a for t in [*trials, *claims] for a in _uploads(t)}
    orphans = sorted((stored & uploaded) - referred)
    for artifact in orphans:
        artifacts.drop_weights(artifact)
    done = sorted(checkpointed & _finished_architectures(trials))
    for arch_id in done:
        artifacts.finish_arch(arch_id)
    if orphans or done:
        logger.info(
            "removed %d weights file(s) no trial refers to and the checkpoints of %d finished "
            "architecture(s) from %s",
            len(orphans),
            len(done),
            artifacts.location,
        )
    return Swept(tuple(orphans), tuple(done))


def _finished_architectures(trials: list[FrozenTrial]) -> set[str]:
    """Architectures whose work no trial resumes: every one of their claims (a search
    trial, a confirmation, a population) is finished and not waiting to be resumed."""
    finished: set[str] = set()
    resuming: set[str] = set()
    done_keys = {claim_key(t.user_attrs) for t in trials if not superseded(t)}
    for t in trials:
        arch = t.user_attrs.get(records.ARCH_ID)
        if not isinstance(arch, str):
            continue
        if superseded(t) and t.user_attrs.get(RESUME) and claim_key(t.user_attrs) not in done_keys:
            resuming.add(arch)
        elif not superseded(t):
            finished.add(arch)
    return finished - resuming


def _job_weights(claim: FrozenTrial) -> str | None:
    result = claim.user_attrs.get("job_result")
    weights = result.get("weights") if isinstance(result, dict) else None
    return str(weights) if isinstance(weights, str) and weights else None


def _uploads(trial: FrozenTrial) -> list[str]:
    """The artifacts uploaded for ``trial`` (Optuna's ``artifacts:ID`` attributes)."""
    prefix = ARTIFACT_ATTR_PREFIX
    return [k.removeprefix(prefix) for k in trial.system_attrs if k.startswith(prefix)]
