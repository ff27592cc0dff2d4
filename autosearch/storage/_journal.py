"""A journal file that only grows, checked at every read and append.

Optuna's journal backend remembers where each record starts and reads on from there;
a file cut short (or replaced) under a running worker gives it nothing to read, and
its next records are appended after half a line: the worker goes on, reports trials
it could not store, and the journal cannot be read again. Here every read and append
first checks that the file is the one this process read (the same inode), no shorter
than it was, and that what this process read still ends where it did; otherwise the
worker stops with :class:`~autosearch.errors.PlatformError` naming the file, before
anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

from optuna.storages.journal import JournalFileBackend

from autosearch.errors import PlatformError

__all__ = ["CheckedJournalFile"]

# How many bytes of its start, and before the end of what this process has seen, it
# keeps: to tell a file rewritten (to the same length or longer) from one that grew.
_HEAD, _TAIL = 4096, 64


class CheckedJournalFile(JournalFileBackend):
    """Optuna's journal file, refusing one that shrank or was replaced under it."""

    def __init__(self, file_path: str) -> None:
        super().__init__(file_path)
        self._inode: int | None = None
        self._seen = 0  # bytes of the file this process knows are there
        self._marks: tuple[bytes, bytes] | None = None

    def read_logs(self, log_number_from: int) -> Generator[dict[str, Any], None, None]:
        self._check()
        try:
            yield from super().read_logs(log_number_from)
        except ValueError as exc:  # a torn or foreign line (JSONDecodeError is a ValueError)
            self._check()  # cut or rewritten since the check above: say that
            raise self._lost(f"holds a line that is not a journal record ({exc})") from None
        self._remember()

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self._check()
        super().append_logs(logs)
        self._remember()

    def _check(self) -> os.stat_result | None:
        """The file's state now, refused where it is not the file this process saw grow."""
        try:
            stat = os.stat(self._file_path)
        except FileNotFoundError:
            if self._inode is None:
                return None  # made on the first append, as Optuna does
            raise self._lost("was deleted") from None
        if self._inode is None:
            return stat
        if stat.st_ino != self._inode:
            raise self._lost("was replaced by another file")
        if stat.st_size < self._seen:
            raise self._lost(f"shrank from {self._seen} to {stat.st_size} bytes")
        if self._marks is not None and self._read_marks() != self._marks:
            raise self._lost("was rewritten")
        return stat

    def _remember(self) -> None:
        """What this process has now seen of the file, from the same look that checks it
        again: a cut or a rewrite that landed during the read or the write (after the
        check before it) is caught here, never remembered as the file's new length."""
        stat = self._check()
        if stat is None:
            return
        self._inode, self._seen = stat.st_ino, stat.st_size
        self._marks = self._read_marks()

    def _read_marks(self) -> tuple[bytes, bytes]:
        """The file's first bytes and the last it had when this process saw it."""
        with open(self._file_path, "rb") as file:
            head = file.read(min(self._seen, _HEAD))
            file.seek(max(self._seen - _TAIL, 0))
            return head, file.read(min(self._seen, _TAIL))

    def _lost(self, what: str) -> PlatformError:
        return PlatformError(
            f"journal {self._file_path} {what} while this worker used it: records it holds "
            "may be lost, so the worker stops before writing more; restore the journal from "
            "a copy and run again"
        )
