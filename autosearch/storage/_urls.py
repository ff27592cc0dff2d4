"""Storage URLs → Optuna storages, with errors that say which forms work.

Forms:
    sqlite:///relative/path.db, sqlite:////absolute/path.db   (default; one machine)
    journal:path/to/study.log                                  (several processes, one file)
    postgresql://user@host:port/database                       (many machines)

or an Optuna storage object that names one of them: ``RDBStorage(url, engine_kwargs=...)``
(its engine settings kept, for every worker) or ``JournalStorage(JournalFileBackend(path))``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from autosearch import _compat
from autosearch._files import NotReadable, check_regular
from autosearch.errors import StorageError, UnknownNameError
from autosearch.storage._journal import CheckedJournalFile
from autosearch.storage._paths import plain_name
from autosearch.storage._rdb import RDBStorage, idle_transaction_limit
from autosearch.workers._failpoints import failpoint
from autosearch.workers._heartbeat import heartbeat_settings

__all__ = [
    "URL_FORMS",
    "StorageTarget",
    "connection_lost",
    "default_storage",
    "end_trial",
    "local_path",
    "open_storage",
    "root_cause",
    "storage_target",
    "trial_number",
]

URL_FORMS = "sqlite:///path/study.db, journal:path/study.log or postgresql://user@host/db"
OBJECT_FORMS = "optuna.storages.RDBStorage(url, ...) or JournalStorage(JournalFileBackend(path))"


@dataclass(frozen=True)
class StorageTarget:
    """Where a study is stored, as every process of it opens it again: the URL, and the
    engine settings (SQLAlchemy's ``create_engine`` keywords) a user's ``RDBStorage``
    carried, applied over autosearch's own. Plain data: it travels to pool, Ray and
    Slurm workers."""

    url: str
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)


def storage_target(storage: object) -> StorageTarget:
    """``storage`` (a URL, an Optuna storage object, a target) as a :class:`StorageTarget`.

    Raises:
        StorageError: another kind of object, or a journal on a backend other than a
            file, saying which forms work.
    """
    if isinstance(storage, StorageTarget):
        return storage
    if isinstance(storage, str):
        return StorageTarget(storage)
    if isinstance(storage, optuna.storages.RDBStorage):
        kwargs = storage.engine_kwargs
        if not isinstance(kwargs, Mapping):
            raise StorageError(f"the RDBStorage's engine_kwargs must be a dict, got {kwargs!r}")
        return StorageTarget(storage.url, dict(kwargs))
    if isinstance(storage, optuna.storages.JournalStorage):
        path = _compat.journal_file(storage)
        if path is None:
            raise StorageError(
                "a JournalStorage is accepted on a JournalFileBackend (one file every worker "
                "opens); for another backend give a PostgreSQL or SQLite URL"
            )
        return StorageTarget(f"journal:{path}")
    raise StorageError(
        f"storage must be a URL ({URL_FORMS}) or a storage object ({OBJECT_FORMS}); "
        f"got {type(storage).__name__}"
    )


def _writable_file(path: Path, url: str) -> None:
    """Create the file's folder; refuse a folder we cannot write to, with the fix.

    A relative path is made under the working folder as deep as it goes (the default
    ``runs/NAME/study.db``); an absolute path may add only the file's own folder, so that
    a typo in a long path (``/data/studeis/x/study.db``) is refused, not silently made."""
    if path.exists() and not path.is_file():
        raise StorageError(f"storage {url!r} names {_kind(path)}, not a file: {path}")
    missing = path.parent.parent
    if path.is_absolute() and not missing.is_dir():
        raise StorageError(
            f"storage {url!r}: folder {missing} does not exist; check the path, or create "
            "it first (only the storage file's own folder is created)"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create the folder of storage {url!r}: {exc}") from None
    target = path if path.exists() else path.parent
    if not os.access(target, os.W_OK):
        raise StorageError(f"storage {url!r}: {target} is not writable; choose another path")


def _kind(path: Path) -> str:
    """What a path that is not a regular file is, in words."""
    try:
        check_regular(path)
    except NotReadable as exc:
        return exc.reason.removeprefix("is ").removesuffix(", not a regular file")
    return "a file"


def _existing(path: Path, url: str, *, write: bool = False) -> None:
    """Opening a stored study creates nothing: the file must be there, a regular file,
    readable (and ``write``: writable), and not empty."""
    try:
        size = path.stat().st_size
    except PermissionError:
        raise StorageError(
            f"storage {url!r}: permission denied on the folder of {path}; ask for read "
            "access, or copy the study somewhere you can read"
        ) from None
    except OSError:
        raise StorageError(
            f"storage {url!r}: {path} does not exist; check the path (or run the study first)"
        ) from None
    if not path.is_file():
        raise StorageError(f"storage {url!r} names {_kind(path)}, not a file: {path}")
    if not os.access(path, os.R_OK):
        raise StorageError(
            f"storage {url!r}: permission denied: {path} is not readable by this user; ask "
            "for read access (the file itself is not damaged)"
        )
    if size == 0:
        raise StorageError(f"storage {url!r}: {path} is empty (0 bytes), not a study's storage")
    if write and not os.access(path, os.W_OK):
        raise StorageError(
            f"storage {url!r}: {path} is not writable by this user; running trials writes "
            "to it (read it with `autosearch status`, or ask for write access)"
        )


def _read_only_uri(path: Path, url: str) -> str:
    """A SQLite URI that opens ``path`` without writing anything: read-only where its
    folder lets SQLite keep its shared-memory file (``-shm``, which a write-ahead-log
    database needs even to be read), else immutable, which needs none. An immutable
    reader would miss what a write-ahead log not yet merged holds, so that case is
    refused, saying how to merge it."""
    absolute = path.resolve()
    wal = absolute.with_name(absolute.name + "-wal")
    shm = absolute.with_name(absolute.name + "-shm")
    if os.access(absolute.parent, os.W_OK) or (shm.exists() and wal.exists()):
        return f"file:{quote(str(absolute))}?mode=ro"
    if wal.exists() and wal.stat().st_size > 0:
        raise StorageError(
            f"storage {url!r}: {path} is in a folder this user cannot write, and its "
            f"write-ahead log ({wal.name}) holds commits not yet merged into it; open the "
            "study once where its folder is writable (any autosearch command does), or "
            "copy the three files somewhere writable"
        )
    return f"file:{quote(str(absolute))}?immutable=1"


def _check_sqlite(path: Path, url: str, uri: str | None = None) -> None:
    """Refuse a damaged SQLite file before anything reads or writes it (SQLite's quick
    integrity check reads every page once); ``uri``: open it so (read-only)."""
    if not path.is_file() or path.stat().st_size == 0:
        return  # a new storage
    try:
        connect = sqlite3.connect(uri, timeout=60, uri=True) if uri else sqlite3.connect(path)
        with contextlib.closing(connect) as db:
            found = [row[0] for row in db.execute("PRAGMA quick_check(3)")]
    except sqlite3.DatabaseError as exc:
        found = [str(exc)]
    if found and "unable to open" in found[0]:
        raise StorageError(
            f"storage {url!r}: SQLite cannot open {path} ({found[0]}): check that this user "
            "may read it and its folder (the file is not necessarily damaged)"
        )
    if found != ["ok"]:
        raise StorageError(
            f"storage {url!r}: {path} is damaged or not a SQLite database "
            f"({' '.join('; '.join(found).split())}); restore it from a copy"
        )


def _sqlite(
    url: str, create: bool, write: bool, engine: Mapping[str, Any] | None = None
) -> BaseStorage:
    path = local_path(url)
    assert path is not None  # local_path knows every sqlite URL
    if write:
        if create:
            _writable_file(path, url)
        else:
            _existing(path, url, write=True)
        _check_sqlite(path, url)
        storage = _rdb(url, create=True, engine=engine)
        _pragmas(storage)
        return _cached(storage)
    # Read-only: nothing written, not even SQLite's own files where the folder forbids it.
    _existing(path, url)
    uri = _read_only_uri(path, url)
    _check_sqlite(path, url, uri)
    return _cached(_rdb(f"sqlite:///{uri}&uri=true", create=False, shown=url, engine=engine))


def _pragmas(storage: BaseStorage) -> None:
    """SQLite as the workers need it, on every connection:

    - write-ahead-log mode with normal syncing: readers no longer block the writer
      (several local workers share the file), and each of a trial's many small commits
      no longer waits for a full fsync. A crash can lose the last commits, never corrupt
      the file.
    - foreign keys enforced, as every database server enforces them: a study deleted
      while a worker writes under it is refused (and tried again, see
      ``RDBStorage.delete_study``) instead of leaving the worker's new rows behind,
      orphans a later study given the same id would inherit.
    """
    from sqlalchemy import event

    engine = storage.engine  # type: ignore[attr-defined]

    def on_connect(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    event.listen(engine, "connect", on_connect)
    engine.dispose()  # connections opened before the listener reconnect with it


def _rdb(
    url: str,
    *,
    create: bool,
    attempts: int = 8,
    shown: str | None = None,
    engine: Mapping[str, Any] | None = None,
) -> BaseStorage:
    r"""An RDB storage at ``url`` (``shown`` in errors, if given); ``engine``: a user's
    engine settings, over autosearch's own (``connect_args`` merged key by key).

    Workers started together race to create Optuna's schema (on PostgreSQL two
    ``CREATE TABLE``\ s of one name collide on a unique index): a collision is retried
    against the schema the winner made; any other failure (a server that cannot be
    reached, a wrong password) is said at once, with the driver's own words. So is a
    connection the server cut while it opened (an administrator's
    ``pg_terminate_backend``, a restart): opened again."""
    for attempt in range(attempts):
        try:
            storage = RDBStorage(
                url, engine_kwargs=_engine_kwargs(url, engine), skip_table_creation=not create
            )
            if not create:
                storage.get_all_studies()  # a database without Optuna's tables fails here
            return storage
        except ImportError as exc:
            raise StorageError(
                f"storage {shown or url!r} needs a database driver that is not installed "
                f"({exc}); for PostgreSQL: pip install 'autosearch-nas[postgres]'"
            ) from None
        except Exception as exc:  # SQLAlchemy raises many types; all mean "unusable"
            cause = root_cause(exc)
            lost = connection_lost(exc)
            if lost is not None and attempt == attempts - 1:
                raise StorageError(
                    f"cannot open storage {shown or url!r}: the connection to the database "
                    f"was lost {attempts} times while opening it ({lost}); run the same "
                    "command again"[:500]
                ) from None
            if lost is None and (not _collided(cause) or attempt == attempts - 1):
                first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
                again = "; it kept colliding with other workers: try again" if attempt else ""
                raise StorageError(
                    f"cannot open storage {shown or url!r}: {type(cause).__name__}: {first}{again}"
                ) from None
            time.sleep(0.1 * (attempt + 1))
    raise AssertionError("unreachable")  # the loop returns or raises


_DROPPED = ("AdminShutdown", "OperationalError")


def connection_lost(exc: BaseException) -> str | None:
    """The first line of a dropped database connection among ``exc``'s causes (the
    server shut it, or it closed), or None."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return None
        invalidated = getattr(seen, "connection_invalidated", False)
        said = any(w in str(seen) for w in ("terminating connection", "server closed"))
        # SQLAlchemy's word for a statement on a connection invalidated mid-transaction.
        reconnect = type(seen).__name__ == "PendingRollbackError" and "reconnect" in str(seen)
        if reconnect or invalidated or (type(seen).__name__ in _DROPPED and said):
            return f"{type(seen).__name__}: {str(seen).strip().splitlines()[0]}"
        seen = seen.__cause__ or seen.__context__
    return None


def root_cause(exc: BaseException) -> BaseException:
    """The error an exception wraps (Optuna wraps SQLAlchemy's, which wraps the
    driver's): the outermost SQLAlchemy error in the chain, else the innermost error."""
    from sqlalchemy.exc import SQLAlchemyError

    found = exc
    for _ in range(10):
        if isinstance(found, SQLAlchemyError) or found.__cause__ is None:
            break
        found = found.__cause__
    return found


_COLLISIONS = ("already exists", "duplicate key", "deadlock", "database is locked", "serialize")


def _collided(exc: BaseException) -> bool:
    """Whether opening failed because another worker wrote the schema at the same time."""
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    if isinstance(exc, IntegrityError):
        return True
    text = str(exc).lower()
    return isinstance(exc, OperationalError | ProgrammingError) and any(
        word in text for word in _COLLISIONS
    )


def _engine_kwargs(url: str, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """autosearch's engine settings for ``url``, with ``given`` (a user's) over them."""
    ours = _own_engine_kwargs(url)
    given = dict(given or {})
    connect = {**dict(ours.get("connect_args") or {}), **dict(given.pop("connect_args", {}) or {})}
    merged = {**ours, **given}
    if connect:
        merged["connect_args"] = connect
    return merged


def _own_engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        # Several local workers share the file: wait for the lock instead of failing.
        return {"connect_args": {"timeout": 60}}
    if url.startswith("postgresql"):
        # A worker paused inside a transaction (SIGSTOP, a swapped-out machine) would hold
        # its rows for as long as it stays paused, and every worker that takes its trial
        # over would wait on them: the server ends such a session after the heartbeat's
        # grace (its late commit then fails, and it says so), releasing the rows.
        idle = int(idle_transaction_limit(heartbeat_settings()[1]) * 1000)
        options = f"-c idle_in_transaction_session_timeout={idle}"
        return {"pool_pre_ping": True, "connect_args": {"options": options}}
    return {"pool_pre_ping": True}


def _journal(
    url: str, create: bool, write: bool, engine: Mapping[str, Any] | None = None
) -> BaseStorage:
    path = local_path(url)
    assert path is not None
    if create and write:
        _writable_file(path, url)
    else:
        _existing(path, url, write=write)
    try:
        return optuna.storages.JournalStorage(CheckedJournalFile(str(path)))
    except Exception as exc:  # a line that is not a journal record (JSON), a bad record
        raise StorageError(
            f"storage {url!r}: {path} is damaged or not an Optuna journal "
            f"({type(exc).__name__}: {exc}); restore it from a copy"
        ) from None


def _server(
    url: str, create: bool, write: bool, engine: Mapping[str, Any] | None = None
) -> BaseStorage:
    return _cached(_rdb(url, create=write, engine=engine))


def _cached(storage: BaseStorage) -> BaseStorage:
    """The RDB storage behind Optuna's own cache (what ``optuna.create_study(storage=
    URL)`` uses): finished trials never change, so reading a study's trials fetches
    only those still running and those created since the last read, not the whole
    study, and a study's cost per trial does not grow with its size."""
    return optuna.storages.get_storage(storage)


def close_storage(storage: BaseStorage) -> None:
    """Close ``storage``'s database connections now (a command that failed does not
    keep a SQLite file open, with its write-ahead log and shared-memory files beside it,
    until the garbage collector runs)."""
    engine = getattr(database(storage), "engine", None)
    if engine is not None:
        engine.dispose()


def trial_number(storage: BaseStorage, trial_id: int) -> int:
    """The number of a trial this process created. Optuna's cache records it when the
    trial is created (id -> study, number), but its ``get_trial_number_from_id`` asks the
    database again: read the cache where there is one."""
    cached = getattr(storage, "_trial_id_to_study_id_and_number", {}).get(trial_id)
    return int(cached[1]) if cached else storage.get_trial_number_from_id(trial_id)


def database(storage: BaseStorage) -> BaseStorage:
    """The storage behind Optuna's cache (the storage itself where there is none): what
    it answers, the database says now. A journal's ``_backend`` is its log file, not a
    storage: the journal answers for itself."""
    behind = getattr(storage, "_backend", None)
    return behind if isinstance(behind, BaseStorage) else storage


def end_trial(
    storage: BaseStorage,
    trial_id: int,
    user_attrs: dict[str, Any],
    state: TrialState,
    values: list[float] | None = None,
    *,
    lock_wait: float | None = None,
) -> None:
    """Set a running trial's ``user_attrs`` and end it: in one transaction on a database
    (all stored or none; autosearch.storage._rdb), else one write each, the state
    last. ``lock_wait``: another worker's trial is taken over; on a database, wait at
    most this long for its row (:class:`~autosearch.storage._rdb.TrialLocked`)."""
    backend = database(storage)
    failpoint("end_trial.before")
    if isinstance(backend, RDBStorage):
        backend.finish_trial(
            trial_id, user_attrs=user_attrs, state=state, values=values, lock_wait=lock_wait
        )
    else:
        for key, value in user_attrs.items():
            storage.set_trial_user_attr(trial_id, key, value)
        failpoint("end_trial.inside")  # half written: the attributes, not the state
        storage.set_trial_state_values(trial_id, state, values)
    failpoint("end_trial.after")


_SCHEMES: dict[str, Callable[[str, bool, bool, Mapping[str, Any] | None], BaseStorage]] = {
    "sqlite": _sqlite,
    "journal": _journal,
    "postgresql": _server,
    "mysql": _server,
}


def open_storage(
    url: str | StorageTarget, *, create: bool = True, write: bool = True
) -> BaseStorage:
    """An Optuna storage for ``url`` (or a :class:`StorageTarget`: a URL with engine
    settings); a bad URL raises StorageError saying what works.

    ``create=False`` opens a stored study's storage: a missing, empty or unusable file
    is refused, and no file or folder is made. ``write=False`` (read-only, implies
    ``create=False``) also changes nothing in it (no schema or journal mode written).
    A damaged file is refused, naming it, either way."""
    engine: Mapping[str, Any] | None = None
    if isinstance(url, StorageTarget):
        target = url
        url, engine = target.url, target.engine_kwargs
    if engine and not (url.startswith(("sqlite", "postgresql", "mysql"))):
        raise StorageError(f"storage {url!r}: engine settings apply to a database URL only")
    if not isinstance(url, str) or ":" not in url:
        raise StorageError(f"storage URL {url!r} has no scheme; use {URL_FORMS}")
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    opener = _SCHEMES.get(scheme)
    if opener is None:
        raise StorageError(
            str(UnknownNameError("storage scheme", scheme, _SCHEMES)) + f" Forms: {URL_FORMS}."
        )
    if scheme == "sqlite" and not url.startswith("sqlite:///"):
        raise StorageError(
            f"SQLite URL {url!r} needs three slashes: sqlite:///relative.db "
            "or sqlite:////absolute/path.db"
        )
    if scheme == "journal" and not url[len("journal:") :]:
        raise StorageError(f"journal URL {url!r} names no file; use journal:path/study.log")
    return opener(url, create and write, write, engine)


def default_storage(name: str) -> str:
    """Study ``name``'s storage when none is given: a SQLite file under runs/NAME/.

    Raises:
        StorageError: the name cannot name a folder (a slash, ``..``): name the storage.
    """
    if not plain_name(name):
        raise StorageError(
            f"study {_short(name)} has no default storage: {_not_a_folder(name)}, so it "
            "cannot name the folder runs/NAME/; give storage= (sqlite:///path/study.db), or "
            "another name"
        )
    return f"sqlite:///runs/{name}/study.db"


def _not_a_folder(name: str) -> str:
    """Why ``name`` cannot be one folder's name."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if any(c in name for c in "/\\\x00"):
        return "its name holds '/', '\\' or NUL"
    if name in ("", ".", ".."):
        return f"its name is {name!r}"
    return f"its name is {size} bytes long, and a folder's name holds at most 255"


def _short(name: str) -> str:
    return repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name)} characters)"


def local_path(url: str) -> Path | None:
    """The file behind a sqlite or journal URL (None for server storages)."""
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///") :])
    if url.startswith("journal:"):
        return Path(url[len("journal:") :])
    return None
