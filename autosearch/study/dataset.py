"""A study's data: loaded and cleaned once, when something first needs it (opening a
study to read its results loads nothing), with its content hash."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from autosearch.data import Dataset, load_data
from autosearch.errors import StudyError
from autosearch.study.definition import StudyDefinition

__all__ = ["StudyData"]


class StudyData:
    """The data of study ``name``: ``spec`` as stored (``"digits"``, ``"arrays:HASH"``),
    the ``seed`` of its split, and the ``(images, labels)`` arrays a study made from
    arrays needs again (``source``). ``loaded``: the dataset, if it is loaded already.
    A table study (``table=True``) trains on nothing."""

    def __init__(
        self,
        *,
        name: str,
        spec: str,
        seed: int,
        source: tuple[Any, Any] | None = None,
        loaded: Dataset | None = None,
        table: bool = False,
    ) -> None:
        self.name, self.spec, self.seed, self.source = name, spec, seed, source
        self.table = table
        if loaded is not None:
            self.__dict__["dataset"] = loaded

    @classmethod
    def of(
        cls,
        definition: StudyDefinition,
        *,
        name: str,
        source: tuple[Any, Any] | None = None,
        loaded: Dataset | None = None,
    ) -> StudyData:
        """The data a stored study's ``definition`` names."""
        return cls(
            name=name,
            spec=definition.data,
            seed=definition.seed,
            source=source,
            loaded=loaded,
            table=definition.table is not None,
        )

    @cached_property
    def dataset(self) -> Dataset:
        """The dataset, loaded on first use.

        Raises:
            StudyError: the study was made from arrays that were not given again.
            DataError: the data cannot be read.
        """
        if self.source is not None:
            return load_data(self.source, seed=self.seed)
        if self.spec.startswith("arrays:"):
            raise StudyError(
                f"study {self.name!r} was created from arrays; pass them again: "
                "autosearch.load_study(name, storage=..., data=(images, labels))"
            )
        return load_data(self.spec, seed=self.seed)

    @property
    def training(self) -> Dataset | None:
        """What trials train on (None: a table study looks results up instead)."""
        return None if self.table else self.dataset

    @cached_property
    def hash(self) -> str | None:
        """Content hash of the data every trial trains on (None for table studies)."""
        return None if self.table else self.dataset.content_hash()
