"""What a study's stored definition says, typed: the properties the facade
(study.py) shows of its :class:`StudyDefinition`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autosearch.compress import Compression, VariantSpec
from autosearch.evaluation.supernet import SupernetConfig
from autosearch.evaluation.tabular import Table
from autosearch.scoring import Reward
from autosearch.study.definition import StudyDefinition
from autosearch.training.early_stopping import SuccessiveHalving
from autosearch.training.train import TrainConfig

__all__ = ["DefinitionView"]


class DefinitionView:
    """A study's definition, typed, property by property."""

    definition: StudyDefinition

    @property
    def objectives(self) -> tuple[str, ...]:
        return self.definition.objectives

    @property
    def reward(self) -> Reward:
        return self.definition.reward

    @property
    def variants(self) -> tuple[VariantSpec, ...]:
        return self.definition.variants

    @property
    def compression(self) -> Compression:
        return self.definition.compression

    @property
    def train_config(self) -> TrainConfig:
        return self.definition.train

    @property
    def seed(self) -> int:
        return self.definition.seed

    @property
    def table(self) -> Table | None:
        return self.definition.table

    @property
    def early_stopping(self) -> SuccessiveHalving | None:
        return self.definition.early_stopping

    @property
    def supernet(self) -> SupernetConfig | None:
        """How the study's supernet is trained and evaluated (None: trials train)."""
        return self.definition.supernet

    @property
    def data_report(self) -> Mapping[str, Any] | None:
        """The cleaning report stored when the study was created (None for tables)."""
        return self.definition.data_report

    @property
    def reward_name(self) -> str:
        return str(self.definition.reward)
