"""Weights and checkpoints: where a study keeps the tensors its storage points at.

A trained candidate's weights are an Optuna artifact (safetensors) of its trial, in a
folder every worker reaches; its trial's result names the artifact.

Until its trial is COMPLETE, each attempt at an architecture keeps its work in a folder
of its own, ``checkpoints/ARCH_ID/TRIAL/``: the training checkpoint of every epoch and
each variant derived so far (runner.TrialPlan.work). Only that attempt writes there.
An attempt that resumes a trial cut short (a dead or stalled worker, Ctrl-C, an I/O
fault) starts from a copy of the most recent attempt's folder, so nothing done is done
again, and a stalled worker that wakes up never overwrites its successor's files.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn as nn
from optuna.artifacts import FileSystemArtifactStore, download_artifact, upload_artifact
from optuna.storages import BaseStorage
from safetensors.torch import load_file, save_file

from autosearch._paths import inside, plain_name
from autosearch._storage import local_path
from autosearch.architecture import Architecture
from autosearch.errors import ConfigError, ExportError, PlatformError
from autosearch.runner import TRAIN_STATE
from autosearch.study._s3 import S3Folder, is_s3

__all__ = ["Artifacts", "default_folder", "location_of", "opened_location"]

T = TypeVar("T")

logger = logging.getLogger(__name__)


def default_folder(storage_url: str, study: str) -> Path:
    """``artifacts/`` beside a file storage, else ``runs/STUDY/artifacts``."""
    path = local_path(storage_url)
    return (path.parent if path else Path("runs") / study) / "artifacts"


def location_of(given: str | Path | None, storage_url: str, study: str) -> str:
    """Where a new study keeps its weights, as it is stored with the study: a bucket URL,
    or an absolute folder (``given``, else ``artifacts/`` beside a file storage, else
    ``runs/STUDY/artifacts`` under the creating process's folder), so that every process
    of the study, wherever it starts, uses the same one."""
    if given is not None and not isinstance(given, str | Path):
        raise ConfigError(f"artifacts= takes a folder or an s3:// URL, got {given!r}")
    if given is not None and is_s3(str(given)):
        S3Folder(str(given))  # refuses a URL without a bucket
        return str(given).rstrip("/")
    folder = Path(given) if given else default_folder(storage_url, study)
    return str(folder.expanduser().resolve())


def opened_location(stored: str | None, storage_url: str, study: str) -> str:
    """Where an opened study's weights are: the stored location. A study stored before
    locations were stored uses the default beside its storage; a study whose stored
    folder is missing here, but which was moved with its file storage (its
    ``artifacts/`` beside the file exists), uses that one, saying so."""
    if stored is None:
        return str(default_folder(storage_url, study))
    beside = default_folder(storage_url, study) if local_path(storage_url) else None
    if not is_s3(stored) and not Path(stored).exists() and beside is not None and beside.is_dir():
        logger.info("artifacts of study %s: %s is missing here; using %s", study, stored, beside)
        return str(beside)
    return stored


class Artifacts:
    """One study's weights and checkpoints under ``folder``; with ``remote`` (an S3
    location), the folder only caches the attempts' work, and the bucket holds the
    weights and a copy of every attempt's work, written as it is made."""

    def __init__(self, folder: Path, remote: S3Folder | None = None) -> None:
        self.folder, self.remote = Path(folder), remote
        self.location = remote.url if remote else str(self.folder)
        self._pushed: dict[Path, tuple[int, int]] = {}  # file -> (mtime_ns, size) sent

    @classmethod
    def at(cls, location: str | Path, study: str = "") -> Artifacts:
        """A folder, or ``s3://bucket/prefix`` (``study``: the study's creation id, which
        keys this machine's cache of the bucket)."""
        if is_s3(str(location)):
            remote = S3Folder(str(location))
            return cls(remote.cache(study), remote)
        return cls(Path(location))

    def check_reachable(self) -> None:
        """Before training: refuse, in one line, a location this process cannot use
        (a stored folder this machine does not have or cannot write; a bucket that is
        missing or unreachable), rather than scattering weights or failing late."""
        if self.remote is not None:
            self.remote.check()
            return
        if not self.folder.is_dir():
            raise PlatformError(
                f"the study keeps its weights in {self.folder}, which this machine does not "
                "have: run workers where that folder is mounted (a folder every worker "
                "reaches), or create the study with artifacts='s3://bucket/prefix'"
            )
        try:
            tempfile.TemporaryFile(dir=self.folder).close()
        except OSError as exc:
            raise PlatformError(
                f"the study keeps its weights in {self.folder}, which this process cannot "
                f"write ({exc.strerror or exc})"
            ) from None

    def attempt(self, arch: Architecture, number: int) -> Path:
        """The folder of trial ``number``'s attempt at ``arch``."""
        return self.folder / "checkpoints" / arch.arch_id / str(number)

    def start_attempt(self, arch: Architecture, number: int) -> Path:
        """Create trial ``number``'s folder for ``arch``, seeded with the work of the
        most recent earlier attempt that left a training checkpoint."""
        work = self.attempt(arch, number)
        try:
            work.mkdir(parents=True, exist_ok=True)
            earlier = [p for p in work.parent.iterdir() if p.name.isdigit() and p != work]
            done = [p for p in earlier if (p / TRAIN_STATE).is_file()]
            legacy = work.parent.with_suffix(".pt")  # the layout before attempt folders
            if done:
                shutil.copytree(max(done, key=lambda p: int(p.name)), work, dirs_exist_ok=True)
            elif legacy.is_file() and not (work / TRAIN_STATE).exists():
                shutil.copy2(legacy, work / TRAIN_STATE)
            elif self.remote is not None and not (work / TRAIN_STATE).exists():
                self._fetch_latest(arch, number, work)
        except OSError as exc:
            raise PlatformError(
                f"cannot prepare checkpoint folder {work}: {exc.strerror or exc}"
            ) from None
        return work

    def _fetch_latest(self, arch: Architecture, number: int, work: Path) -> None:
        """Copy the most recent earlier attempt's work from the bucket (an attempt run
        on another machine) into ``work``. Only keys of the attempts' shape,
        ``checkpoints/ARCH_ID/N/PATH`` with PATH staying inside ``work``, are fetched;
        any other is skipped with a log line."""
        assert self.remote is not None
        found: dict[int, list[tuple[str, Path]]] = {}
        for key in self._remote(self.remote.list, f"checkpoints/{arch.arch_id}"):
            parsed = _attempt_key(key, arch, work)
            if parsed is None:
                logger.warning(
                    "skipping object %s in %s: not a file of an attempt's work",
                    key,
                    self.location,
                )
                continue
            if parsed[0] != number:
                found.setdefault(parsed[0], []).append((key, parsed[1]))
        done = [n for n, files in found.items() if work / TRAIN_STATE in (p for _, p in files)]
        if not done:
            return
        for key, path in found[max(done)]:
            self._remote(self.remote.get, key, path)

    def push(self, arch: Architecture, number: int) -> None:
        """Copy what the attempt wrote since the last push to the bucket (nothing to do
        without one): each file whole, so a reader never sees half of it."""
        self._push(self.attempt(arch, number), f"checkpoints/{arch.arch_id}/{number}")

    def _push(self, work: Path, prefix: str) -> None:
        if self.remote is None:
            return
        for path in sorted(p for p in work.rglob("*") if p.is_file() and ".tmp" not in p.name):
            stat = path.stat()
            if self._pushed.get(path) == (stat.st_mtime_ns, stat.st_size):
                continue
            relative = f"{prefix}/{path.relative_to(work).as_posix()}"
            self._remote(self.remote.put, path, relative)
            self._pushed[path] = (stat.st_mtime_ns, stat.st_size)

    # The study's supernet: its training's work folder, mirrored like an attempt's.
    def supernet_work(self, job: str) -> Path:
        """The folder of a supernet's training job (its per-epoch checkpoint), seeded
        from the bucket when this disk has none (a run resumed on another machine)."""
        work = self.folder / "supernet" / job
        try:
            work.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PlatformError(f"cannot prepare {work}: {exc.strerror or exc}") from None
        if self.remote is not None and not (work / TRAIN_STATE).exists():
            for key in self._remote(self.remote.list, f"supernet/{job}"):
                relative = key.split("/", 2)[2] if key.count("/") >= 2 else ""
                path = inside(work, relative)
                if path is None:
                    logger.warning("skipping object %s in %s", key, self.location)
                    continue
                self._remote(self.remote.get, key, path)
        return work

    def push_supernet(self, job: str) -> None:
        self._push(self.folder / "supernet" / job, f"supernet/{job}")

    def finish_supernet(self, job: str) -> None:
        """The supernet is trained and its weights stored: its work folder goes."""
        shutil.rmtree(self.folder / "supernet" / job, ignore_errors=True)
        if self.remote is not None:
            self._remote(self.remote.delete, f"supernet/{job}")

    def finish(self, arch: Architecture) -> None:
        """``arch``'s trial is COMPLETE (or ended for good): its attempts' work goes."""
        shutil.rmtree(self.folder / "checkpoints" / arch.arch_id, ignore_errors=True)
        (self.folder / "checkpoints" / f"{arch.arch_id}.pt").unlink(missing_ok=True)
        if self.remote is not None:
            self._remote(self.remote.delete, f"checkpoints/{arch.arch_id}")

    def drop_attempt(self, arch: Architecture, number: int) -> None:
        """Remove an attempt that another worker took over (its successor has a copy)."""
        shutil.rmtree(self.attempt(arch, number), ignore_errors=True)
        with contextlib.suppress(OSError):
            self.attempt(arch, number).parent.rmdir()  # gone when it was the last
        if self.remote is not None:
            self._remote(self.remote.delete, f"checkpoints/{arch.arch_id}/{number}")

    def _remote(self, operation: Callable[..., T], *args: Any) -> T:
        """A bucket operation; its failure is the platform's (the trial stays resumable)."""
        try:
            return operation(*args)
        except (ConfigError, PlatformError):
            raise
        except Exception as exc:  # botocore's errors: no credentials, no bucket, network
            raise PlatformError(
                f"object storage {self.location}: {type(exc).__name__}: {exc}"
            ) from None

    def save_weights(
        self, storage: BaseStorage, trial_id: int | None, model: nn.Module, study: Any = None
    ) -> str:
        """Upload ``model``'s weights as an artifact of the trial (or, with ``study``, an
        Optuna study: of the study itself); the artifact id."""
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            save_file(state, str(path))
            try:
                return upload_artifact(
                    artifact_store=self._store,
                    file_path=str(path),
                    study_or_trial=study if trial_id is None else storage.get_trial(trial_id),
                    storage=storage,
                )
            except OSError as exc:
                raise PlatformError(
                    f"cannot store the weights in {self.location}: {exc.strerror or exc}"
                ) from None
            except Exception as exc:  # the bucket's own errors
                if self.remote is None:
                    raise
                raise PlatformError(
                    f"cannot store the weights in {self.location}: {type(exc).__name__}: {exc}"
                ) from None

    def load_weights(
        self, artifact_id: str, *, trial: int | None = None, owner: str = ""
    ) -> dict[str, torch.Tensor]:
        """The weights of artifact ``artifact_id`` (trial ``trial``'s, or ``owner``'s,
        for errors).

        Raises:
            ExportError: the trial names no readable artifact, or it is missing.
            PlatformError: the stored weights are damaged (not safetensors).
        """
        owner = owner or f"trial {trial}"
        if not plain_name(artifact_id):
            raise ExportError(
                f"{owner} names its weights {artifact_id!r}, which is not an artifact id; "
                "its stored record was edited or damaged"
            )
        where = f"{self.location.rstrip('/')}/{'weights/' if self.remote else ''}{artifact_id}"
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            try:
                download_artifact(
                    artifact_store=self._store, file_path=str(path), artifact_id=artifact_id
                )
            except Exception as exc:
                raise ExportError(
                    f"the weights of {owner} are missing: {where} "
                    f"({type(exc).__name__}); was the artifacts folder moved or deleted?"
                ) from None
            try:
                return load_file(str(path))
            except Exception as exc:  # safetensors' own error types: a damaged file
                raise PlatformError(
                    f"the weights of {owner} are damaged: {where} is not a safetensors "
                    f"file ({type(exc).__name__}: {exc}); restore it from a copy, or run the "
                    "trial again"
                ) from None

    @cached_property
    def _store(self) -> Any:  # created on first use
        if self.remote is not None:
            return self.remote.artifact_store()
        self.folder.mkdir(parents=True, exist_ok=True)
        return FileSystemArtifactStore(str(self.folder))


def _attempt_key(key: str, arch: Architecture, work: Path) -> tuple[int, Path] | None:
    """``checkpoints/ARCH_ID/N/PATH`` → (N, where PATH goes in ``work``); None for a key
    of any other shape, or a PATH that would leave ``work``."""
    parts = key.split("/", 3) if isinstance(key, str) else []
    if len(parts) != 4 or parts[:2] != ["checkpoints", arch.arch_id]:
        return None
    attempt, relative = parts[2], parts[3]
    if not (attempt.isascii() and attempt.isdigit() and len(attempt) <= 18):
        return None
    path = inside(work, relative)
    return (int(attempt), path) if path is not None else None
