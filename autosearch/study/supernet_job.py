"""A study's supernet: its training, a resumable job of the study, and the evaluator
its trials are scored with (autosearch.supernet trains and evaluates; this file keeps
the job in the study's storage and artifacts).

The job's state is a study system attribute: ``{"status": "complete", "fingerprint",
"weights" (an artifact id), "epochs", "seconds", "history", ...}``. While it trains, its
per-epoch checkpoint lives in ``ARTIFACTS/supernet/JOB/`` (JOB: a hash of the study, its
supernet and the training settings; mirrored to the
bucket), so a killed run resumes from its last epoch, on this machine or another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from autosearch.errors import ConfigError, PlatformError, StudyError
from autosearch.runner import TRAIN_STATE
from autosearch.runtime import world
from autosearch.supernet import SubnetEvaluator, fingerprint, train_supernet
from autosearch.train import EpochResult

if TYPE_CHECKING:
    from autosearch.study.study import Study

__all__ = ["evaluator", "export_weights", "stored", "train"]

logger = logging.getLogger(__name__)

_ATTR = "autosearch:supernet"


def stored(study: Study) -> dict[str, Any] | None:
    """The stored state of the study's supernet job (None: never trained)."""
    found = study.storage.get_study_system_attrs(study._study_id).get(_ATTR)
    return found if isinstance(found, dict) else None


def _fingerprint(study: Study) -> str:
    data = study.data
    return fingerprint(study.space, data.input_shape, data.num_classes)  # type: ignore[arg-type]


def _trained(study: Study) -> dict[str, Any] | None:
    info = stored(study)
    if info and info.get("status") == "complete" and info.get("fingerprint") == _fingerprint(study):
        return info
    return None


def _build(study: Study) -> nn.Module:
    data = study.data
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(study.seed)  # the same initial weights on every rank and run
        return study.space.build_supernet(  # type: ignore[attr-defined,no-any-return]
            input_shape=data.input_shape, num_classes=data.num_classes
        )


def train(study: Study, *, show_progress_bar: bool | None = None) -> dict[str, Any]:
    """Train the study's supernet (or import the weights its config names), unless it is
    trained already; the job's stored state. Resumes from the last epoch's checkpoint."""
    config = study.definition.supernet
    if config is None:
        raise StudyError(f"study {study.name!r} has no supernet (create it with supernet=...)")
    done = _trained(study)
    if done is not None:
        return done
    fp = _fingerprint(study)
    net = _build(study)
    if config.weights:
        return _store(study, net, _imported(net, config.weights, fp), fp)
    settings = config.train or study.definition.train
    job = _job_key(study, fp)
    work = study.artifacts.supernet_work(job)
    rank, _ = world()
    start = time.perf_counter()
    show = False if rank != 0 else show_progress_bar
    with _progress(settings.epochs, show) as on_epoch:

        def epoch_done(epoch: EpochResult) -> None:
            on_epoch(epoch)
            if rank == 0:
                study.artifacts.push_supernet(job)  # the checkpoint, to the bucket if any

        result = train_supernet(
            net,
            study.space,
            study.data,
            settings,
            config,
            seed=study.seed,
            checkpoint=work / TRAIN_STATE,
            on_epoch=epoch_done,
        )
    if rank != 0:
        return {}
    info = {
        "epochs": len(result.history),
        "seconds": result.seconds,
        "wall_seconds": time.perf_counter() - start,
        "precision": result.precision,
        "world_size": result.world_size,
        "history": [vars(e) for e in result.history],
    }
    return _store(study, net, info, fp, job)


def _job_key(study: Study, fp: str) -> str:
    """The name of the job's work folder: a study's supernet of this fingerprint with
    these training settings (studies sharing an artifacts folder never share it)."""
    config = study.definition.supernet
    assert config is not None
    what = {
        "study": study.name,
        "fingerprint": fp,
        "seed": study.seed,
        "train": dataclasses.asdict(config.train or study.definition.train),
        "rule": [config.sandwich, config.distill, config.schedule],
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _store(
    study: Study, net: nn.Module, info: dict[str, Any], fp: str, job: str | None = None
) -> dict[str, Any]:
    """Store the trained weights as an artifact of the study, then its state."""
    weights = study.artifacts.save_weights(study.storage, None, net, study=study.optuna_study)
    state = {"status": "complete", "fingerprint": fp, "weights": weights, **info}
    study.storage.set_study_system_attr(study._study_id, _ATTR, state)
    if job is not None:
        study.artifacts.finish_supernet(job)
    logger.info("study %s: supernet trained (%s)", study.name, fp)
    return state


def _imported(net: nn.Module, path: str, fp: str) -> dict[str, Any]:
    """Load the weights :func:`export_weights` wrote into ``net``, refusing those of
    another supernet (its space, genes or images differ)."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:  # type: ignore[no-untyped-call]
            metadata = f.metadata() or {}
        state = load_file(path)
    except FileNotFoundError:
        raise ConfigError(f"supernet weights {path} do not exist; check the path") from None
    except Exception as exc:  # safetensors' own errors: not a weights file
        raise ConfigError(f"supernet weights {path} cannot be read: {exc}") from None
    if metadata.get("fingerprint") != fp:
        raise ConfigError(
            f"supernet weights {path} are of another supernet (fingerprint "
            f"{metadata.get('fingerprint')!r}, this study's is {fp!r}): its space, elastic "
            "and fixed genes, and its images must be the same"
        )
    net.load_state_dict(state)
    return {"imported_from": str(path)}


def export_weights(study: Study, path: str | Path) -> Path:
    """Write the trained supernet's weights (safetensors, with its fingerprint), for
    another study of the same supernet (``SupernetConfig(weights=path)``)."""
    info = _trained(study)
    if info is None:
        raise StudyError(_untrained(study))
    net = _load(study, info)
    state = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    out = Path(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        save_file(state, str(out), metadata={"fingerprint": info["fingerprint"]})
    except Exception as exc:
        raise PlatformError(f"cannot write {out}: {exc}") from None
    return out


def _load(study: Study, info: dict[str, Any]) -> nn.Module:
    net = _build(study)
    state = study.artifacts.load_weights(str(info.get("weights")), owner="the supernet")
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise PlatformError(
            f"the stored supernet weights do not fit study {study.name!r}'s supernet ({first}); "
            "train it again (remove the study's supernet state) or restore them"
        ) from None
    return net


def evaluator(study: Study) -> SubnetEvaluator:
    """The evaluator of the study's trained supernet.

    Raises:
        StudyError: the supernet is not trained yet.
    """
    config = study.definition.supernet
    assert config is not None
    info = _trained(study)
    if info is None:
        raise StudyError(_untrained(study))
    return SubnetEvaluator(_load(study, info), study.space, study.data, config, seed=study.seed)


def _untrained(study: Study) -> str:
    return (
        f"study {study.name!r} evaluates candidates on its supernet, which is not trained "
        "yet: train it first (study.train_supernet(), or `autosearch supernet` with the "
        "study file; `autosearch run` does it before the trials)"
    )


@contextmanager
def _progress(epochs: int, show: bool | None) -> Iterator[Any]:
    """An epoch bar on a terminal (or when asked), else a log line per epoch."""
    if not (sys.stderr.isatty() if show is None else show):

        def log(epoch: EpochResult) -> None:
            logger.info(
                "supernet epoch %d/%d: loss %.4f, largest subnet val %.4f (%.1f s)",
                epoch.epoch,
                epochs,
                epoch.train_loss,
                epoch.val_accuracy,
                epoch.seconds,
            )

        yield log
        return
    bar = tqdm(total=epochs, unit="epoch", desc="supernet")

    def update(epoch: EpochResult) -> None:
        bar.set_postfix_str(f"loss {epoch.train_loss:.3f} largest {epoch.val_accuracy:.3f}")
        bar.update()

    try:
        yield update
    finally:
        bar.close()
