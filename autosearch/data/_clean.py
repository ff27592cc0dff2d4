"""Cleaning before any training, with a report of everything that was left out."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["CleaningReport", "drop_duplicates", "drop_leaks", "image_keys"]


@dataclass(kw_only=True)
class CleaningReport:
    """What cleaning found and removed. Counts are samples."""

    read: int = 0
    unreadable: list[str] = field(default_factory=list)  # files, with the reason
    bad_values: int = 0  # NaN or out-of-range pixel values
    bad_labels: int = 0  # labels outside 0..num_classes-1
    duplicates: int = 0  # exact copies (same image, same label) beyond the first
    conflicting: int = 0  # the same image under different labels: every copy dropped
    leakage: int = 0  # validation / test images identical to an earlier split's
    kept: dict[str, int] = field(default_factory=dict)
    class_counts: list[int] = field(default_factory=list)  # training split

    @property
    def imbalance(self) -> float:
        """Largest over smallest training-class count (1.0 is balanced)."""
        counts = [c for c in self.class_counts if c > 0]
        return max(counts) / min(counts) if counts else 1.0

    def lines(self) -> list[str]:
        """The report as readable sentences (only what needs saying)."""
        out = [
            f"read {self.read} samples; kept "
            + ", ".join(f"{n} {split}" for split, n in self.kept.items())
        ]
        for count, what in [
            (len(self.unreadable), "unreadable or wrongly shaped files left out"),
            (self.bad_values, "samples with NaN or out-of-range values dropped"),
            (self.bad_labels, "samples with labels out of range dropped"),
            (self.duplicates, "exact duplicates dropped"),
            (self.conflicting, "copies of images labelled inconsistently dropped"),
            (self.leakage, "validation/test samples identical to training ones dropped"),
        ]:
            if count:
                out.append(f"{count} {what}")
        if self.imbalance > 3:
            out.append(f"class imbalance: the largest class is {self.imbalance:.1f}x the smallest")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "imbalance": self.imbalance}


def image_keys(images: np.ndarray) -> np.ndarray:
    """A content hash per image (exact-duplicate detection)."""
    flat = np.ascontiguousarray(images).reshape(len(images), int(np.prod(images.shape[1:])))
    return np.array([hashlib.blake2b(row.tobytes(), digest_size=16).hexdigest() for row in flat])


def drop_duplicates(keys: np.ndarray, labels: np.ndarray, report: CleaningReport) -> np.ndarray:
    """Indices to keep: the first of each group of identical images with one label; none
    of a group whose copies disagree on the label."""
    labels_of: dict[str, set[int]] = {}
    for key, label in zip(keys, labels, strict=True):
        labels_of.setdefault(str(key), set()).add(int(label))
    keep, seen = [], set()
    for i, key in enumerate(keys):
        key = str(key)
        if len(labels_of[key]) > 1:
            report.conflicting += 1
        elif key in seen:
            report.duplicates += 1
        else:
            seen.add(key)
            keep.append(i)
    return np.array(keep, dtype=np.int64)


def drop_leaks(keys: np.ndarray, earlier: set[str], report: CleaningReport) -> np.ndarray:
    """Indices of a held-out split to keep: those whose image no earlier split holds."""
    leaked = np.array([str(k) in earlier for k in keys], dtype=bool)
    report.leakage += int(leaked.sum())
    return np.flatnonzero(~leaked)
