"""A study in MLflow: one experiment named as the study, one run for the study, and one
run per trial nested under it (``mlflow.parentRunId``), found again by tags, so that a
trial resumed by any worker, on any machine, continues its run.

Every method here is called in the tracking thread (``_sender``) and talks to MLflow
through its own client (``MlflowClient``), never through MLflow's process-wide active
run, which stays the user's."""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

try:
    import fcntl
except ImportError:  # Windows: no lock (one process per SQLite store there)
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

__all__ = ["MLflowRuns", "metric_key"]

T = TypeVar("T")

UID, ROLE, KEY, TRIAL = "autosearch.uid", "autosearch.role", "autosearch.key", "autosearch.trial"
_BAD = re.compile(r"[^\w.\- /:]")  # what MLflow refuses in a metric or parameter name
# What MLflow's web page opens an experiment on: its runs (not GenAI traces).
_KIND = "mlflow.experimentKind"
_TRIES = 6  # a SQLite store that several workers write: "database is locked" retried


def metric_key(name: str) -> str:
    """``name`` as MLflow takes it (``prune-l1@0.5.accuracy`` → ``prune-l1_0.5.accuracy``)."""
    return _BAD.sub("_", name)[:250]


class MLflowRuns:
    """The runs of study ``study`` (creation id ``uid``) at tracking URI ``uri``."""

    def __init__(self, uri: str, study: str, uid: str) -> None:
        self.uri, self.study, self.uid = uri, study, uid
        self._client: MlflowClient | None = None
        self._experiment = ""
        self._study_run: str | None = None
        self._runs: dict[str, str] = {}  # a trial's key → its run id

    # -- the experiment and the study's run ----------------------------------------------

    def client(self) -> MlflowClient:
        if self._client is None:
            _probe(self.uri)
            from mlflow.tracking import MlflowClient

            # One process of a machine at a time makes a new SQLite store, or brings an
            # old one's tables up to this MLflow (MLflow does that as it opens one).
            with _sqlite_lock(self.uri):
                _made_whole(self.uri)
                try:
                    client = MlflowClient(tracking_uri=self.uri)  # opens the store
                    self._experiment = _retry(lambda: self._find_experiment(client))
                except Exception as exc:
                    if "already exists" in str(exc) and self.uri.startswith("sqlite:///"):
                        raise _half_made(self.uri) from exc
                    raise
            self._client = client
        return self._client

    def _find_experiment(self, client: MlflowClient) -> str:
        found = client.get_experiment_by_name(self.study)
        if found is not None:
            if found.lifecycle_stage == "deleted":
                client.restore_experiment(found.experiment_id)
            return str(found.experiment_id)
        try:
            return str(
                client.create_experiment(
                    self.study,
                    artifact_location=_artifacts_beside(self.uri),
                    tags={UID: self.uid, _KIND: "custom_model_development"},
                )
            )
        except Exception:  # made meanwhile by another worker
            found = client.get_experiment_by_name(self.study)
            if found is None:
                raise
            return str(found.experiment_id)

    def study_run(self, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        """The study's run (made by the first worker that tracks the study), RUNNING."""
        if self._study_run is None:
            client = self.client()
            run, made = self._one_run({ROLE: "study"}, name=self.study, tags=tags)
            if made:
                _retry(lambda: client.log_batch(run, params=_params(params)))
            else:  # ended by an earlier run of the study: running again
                _retry(lambda: client.update_run(run, status="RUNNING"))
            self._study_run = run
        return self._study_run

    def study_ended(self, status: str = "FINISHED") -> None:
        """The study's run ended: found where this process did not start it (a pool's
        parent, whose workers ran the trials)."""
        run = self._study_run or self._oldest({ROLE: "study"})
        if run is not None:
            client = self.client()
            _retry(lambda: client.set_terminated(run, status=status))

    # -- a trial's run ----------------------------------------------------------------

    def trial_started(
        self,
        key: str,
        name: str,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        study: tuple[Mapping[str, Any], Mapping[str, str]],
        *,
        first: bool = False,
    ) -> None:
        """The trial's run (made, or found where an earlier attempt made it: not looked
        for on its ``first`` attempt), RUNNING, its parameters logged once, ``tags`` set.
        One worker holds a trial at a time (its claim), so no other makes its run."""
        client = self.client()
        parent = self.study_run(*study)
        nested = {**tags, "mlflow.parentRunId": parent}
        found = None if first else self._oldest({KEY: key})
        if found is None:
            run = self._create(name, {**nested, KEY: key})
            _retry(lambda: client.log_batch(run, params=_params(params)))
        else:
            run = found
            logged = client.get_run(run).data.params
            fresh = {k: v for k, v in params.items() if metric_key(k) not in logged}
            tag_list = _tags(nested)
            _retry(lambda: client.log_batch(run, params=_params(fresh), tags=tag_list))
            _retry(lambda: client.update_run(run, status="RUNNING", name=name))
        self._runs[key] = run

    def log(
        self,
        key: str,
        metrics: Mapping[str, float],
        step: int | None = None,
        tags: Mapping[str, str] | None = None,
        *,
        points: Sequence[tuple[Mapping[str, float], int, int]] = (),
    ) -> None:
        """Metrics (at ``step``), earlier ``points`` (metrics, step, time in ms) and
        tags of the run of ``key``, in one call."""
        from mlflow.entities import Metric

        run, client = self._run(key), self.client()
        if run is None:
            return
        now = int(time.time() * 1000)
        batch = [
            Metric(metric_key(k), float(v), at, point_step)
            for values, point_step, at in [*points, (metrics, step or 0, now)]
            for k, v in values.items()
            if _finite_number(v)
        ]
        _retry(lambda: client.log_batch(run, metrics=batch, tags=_tags(tags or {})))

    def trial_ended(
        self,
        key: str,
        status: str,
        metrics: Mapping[str, float],
        tags: Mapping[str, str],
        texts: Mapping[str, str],
        points: Sequence[tuple[Mapping[str, float], int, int]] = (),
        earlier: Sequence[tuple[Mapping[str, float], int, int]] = (),
    ) -> None:
        """Its last figures (with epochs' ``points`` not yet sent, and of the ``earlier``
        epochs of attempts it resumed, those the run lacks), tags and small text
        artifacts (``arch.json``), then its status: FINISHED, FAILED or KILLED."""
        run, client = self._run(key), self.client()
        if run is None:
            return
        if earlier:
            have = {m.step for m in _retry(lambda: client.get_metric_history(run, "val_accuracy"))}
            points = [*(p for p in earlier if p[1] not in have), *points]
        self.log(key, metrics, tags=tags, points=points)
        for path, text in texts.items():
            client.log_text(run, text, path)
        _retry(lambda: client.set_terminated(run, status=status))

    def trial_or_export_run(self, trial: int | None) -> str:
        """The run of trial ``trial`` (where the study was tracked when it ran), else a
        run ``export trial N`` of its own, nested under the study's run if there is one:
        where an export of the trial is logged as a model."""
        found = self._oldest({TRIAL: str(trial)}) if trial is not None else None
        if found is not None:
            return found
        study_run = self._oldest({ROLE: "study"})
        tags = {ROLE: "export", TRIAL: str(trial)}
        if study_run is not None:
            tags["mlflow.parentRunId"] = study_run
        return self._create(f"export trial {trial}", tags)

    def _run(self, key: str) -> str | None:
        """The run of ``key``; one this process did not start is looked up (none where
        tracking was off when its trial ran: nothing is logged then, no stray run made)."""
        if key not in self._runs:
            found = self._oldest({KEY: key})
            if found is None:
                return None
            self._runs[key] = found
        return self._runs[key]

    def _create(self, name: str, tags: Mapping[str, str]) -> str:
        """A new run of this study's experiment, tagged with the study's creation id."""
        client = self.client()
        tags = {**tags, UID: self.uid}
        made = _retry(lambda: client.create_run(self._experiment, run_name=name, tags=tags))
        return str(made.info.run_id)

    def _one_run(
        self, match: Mapping[str, str], *, name: str, tags: Mapping[str, str]
    ) -> tuple[str, bool]:
        """The oldest run of this study tagged ``match``; made when there is none
        (where two workers make one at once, the younger is deleted): its id, and
        whether this call made it."""
        client = self.client()
        found = self._oldest(match)
        if found is not None:
            return found, False
        mine = self._create(name, {**tags, **match})
        oldest = self._oldest(match)
        if oldest is not None and oldest != mine:
            _retry(lambda: client.delete_run(mine))
            return oldest, False
        return mine, True

    def _oldest(self, match: Mapping[str, str]) -> str | None:
        client = self.client()
        where = " and ".join(
            f"tags.`{k}` = '{_quoted(v)}'" for k, v in {**match, UID: self.uid}.items()
        )
        runs = _retry(
            lambda: client.search_runs(
                [self._experiment],
                filter_string=where,
                order_by=["attributes.start_time ASC"],
                max_results=50,
            )
        )
        if not runs:
            return None
        first = min(runs, key=lambda r: (r.info.start_time, r.info.run_id))
        return str(first.info.run_id)


def _probe(uri: str) -> None:
    """A tracking server that does not answer, said at once (MLflow's own client would
    retry for minutes)."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5):
            pass
    except urllib.error.HTTPError:
        return  # it answers (a server behind a path or a proxy may lack /health)
    except OSError as exc:
        raise ConnectionError(f"{uri} does not answer ({getattr(exc, 'reason', exc)})") from None


def _artifacts_beside(uri: str) -> str | None:
    """A SQLite store's artifacts in ``mlartifacts`` beside its file; elsewhere MLflow's
    default for the store."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None


def _retry(call: Callable[[], T]) -> T:
    """``call()``, tried again while a SQLite store is locked by another writer."""
    for attempt in range(_TRIES):
        try:
            return call()
        except Exception as exc:
            if "locked" not in str(exc) or attempt == _TRIES - 1:
                raise
            time.sleep(0.1 * 2**attempt)
    raise AssertionError("unreachable")


def _made_whole(uri: str) -> None:
    """A new SQLite store, made whole before any process opens it. MLflow makes a store's
    tables in many statements, and a process stopped midway leaves one that MLflow can
    never open again; so the tables are made in a file of this process's own beside the
    store, which is then linked in under the store's name at once (never over a store
    that is there). Called under the store's lock (``_sqlite_lock``)."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri.removeprefix("sqlite:///"))
    if path.exists():
        return
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    making = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.making")
    try:
        store = SqlAlchemyStore(f"sqlite:///{making}", _artifacts_beside(uri))
        store.engine.dispose()
        getattr(SqlAlchemyStore, "_engine_map", {}).pop(f"sqlite:///{making}", None)
        try:
            os.link(making, path)
        except FileExistsError:  # made meanwhile by a process that takes no lock
            pass
    finally:
        making.unlink(missing_ok=True)
    _drop_stale(path)


def _drop_stale(path: Path) -> None:
    """Files left by makers of the store at ``path`` that were stopped midway (a day old:
    no making takes that long)."""
    for left in path.parent.glob(f".{path.name}.*.making"):
        try:
            if time.time() - left.stat().st_mtime > 86400:
                left.unlink()
        except OSError:
            pass


def _half_made(uri: str) -> RuntimeError:
    path = uri.removeprefix("sqlite:///")
    return RuntimeError(
        f"the MLflow store {path} is half made: its tables were being made when the "
        "process making them stopped, and MLflow cannot finish them. Move it aside "
        f"(mv {path} {path}.half-made); the study makes a new store and tracks from then on"
    )


@contextmanager
def _sqlite_lock(uri: str) -> Iterator[None]:
    """Held while this process first opens a SQLite store: a lock file beside it (let go
    by the kernel if its holder dies)."""
    if not uri.startswith("sqlite:///") or fcntl is None:
        yield
        return
    path = Path(uri.removeprefix("sqlite:///"))
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _params(params: Mapping[str, Any]) -> list[Any]:
    from mlflow.entities import Param

    return [Param(metric_key(k), str(v)[:6000]) for k, v in sorted(params.items())]


def _tags(tags: Mapping[str, str]) -> list[Any]:
    from mlflow.entities import RunTag

    return [RunTag(k, str(v)[:8000]) for k, v in sorted(tags.items())]


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _finite_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value == value
        and abs(value) != float("inf")
    )
