"""What a study stores of its live tracking: an MLflow tracking URI, a TensorBoard
folder, or both (a study user attribute, read by every process that runs its trials)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.storages import BaseStorage

from autosearch.errors import ConfigError

__all__ = ["ATTR", "Tracking", "store", "stored"]

ATTR = "autosearch:tracking"  # the study user attribute that holds it


@dataclass(frozen=True)
class Tracking:
    """Where a study's trials are shown while they run.

    Attributes:
        mlflow: An MLflow tracking URI (``sqlite:///mlflow.db``, ``http://host:5000``, a
            database file's path ``runs/mlflow.db``), or True for MLflow's own default
            (``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``). A folder (MLflow's
            file store, which MLflow 3 no longer writes to) is refused. One experiment
            per study, named as the study; one run per study, and one per trial nested
            under it.
        tensorboard: A folder: ``FOLDER/STUDY/trial-NNNNN`` per trial, ``supernet`` and
            ``front`` beside them (``tensorboard --logdir FOLDER``).

    Local paths are made absolute where the study is opened, so that every worker of
    the study writes to the same place.
    """

    mlflow: str | None = None
    tensorboard: str | None = None

    def __post_init__(self) -> None:
        for name in ("mlflow", "tensorboard"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(
                    f"Tracking({name}={value!r}): expected a non-empty string"
                    + (" (or True for MLflow's default)" if name == "mlflow" else " (a folder)")
                )

    @classmethod
    def of(
        cls, mlflow: str | bool | None = None, tensorboard: str | Path | None = None
    ) -> Tracking:
        """The settings as given by a user (True: MLflow's default URI), resolved:
        local paths absolute, and each tool checked to be installed.

        Raises:
            ConfigError: a tool that is not installed, or a setting of the wrong type.
        """
        if mlflow is True:
            _require("mlflow", "mlflow")
            import mlflow as _mlflow

            mlflow = _mlflow.get_tracking_uri()
        elif mlflow is False:
            mlflow = None
        elif mlflow is not None:
            if not isinstance(mlflow, str) or not mlflow.strip():
                raise ConfigError(
                    f"mlflow={mlflow!r}: expected a tracking URI (sqlite:///mlflow.db, "
                    "http://host:5000) or True for MLflow's default"
                )
            _check_scheme(mlflow)
            _require("mlflow", "mlflow")
        if tensorboard is not None:
            if not isinstance(tensorboard, (str, Path)) or not str(tensorboard).strip():
                raise ConfigError(f"tensorboard={tensorboard!r}: expected a folder")
            folder = Path(tensorboard).expanduser().absolute()
            if folder.exists() and not folder.is_dir():
                raise ConfigError(f"tensorboard={str(tensorboard)!r} is not a folder: give one")
            _require("tensorboard", "tensorboard")
            tensorboard = str(folder)
        return cls(mlflow=_absolute(mlflow) if mlflow else None, tensorboard=tensorboard)

    def changed(
        self, *, mlflow: str | bool | None = None, tensorboard: str | Path | bool | None = None
    ) -> Tracking:
        """These settings with those given changed (None: kept; False: off), resolved
        as :meth:`of` resolves them."""
        mlflow = self.mlflow if mlflow is None else (None if mlflow is False else mlflow)
        board = self.tensorboard if tensorboard is None else tensorboard
        if board is True:
            raise ConfigError("tensorboard=True: give the folder to write to (False: off)")
        return Tracking.of(mlflow=mlflow, tensorboard=None if board is False else board)

    def check_apart(self, storage: str) -> None:
        """Refuse an MLflow store that is the study's own storage (``storage``): MLflow
        and Optuna would each take the other's tables for an old version of theirs."""
        if self.mlflow is not None and self.mlflow == _absolute(storage):
            raise ConfigError(
                f"mlflow={self.mlflow!r} is the study's own storage: give MLflow a store of "
                "its own (sqlite:///mlflow.db beside it, or a server)"
            )

    @property
    def on(self) -> bool:
        return self.mlflow is not None or self.tensorboard is not None

    def to_json(self) -> dict[str, Any]:
        return {"mlflow": self.mlflow, "tensorboard": self.tensorboard}

    @classmethod
    def from_json(cls, stored: Any) -> Tracking:
        """The stored settings; nothing on where they do not read as settings."""
        if not isinstance(stored, Mapping):
            return cls()
        fields = {k: stored.get(k) for k in ("mlflow", "tensorboard")}
        return cls(**{k: v for k, v in fields.items() if isinstance(v, str) and v.strip()})

    def __str__(self) -> str:
        said = [f"MLflow at {self.mlflow}"] if self.mlflow else []
        said += [f"TensorBoard in {self.tensorboard}"] if self.tensorboard else []
        return " and ".join(said) or "no tracking"


def stored(storage: BaseStorage, study_id: int) -> Tracking:
    """The tracking stored with a study (off where none is, or it does not read)."""
    return Tracking.from_json(storage.get_study_user_attrs(study_id).get(ATTR))


def store(storage: BaseStorage, study_id: int, tracking: Tracking) -> None:
    storage.set_study_user_attr(study_id, ATTR, tracking.to_json())


# Tracking URI schemes MLflow takes (a database's with its driver: postgresql+psycopg).
_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql", "databricks",
            "databricks-uc", "uc")  # fmt: skip


def _check_scheme(uri: str) -> None:
    scheme = uri.partition("://")[0].split("+")[0].lower() if "://" in uri else ""
    if scheme and scheme not in _SCHEMES:
        raise ConfigError(
            f"mlflow={uri!r}: unknown MLflow tracking URI scheme {scheme!r}; use one of "
            f"{', '.join(k for k in _SCHEMES if k != 'file')}"
        )
    if uri.startswith(("databricks", "uc")) and not scheme:
        return  # a profile's name: databricks, databricks://profile, uc
    path = uri.removeprefix("file://") if scheme == "file" else uri if not scheme else None
    if path is not None and (scheme == "file" or not path.endswith(_DATABASE_FILES)):
        raise ConfigError(
            f"mlflow={uri!r} is a folder (MLflow's file store), which MLflow 3 no longer "
            f"tracks to: use a database, e.g. sqlite:///{_folder_hint(path)}/mlflow.db, or a "
            "server (http://host:5000)"
        )


# A bare path with one of these endings names an SQLite file: tracked as sqlite:///PATH.
_DATABASE_FILES = (".db", ".sqlite", ".sqlite3")


def _folder_hint(path: str) -> str:
    return str(Path(os.path.expanduser(path or ".")).absolute())


def _require(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"tracking to {module} needs the {module} package: "
            f"pip install 'autosearch-nas[{extra}]'"
        )


def _absolute(uri: str) -> str:
    """A tracking URI whose local path is absolute (``sqlite:///x.db`` relative to this
    folder; a plain folder), so that workers elsewhere find the same store."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path = uri.removeprefix("sqlite:///")
        if path and path != ":memory:":
            return "sqlite:///" + str(Path(os.path.expanduser(path)).absolute())
    if "://" not in uri and uri.endswith(_DATABASE_FILES):
        return "sqlite:///" + str(Path(uri).expanduser().absolute())
    return uri
