"""Stratified train / validation / test splits, with images an earlier split holds
dropped from the later ones as leakage."""

from __future__ import annotations

import numpy as np

from autosearch.data._cache import cached_split
from autosearch.data._clean import CleaningReport, drop_leaks
from autosearch.errors import DataError


def draw_splits(
    y: np.ndarray,
    keys: np.ndarray,
    seed: int,
    val_fraction: float,
    test_fraction: float,
    report: CleaningReport,
    official_test_keys: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stratified (train, val, test) index arrays, with validation and test images that
    an earlier split already holds dropped as leakage. With ``official_test_keys`` the
    test indices index that official test split; otherwise the test split is drawn."""
    if official_test_keys is not None:
        train, val = stratified(y, val_fraction / (1 - test_fraction), seed)
        test, test_keys = np.arange(len(official_test_keys)), official_test_keys
    else:
        rest, test = stratified(y, test_fraction, seed)
        train_rel, val_rel = stratified(y[rest], val_fraction / (1 - test_fraction), seed)
        train, val = rest[train_rel], rest[val_rel]
        test_keys = keys[test]
    seen = {str(k) for k in keys[train]}
    val = val[drop_leaks(keys[val], seen, report)]
    seen |= {str(k) for k in keys[val]}
    return train, val, test[drop_leaks(test_keys, seen, report)]


def stratified(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, drawn) index arrays, ``fraction`` of the samples drawn, stratified by class."""
    index = np.arange(len(labels))
    counts = np.bincount(labels)
    if (counts[counts > 0] < 3).any():
        rare = [int(c) for c in np.flatnonzero((counts > 0) & (counts < 3))]
        raise DataError(
            f"classes {rare} have fewer than 3 samples after cleaning: too few to "
            "split into train, validation and test; add samples or drop the class"
        )

    def draw() -> tuple[np.ndarray, np.ndarray]:
        from sklearn.model_selection import train_test_split  # slow to import: only when drawn

        kept, drawn = train_test_split(
            index, test_size=fraction, stratify=labels, random_state=seed
        )
        return np.sort(kept), np.sort(drawn)

    return cached_split(labels, fraction, seed, draw)
