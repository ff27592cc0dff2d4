"""Weights and checkpoints: where a study keeps the tensors its storage points at.

A trained candidate's weights are an Optuna artifact (safetensors) of its trial, in a
folder every worker reaches; its trial's result names the artifact.

Until its trial is COMPLETE, each attempt at an architecture keeps its work in a folder
of its own, ``checkpoints/STUDY/ARCH_ID/TRIAL/`` (STUDY: the study's creation id, so
that studies sharing a folder never share a checkpoint): the training checkpoint of every epoch and
each variant derived so far (runner.TrialPlan.work). Only that attempt writes there.
An attempt that resumes a trial cut short (a dead or stalled worker, Ctrl-C, an I/O
fault) starts from a copy of the most recent attempt's folder, so nothing done is done
again, and a stalled worker that wakes up never overwrites its successor's files.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import tempfile
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn as nn
from optuna.storages import BaseStorage
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from autosearch._files import tensors_digest
from autosearch.architecture import Architecture
from autosearch.errors import ConfigError, ExportError, PlatformError
from autosearch.evaluation.trial import TRAIN_STATE
from autosearch.evaluation.user import USER_STATE
from autosearch.storage._paths import inside, plain_name
from autosearch.storage._s3 import S3Folder, is_s3
from autosearch.storage._urls import local_path

__all__ = [
    "Artifacts",
    "default_folder",
    "location_of",
    "opened_location",
    "stored_location",
]

# What an attempt folder holds once it has work to resume: a training's checkpoint, or
# a population's record (a confirmation trained as a population: its members inside).
RESUMABLE = (TRAIN_STATE, USER_STATE, "population/population.json")

T = TypeVar("T")

logger = logging.getLogger(__name__)

# The key of a weights file's metadata that holds the digest of its tensors.
DIGEST = "autosearch.sha256"
# The name Optuna gives an artifact's file (a UUID).
_ARTIFACT_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def default_folder(storage_url: str, study: str) -> Path:
    """``artifacts/`` beside a file storage, else ``runs/STUDY/artifacts``."""
    path = local_path(storage_url)
    return (path.parent if path else Path("runs") / study) / "artifacts"


# What a study stores for "the artifacts folder beside its storage file": a path relative
# to that file's folder, so a copy of the file (with its folder) uses its own.
BESIDE = "artifacts"


def location_of(given: str | Path | None, storage_url: str, study: str) -> str:
    """Where a new study keeps its weights, as it is stored with the study: a bucket URL,
    an absolute folder (``given``, else ``runs/STUDY/artifacts`` under the creating
    process's folder), or, for a file storage by default, ``artifacts/`` beside the file
    (stored relative to it: a copy of the file and its folder elsewhere is a study of
    its own, never writing into the original's). Every process of the study, wherever
    it starts, uses the same one."""
    if given is not None and not isinstance(given, str | Path):
        raise ConfigError(f"artifacts= takes a folder or an s3:// URL, got {given!r}")
    if given is not None and is_s3(str(given)):
        S3Folder(str(given))  # refuses a URL without a bucket
        return str(given).rstrip("/")
    if not given and local_path(storage_url) is not None:
        return BESIDE
    folder = Path(given) if given else default_folder(storage_url, study)
    return str(folder.expanduser().resolve())


def stored_location(stored: str | None, storage_url: str, study: str) -> str:
    """The folder or URL a study's stored location names (the default beside its file
    storage where it names that, or where none was stored)."""
    if stored is None or (stored == BESIDE and local_path(storage_url) is not None):
        return str(default_folder(storage_url, study).resolve())
    return stored


def opened_location(stored: str | None, storage_url: str, study: str) -> str:
    """Where an opened study's weights are: the stored location. A study stored before
    locations were stored uses the default beside its storage; a study whose stored
    folder is missing here, but which was moved with its file storage (its
    ``artifacts/`` beside the file exists), uses that one, saying so."""
    if stored is None or stored == BESIDE:
        return stored_location(stored, storage_url, study)
    beside = default_folder(storage_url, study) if local_path(storage_url) else None
    if not is_s3(stored) and not Path(stored).exists() and beside is not None and beside.is_dir():
        logger.info("artifacts of study %s: %s is missing here; using %s", study, stored, beside)
        return str(beside)
    return stored


class Artifacts:
    """One study's weights and checkpoints under ``folder``; with ``remote`` (an S3
    location), the folder only caches the attempts' work, and the bucket holds the
    weights and a copy of every attempt's work, written as it is made."""

    def __init__(self, folder: Path, remote: S3Folder | None = None, study: str = "") -> None:
        self.folder, self.remote, self.study = Path(folder), remote, study
        self.location = remote.url if remote else str(self.folder)
        self._pushed: dict[Path, tuple[int, int]] = {}  # file -> (mtime_ns, size) sent

    @classmethod
    def at(cls, location: str | Path, study: str = "") -> Artifacts:
        """A folder, or ``s3://bucket/prefix`` (``study``: the study's creation id, which
        keys its trials' checkpoints, and this machine's cache of the bucket)."""
        if is_s3(str(location)):
            remote = S3Folder(str(location))
            return cls(remote.cache(study), remote, study)
        return cls(Path(location), study=study)

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

    # Work folders: an attempt at a trial (checkpoints/STUDY/ARCH_ID/N/), or at the
    # study's supernet job (supernet/JOB/N/); N numbers the claim that writes there.
    def _trial_prefix(self, arch: Architecture) -> str:
        return "/".join(filter(None, ("checkpoints", self.study, arch.arch_id)))

    def attempt(self, arch: Architecture, number: int) -> Path:
        """The folder of trial ``number``'s attempt at ``arch``."""
        return self.folder / self._trial_prefix(arch) / str(number)

    def start_attempt(self, arch: Architecture, number: int) -> Path:
        """Create trial ``number``'s folder for ``arch``, seeded with the work of the
        most recent earlier attempt that left a training checkpoint."""
        return self._start(self._trial_prefix(arch), number)

    def push(self, arch: Architecture, number: int) -> None:
        """Copy what the attempt wrote since the last push to the bucket (nothing to do
        without one): each file whole, so a reader never sees half of it."""
        self._push(self.attempt(arch, number), f"{self._trial_prefix(arch)}/{number}")

    def finish(self, arch: Architecture) -> None:
        """``arch``'s trial is COMPLETE (or ended for good): its attempts' work goes."""
        self._finish(self._trial_prefix(arch))

    def drop_attempt(self, arch: Architecture, number: int) -> None:
        """Remove an attempt that another worker took over (its successor has a copy)."""
        self._drop(self._trial_prefix(arch), number)

    def job_work(self, job: str, number: int) -> Path:
        """The folder of claim ``number`` on the supernet job ``job``."""
        return self.folder / _job_prefix(job) / str(number)

    def start_job(self, job: str, number: int) -> Path:
        """Create claim ``number``'s folder for ``job``, seeded with the checkpoint of
        the most recent earlier claim (here, or in the bucket: a run resumed on another
        machine)."""
        return self._start(_job_prefix(job), number)

    def push_job(self, job: str, number: int) -> None:
        self._push(self.job_work(job, number), f"{_job_prefix(job)}/{number}")

    def finish_job(self, job: str) -> None:
        """The supernet is trained and its weights stored: its claims' work goes."""
        self._finish(_job_prefix(job))

    def drop_job(self, job: str, number: int) -> None:
        self._drop(_job_prefix(job), number)

    def population(self, name: str) -> Path:
        """The folder of population ``name`` (``populations/NAME``: an architecture
        trained as a population, autosearch.population.trial), what the bucket
        holds of it fetched first where this disk has no record of it (a trial resumed
        on another machine)."""
        prefix = _population_prefix(name)
        folder = self.folder / prefix
        if self.remote is not None and not (folder / "population.json").is_file():
            keys = self._remote(self.remote.list, prefix)
            files = []
            for key in keys:
                relative = key.removeprefix(f"{prefix}/")
                path = inside(folder, relative) if relative != key else None
                if path is None:
                    logger.warning("skipping object %r in %s: not a file of %s", key,
                                   self.location, prefix)  # fmt: skip
                else:
                    files.append((key, path))
            for key, path in _placeable(files, folder, self.location):
                self._remote(self.remote.get, key, path)
        return folder

    def push_population(self, name: str) -> None:
        """Copy what population ``name``'s folder wrote since the last push to the bucket
        (nothing to do without one): its members' checkpoints before its record."""
        prefix = _population_prefix(name)
        self._push(self.folder / prefix, prefix)

    def finish_population(self, name: str) -> None:
        """Population ``name``'s trial is stored: its members' checkpoints go, here and
        in the bucket; its record (``population.json``) stays on this disk."""
        prefix = _population_prefix(name)
        shutil.rmtree(self.folder / prefix / "members", ignore_errors=True)
        if self.remote is not None:
            self._remote(self.remote.delete, prefix)

    def _start(self, prefix: str, number: int) -> Path:
        work = self.folder / prefix / str(number)
        try:
            work.mkdir(parents=True, exist_ok=True)
            earlier = [p for p in work.parent.iterdir() if p.name.isdigit() and p != work]
            done = [p for p in earlier if any((p / m).is_file() for m in RESUMABLE)]
            if done:
                shutil.copytree(max(done, key=lambda p: int(p.name)), work, dirs_exist_ok=True)
            elif self.remote is not None and not any((work / m).exists() for m in RESUMABLE):
                self._fetch_latest(prefix, number, work)
        except OSError as exc:
            raise PlatformError(
                f"cannot prepare checkpoint folder {work}: {exc.strerror or exc}"
            ) from None
        return work

    def _fetch_latest(self, prefix: str, number: int, work: Path) -> None:
        """Copy the most recent earlier claim's work from the bucket (one run on another
        machine) into ``work``. Only keys of the work's shape, ``PREFIX/N/PATH`` with
        PATH a file that fits inside ``work``, are fetched; any other is skipped with a
        log line."""
        assert self.remote is not None
        found: dict[int, list[tuple[str, Path]]] = {}
        for key in self._remote(self.remote.list, prefix):
            parsed = _work_key(key, prefix, work)
            if parsed is None:
                logger.warning(
                    "skipping object %r in %s: not a file of a work folder", key, self.location
                )
            elif parsed[0] != number:
                found.setdefault(parsed[0], []).append((key, parsed[1]))
        placed = {n: _placeable(files, work, self.location) for n, files in found.items()}
        marks = {work / m for m in RESUMABLE}
        done = [n for n, files in placed.items() if marks & {p for _, p in files}]
        if not done:
            return
        for key, path in placed[max(done)]:
            self._remote(self.remote.get, key, path)

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

    def _finish(self, prefix: str) -> None:
        shutil.rmtree(self.folder / prefix, ignore_errors=True)
        if self.remote is not None:
            self._remote(self.remote.delete, prefix)

    def _drop(self, prefix: str, number: int) -> None:
        work = self.folder / prefix / str(number)
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):
            work.parent.rmdir()  # gone when it was the last
        if self.remote is not None:
            self._remote(self.remote.delete, f"{prefix}/{number}")

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
    ) -> tuple[str, str]:
        """Upload ``model``'s weights as an artifact of the trial (or, with ``study``, an
        Optuna study: of the study itself): (the artifact id, the weights' content digest,
        which the file holds too and every load checks)."""
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        digest = tensors_digest(state)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            save_file(state, str(path), metadata={DIGEST: digest})
            from optuna.artifacts import upload_artifact  # it imports boto3: when used

            try:
                artifact = upload_artifact(
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
        return artifact, digest

    def stored_weights(self) -> set[str]:
        """The ids of every weights artifact the study's folder or bucket holds."""
        if self.remote is not None:
            keys = self._remote(self.remote.list, "weights")
            return {
                k.removeprefix("weights/") for k in keys if plain_name(k.removeprefix("weights/"))
            }
        if not self.folder.is_dir():
            return set()
        return {p.name for p in self.folder.iterdir() if p.is_file() and _ARTIFACT_ID.match(p.name)}

    def checkpointed(self) -> set[str]:
        """The ids of the architectures whose trials' work (checkpoints) is still kept."""
        prefix = "/".join(filter(None, ("checkpoints", self.study)))
        found = {p.name for p in (self.folder / prefix).glob("*") if p.is_dir()}
        if self.remote is not None:
            keys = self._remote(self.remote.list, prefix)
            found |= {k.removeprefix(f"{prefix}/").partition("/")[0] for k in keys}
        return {a for a in found if plain_name(a)}

    def finish_arch(self, arch_id: str) -> None:
        """The work of every attempt at ``arch_id`` goes (its trial is finished)."""
        self._finish("/".join(filter(None, ("checkpoints", self.study, arch_id))))

    def drop_weights(self, artifact_id: str) -> None:
        """Remove weights that no record will name (a claim that lost its job)."""
        try:
            self._store.remove(artifact_id)
        except Exception as exc:  # already gone, or the bucket failed: nothing points at it
            logger.info("weights %s not removed from %s: %s", artifact_id, self.location, exc)

    def load_weights(
        self,
        artifact_id: str,
        *,
        trial: int | None = None,
        owner: str = "",
        repair: str = "restore it from a copy, or run the trial again",
        expected: str | None = None,
    ) -> dict[str, torch.Tensor]:
        """The weights of artifact ``artifact_id`` (trial ``trial``'s, or ``owner``'s,
        for errors; ``repair``: what the errors say to do), checked against the digest
        the file was written with and ``expected`` (the one the study stored).

        Raises:
            ExportError: the trial names no readable artifact, or it is missing.
            PlatformError: the stored weights are damaged (not safetensors, or not what
                was stored).
        """
        owner = owner or f"trial {trial}"
        if not plain_name(artifact_id):
            raise ExportError(
                f"{owner} names its weights {artifact_id!r}, which is not an artifact id; "
                f"its stored record was edited or damaged; {repair}"
            )
        where = f"{self.location.rstrip('/')}/{'weights/' if self.remote else ''}{artifact_id}"
        from optuna.artifacts import download_artifact  # it imports boto3: when used

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            try:
                download_artifact(
                    artifact_store=self._store, file_path=str(path), artifact_id=artifact_id
                )
            except Exception as exc:
                raise ExportError(
                    f"the weights of {owner} are missing: {where} "
                    f"({type(exc).__name__}); was the artifacts folder moved or deleted? "
                    f"If they are lost, {repair}"
                ) from None
            try:
                weights = load_file(str(path))
                with safe_open(str(path), framework="pt") as opened:
                    written = (opened.metadata() or {}).get(DIGEST)
            except Exception as exc:  # safetensors' own error types: a damaged file
                raise PlatformError(
                    f"the weights of {owner} are damaged: {where} is not a safetensors "
                    f"file ({type(exc).__name__}: {exc}); {repair}"
                ) from None
        digest = tensors_digest(weights)
        for said, what in ((written, "the file"), (expected, "the study")):
            if said and said != digest:
                raise PlatformError(
                    f"the weights of {owner} are not those it stored: {where} holds other "
                    f"values (digest {digest}, {what} says {said}), changed or damaged; {repair}"
                )
        return weights

    @cached_property
    def _store(self) -> Any:  # created on first use
        if self.remote is not None:
            return self.remote.artifact_store()
        from optuna.artifacts import FileSystemArtifactStore  # it imports boto3: when used

        self.folder.mkdir(parents=True, exist_ok=True)
        return FileSystemArtifactStore(str(self.folder))


def _population_prefix(name: str) -> str:
    return f"populations/{name}"


def _job_prefix(job: str) -> str:
    return f"supernet/{job}"


def _work_key(key: str, prefix: str, work: Path) -> tuple[int, Path] | None:
    """``PREFIX/N/PATH`` → (N, where PATH goes in ``work``); None for a key of any
    other shape, or a PATH that would not stay inside ``work``."""
    if not isinstance(key, str) or not key.startswith(f"{prefix}/"):
        return None
    attempt, _, relative = key[len(prefix) + 1 :].partition("/")
    if not (attempt.isascii() and attempt.isdigit() and len(attempt) <= 18):
        return None
    path = inside(work, relative)
    return (int(attempt), path) if path is not None else None


def _placeable(files: list[tuple[str, Path]], work: Path, where: str) -> list[tuple[str, Path]]:
    """The files of one attempt that can all be written: none where another's folder
    must go, none under another (a listing may hold both ``a`` and ``a/b``), none where
    the disk has a folder. Shallower files win; each one left out is logged."""
    files_at: set[Path] = set()
    folders: set[Path] = set()
    kept: list[tuple[str, Path]] = []
    for key, path in sorted(files, key=lambda item: (len(item[1].parts), item[0])):
        parents = set(path.parents) - set(work.parents) - {work}
        on_disk = path.is_dir() or any(p.exists() and not p.is_dir() for p in parents)
        if path in folders or parents & files_at or on_disk:
            logger.warning(
                "skipping object %r in %s: a file and a folder of the same name", key, where
            )
            continue
        files_at.add(path)
        folders |= parents
        kept.append((key, path))
    return kept
