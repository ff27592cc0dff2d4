"""A population's state in its folder, shared by every worker that trains it.

``population.json`` holds what the population is (its definition), each member's
settings, epoch, scores and schedule (the settings it trained with, epoch by epoch,
along its lineage), every round's exploits, and which worker trains which member now.
It is read and written only under an exclusive lock (``population.lock``, ``flock``),
and written whole (a temporary file renamed), so a worker killed at any point leaves
it as it was before or after one change, never half of one. Each member's training
checkpoint is ``members/ID/train.pt``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autosearch.errors import ConfigError, PlatformError
from autosearch.workers._heartbeat import gone, this_process

__all__ = ["Ledger", "State"]

VERSION = 1
State = dict[str, Any]


@dataclass(frozen=True)
class Ledger:
    """The folder of one population."""

    folder: Path

    @property
    def path(self) -> Path:
        return self.folder / "population.json"

    def checkpoint(self, member: int) -> Path:
        return self.folder / "members" / str(member) / "train.pt"

    @contextlib.contextmanager
    def locked(self) -> Iterator[State]:
        """The state, under the lock; what the block leaves in it is written whole
        when it ends without an exception."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            handle = (self.folder / "population.lock").open("a+")
        except OSError as exc:
            raise PlatformError(
                f"cannot use the population folder {self.folder}: {exc.strerror or exc}"
            ) from None
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            state = self._read()
            before = json.dumps(state, sort_keys=True)
            yield state
            if json.dumps(state, sort_keys=True) != before:
                self._write(state)

    def read(self) -> State:
        """The state now (a snapshot, for reading only)."""
        with self.locked() as state:
            return json.loads(json.dumps(state))

    def _read(self) -> State:
        if not self.path.is_file():
            return {}
        try:
            state = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise PlatformError(
                f"{self.path} cannot be read ({exc}): the population's record is damaged; "
                "restore it from a backup or train the population in a new folder"
            ) from None
        if not isinstance(state, dict) or state.get("version") != VERSION:
            raise ConfigError(
                f"{self.path} is not a population this version of autosearch wrote; "
                "train the population in a new folder"
            )
        return state

    def _write(self, state: State) -> None:
        tmp = self.path.with_name(f"population.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as exc:
            raise PlatformError(f"cannot write {self.path}: {exc.strerror or exc}") from None


def claim(state: State, member: int, worker: str) -> None:
    """Mark ``member`` as trained by ``worker`` (this process) from now."""
    state["claims"][str(member)] = {
        "worker": worker,
        "process": this_process(),
        "host": socket.gethostname(),
        "beat": time.time(),
    }


def held(state: State, member: int, grace: float) -> bool:
    """Whether a live worker trains ``member``: a claim whose process is not known to
    be gone and that beat within ``grace`` seconds."""
    record = state["claims"].get(str(member))
    if record is None:
        return False
    return not gone(record.get("process")) and time.time() - record["beat"] <= grace
