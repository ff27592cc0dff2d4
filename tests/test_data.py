from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from autosearch import DataError, UnknownNameError
from autosearch.data import _READERS, load_data, split_arrays


def test_digits_split_is_stratified_disjoint_and_seeded(digits):
    sizes = (len(digits.train), len(digits.val), len(digits.test))
    assert sum(sizes) == 1797 and sizes == (1077, 360, 360)
    assert digits.input_shape == (1, 8, 8) and digits.num_classes == 10
    assert digits.train.x.dtype == torch.uint8
    # every class in every split, in about the same share
    for split in (digits.train, digits.val, digits.test):
        share = torch.bincount(split.y, minlength=10).float() / len(split)
        assert share.min() > 0.08 and share.max() < 0.12
    # The three splits partition the dataset: together they are exactly its samples.
    images, labels = _READERS["digits"]()
    whole = Counter((x.tobytes(), int(y)) for x, y in zip(images, labels, strict=True))
    parts = Counter(
        (x.numpy().tobytes(), int(y))
        for s in (digits.train, digits.val, digits.test)
        for x, y in zip(s.x, s.y, strict=True)
    )
    assert parts == whole
    again = load_data("digits", seed=0)
    assert (
        torch.equal(again.test.x, digits.test.x) and again.content_hash() == digits.content_hash()
    )
    other = load_data("digits", seed=1)
    assert other.content_hash() != digits.content_hash()


def test_normalize_uses_train_statistics(digits):
    x = digits.normalize(digits.train.x)
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-3


def test_unknown_dataset_suggests():
    with pytest.raises(UnknownNameError, match="Did you mean 'digits'"):
        load_data("digit")


def test_bad_fractions_and_arrays_are_refused():
    with pytest.raises(DataError, match="leave samples"):
        load_data("digits", val_fraction=0.5, test_fraction=0.5)
    images = np.zeros((20, 1, 4, 4), dtype=np.float32)
    with pytest.raises(DataError, match="uint8"):
        split_arrays(
            "x", images, np.zeros(20, dtype=np.int64), seed=0, val_fraction=0.2, test_fraction=0.2
        )
