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

from autosearch._storage import local_path
from autosearch.architecture import Architecture
from autosearch.errors import ConfigError, ExportError, PlatformError
from autosearch.runner import TRAIN_STATE
from autosearch.study._s3 import S3Folder, is_s3

__all__ = ["Artifacts", "default_folder"]

T = TypeVar("T")


def default_folder(storage_url: str, study: str) -> Path:
    """``artifacts/`` beside a file storage, else ``runs/STUDY/artifacts``."""
    path = local_path(storage_url)
    return (path.parent if path else Path("runs") / study) / "artifacts"


class Artifacts:
    """One study's weights and checkpoints under ``folder``; with ``remote`` (an S3
    location), the folder only caches the attempts' work, and the bucket holds the
    weights and a copy of every attempt's work, written as it is made."""

    def __init__(self, folder: Path, remote: S3Folder | None = None) -> None:
        self.folder, self.remote = Path(folder), remote
        self.location = remote.url if remote else str(self.folder)
        self._pushed: dict[Path, tuple[int, int]] = {}  # file -> (mtime_ns, size) sent

    @classmethod
    def at(cls, location: str | Path) -> Artifacts:
        """A folder, or ``s3://bucket/prefix``."""
        if is_s3(str(location)):
            remote = S3Folder(str(location))
            return cls(remote.cache(), remote)
        return cls(Path(location))

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
        on another machine) into ``work``."""
        assert self.remote is not None
        found: dict[int, list[str]] = {}
        for key in self._remote(self.remote.list, f"checkpoints/{arch.arch_id}"):
            attempt = key.split("/")[2]
            if attempt.isdigit() and int(attempt) != number:
                found.setdefault(int(attempt), []).append(key)
        done = [n for n, keys in found.items() if any(k.endswith("/" + TRAIN_STATE) for k in keys)]
        if not done:
            return
        latest = max(done)
        for key in found[latest]:
            relative = key.split("/", 3)[3]
            self._remote(self.remote.get, key, work / relative)

    def push(self, arch: Architecture, number: int) -> None:
        """Copy what the attempt wrote since the last push to the bucket (nothing to do
        without one): each file whole, so a reader never sees half of it."""
        if self.remote is None:
            return
        work = self.attempt(arch, number)
        for path in sorted(p for p in work.rglob("*") if p.is_file() and ".tmp" not in p.name):
            stat = path.stat()
            if self._pushed.get(path) == (stat.st_mtime_ns, stat.st_size):
                continue
            relative = f"checkpoints/{arch.arch_id}/{number}/{path.relative_to(work).as_posix()}"
            self._remote(self.remote.put, path, relative)
            self._pushed[path] = (stat.st_mtime_ns, stat.st_size)

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

    def save_weights(self, storage: BaseStorage, trial_id: int, model: nn.Module) -> str:
        """Upload ``model``'s weights as an artifact of the trial; the artifact id."""
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            save_file(state, str(path))
            try:
                return upload_artifact(
                    artifact_store=self._store,
                    file_path=str(path),
                    study_or_trial=storage.get_trial(trial_id),
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

    def load_weights(self, artifact_id: str, *, trial: int) -> dict[str, torch.Tensor]:
        """The weights of artifact ``artifact_id`` (trial ``trial``'s, for errors)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            try:
                download_artifact(
                    artifact_store=self._store, file_path=str(path), artifact_id=artifact_id
                )
            except Exception as exc:
                raise ExportError(
                    f"the weights of trial {trial} are missing from {self.location} "
                    f"({type(exc).__name__}); was the artifacts folder moved or deleted?"
                ) from None
            return load_file(str(path))

    @cached_property
    def _store(self) -> Any:  # created on first use
        if self.remote is not None:
            return self.remote.artifact_store()
        self.folder.mkdir(parents=True, exist_ok=True)
        return FileSystemArtifactStore(str(self.folder))
