from __future__ import annotations

import pytest

from autosearch import TrainConfig
from autosearch.data import Dataset, load_data
from controllers import RandomSearch
from search_spaces import ResNetSpace


@pytest.fixture(scope="session")
def digits() -> Dataset:
    return load_data("digits", seed=0)


@pytest.fixture
def tiny_space() -> ResNetSpace:
    """Small enough that one epoch on digits takes a fraction of a second."""
    return ResNetSpace(
        min_stages=2,
        max_stages=2,
        depths=(1, 2),
        widths=(4, 8),
        stem_widths=(4, 8),
        blocks=("basic",),
    )


@pytest.fixture
def tiny_train() -> TrainConfig:
    return TrainConfig(epochs=1, batch_size=128, lr=0.1)


@pytest.fixture
def make_study(tmp_path, tiny_space, tiny_train):
    """create_study with tiny settings in a temporary storage."""
    import autosearch

    def make(name: str = "t", *, seed: int = 0, **options):
        options.setdefault("controller", RandomSearch(tiny_space, seed=seed))
        options.setdefault("train", tiny_train)
        options.setdefault("storage", f"sqlite:///{tmp_path}/{name}.db")
        return autosearch.create_study(name, **options)

    return make
