"""Datasets: readers, cleaning (planted problems), splits and the disk cache."""

from __future__ import annotations

import gzip
import logging
import os
import pickle
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import autosearch
from autosearch import DataError, UnknownNameError
from autosearch.data import load_data
from autosearch.data._readers import READERS
from autosearch.data.loading import load_named


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSEARCH_CACHE", str(tmp_path / "cache"))
    load_named.cache_clear()
    yield
    load_named.cache_clear()


def _images(n: int, classes: int, shape=(1, 6, 6), seed=0):
    """Distinct random images, labels cycling through the classes."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8), np.arange(n) % classes


def test_digits_split_is_stratified_disjoint_and_seeded(digits):
    sizes = (len(digits.train), len(digits.val), len(digits.test))
    assert sum(sizes) == 1797 and sizes == (1077, 360, 360)
    assert digits.input_shape == (1, 8, 8) and digits.num_classes == 10
    assert digits.train.x.dtype == torch.uint8
    for split in (digits.train, digits.val, digits.test):
        share = torch.bincount(split.y, minlength=10).float() / len(split)
        assert share.min() > 0.08 and share.max() < 0.12
    # The three splits partition the dataset: together they are exactly its samples.
    raw = READERS["digits"](None)
    whole = Counter((x.tobytes(), int(y)) for x, y in zip(raw.images, raw.labels, strict=True))
    parts = Counter(
        (x.numpy().tobytes(), int(y))
        for s in (digits.train, digits.val, digits.test)
        for x, y in zip(s.x, s.y, strict=True)
    )
    assert parts == whole and digits.report.kept == {"train": 1077, "val": 360, "test": 360}
    again = load_data("digits", seed=0)
    assert again.content_hash() == digits.content_hash()
    assert load_data("digits", seed=1).content_hash() != digits.content_hash()


def test_normalize_uses_train_statistics(digits):
    x = digits.normalize(digits.train.x)
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-3


def test_unknown_dataset_and_bad_fractions():
    with pytest.raises(UnknownNameError, match="Did you mean 'digits'"):
        load_data("digit")
    with pytest.raises(DataError, match="leave samples"):
        load_data("digits", val_fraction=0.5, test_fraction=0.5)


def test_planted_duplicates_conflicts_and_leakage_are_found():
    images, labels = _images(300, 3)
    images[10] = images[0]  # exact duplicate, same label (0 and 10 are both class... no:)
    labels[10] = labels[0]
    images[20], labels[20] = images[1], (labels[1] + 1) % 3  # same image, other label
    data = load_data((images, labels), seed=0)
    report = data.report
    assert report.duplicates == 1 and report.conflicting == 2  # both conflicting copies go
    assert sum(report.kept.values()) == 300 - 1 - 2
    keys = [{x.numpy().tobytes() for x in s.x} for s in (data.train, data.val, data.test)]
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])  # no leakage left


def test_leakage_from_an_official_test_split_is_dropped(tmp_path):
    images, labels = _images(200, 2, shape=(8, 8))
    test_images, test_labels = _images(40, 2, shape=(8, 8), seed=1)
    test_images[:5] = images[:5]  # five test images copied from training
    test_labels[:5] = labels[:5]
    _write_idx(tmp_path, images, labels, test_images, test_labels)
    data = load_data(f"mnist:{tmp_path}")
    assert data.report.leakage == 5 and len(data.test) == 35
    assert data.report.read == 240 and data.input_shape == (1, 8, 8)


def test_bad_values_labels_and_shapes_from_arrays():
    images = np.random.default_rng(0).random((120, 5, 5, 3))  # float, channels last
    labels = np.arange(120) % 4
    images[3, 0, 0, 0] = np.nan
    images[4, 1, 1, 1] = 1.5
    labels[5] = 7  # out of range for num_classes=4
    labels[6] = -1
    data = load_data((images, labels), num_classes=4)
    assert data.input_shape == (3, 5, 5)
    assert data.report.bad_values == 2 and data.report.bad_labels == 2
    assert sum(data.report.kept.values()) == 116
    with pytest.raises(DataError, match="labels must be integers"):
        load_data((images, labels.astype(float)))
    with pytest.raises(DataError, match="labels must be \\(120,\\)"):
        load_data((images, labels[:10]))
    with pytest.raises(DataError, match="fewer than 3 samples"):
        load_data((images[:9], np.array([0, 0, 0, 0, 1, 1, 1, 1, 2])))


def test_class_imbalance_is_reported():
    images, labels = _images(400, 2)
    labels[:360] = 0  # 380 of class 0, 20 of class 1
    report = load_data((images, labels)).report
    assert report.imbalance == pytest.approx(19.0, rel=0.1)
    assert any("imbalance" in line for line in report.lines())


def _write_idx(folder, images, labels, test_images, test_labels):
    def idx(array, path):
        header = bytes([0, 0, 8, array.ndim]) + b"".join(
            int(d).to_bytes(4, "big") for d in array.shape
        )
        path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))

    idx(images, folder / "train-images-idx3-ubyte.gz")
    idx(labels, folder / "train-labels-idx1-ubyte.gz")
    idx(test_images, folder / "t10k-images-idx3-ubyte.gz")
    idx(test_labels, folder / "t10k-labels-idx1-ubyte.gz")


def test_idx_files_are_read_and_cached(tmp_path):
    images, labels = _images(90, 3, shape=(7, 7))
    timages, tlabels = _images(30, 3, shape=(7, 7), seed=2)
    _write_idx(tmp_path, images, labels, timages, tlabels)
    data = load_data(f"fashion-mnist:{tmp_path}")
    assert data.num_classes == 10 and len(data.test) == 30
    assert torch.equal(data.test.x[:, 0], torch.from_numpy(timages))  # official test kept
    cached = list((tmp_path / "cache").glob("*.safetensors"))
    assert len(cached) == 1
    load_named.cache_clear()
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"changed")  # new content: new key
    with pytest.raises(DataError, match="not an IDX file|cannot read"):
        load_data(f"fashion-mnist:{tmp_path}")


def test_corrupt_and_missing_idx_files_say_which(tmp_path):
    images, labels = _images(30, 3, shape=(4, 4))
    _write_idx(tmp_path, images, labels, images, labels)
    data = gzip.decompress((tmp_path / "train-images-idx3-ubyte.gz").read_bytes())
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(data[:-7]))
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz is truncated or corrupt"):
        load_data(f"mnist:{tmp_path}")
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    load_named.cache_clear()
    with pytest.raises(DataError, match="no t10k-labels-idx1-ubyte.gz|truncated"):
        load_data(f"mnist:{tmp_path}")
    with pytest.raises(DataError, match="does not exist"):
        load_data(f"mnist:{tmp_path / 'nowhere'}")


def test_cifar_batches_and_a_malicious_pickle(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(1, 6):
        batch = {
            b"data": rng.integers(0, 256, (20, 3072), dtype=np.uint8),
            b"labels": list(range(10)) * 2,
        }
        (tmp_path / f"data_batch_{i}").write_bytes(pickle.dumps(batch, protocol=2))
    test = {b"data": rng.integers(0, 256, (20, 3072), dtype=np.uint8), b"labels": [1, 2] * 10}
    (tmp_path / "test_batch").write_bytes(pickle.dumps(test, protocol=2))
    data = load_data(f"cifar10:{tmp_path}")
    assert data.input_shape == (3, 32, 32) and len(data.test) == 20
    assert sum(data.report.kept.values()) == 120

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (tmp_path / "test_batch").write_bytes(pickle.dumps({b"data": Evil()}))
    load_named.cache_clear()
    with pytest.raises(DataError, match="refusing to load builtins.print"):
        load_data(f"cifar10:{tmp_path}")


def test_image_folder_with_unreadable_and_misshapen_files(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(12):
            Image.fromarray(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)).save(
                tmp_path / cls / f"{i}.png"
            )
    Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(
        tmp_path / "dog/big.png"
    )
    (tmp_path / "cat" / "broken.png").write_bytes(b"not a png")
    data = load_data(f"folder:{tmp_path}")
    assert data.classes == ("cat", "dog") and data.input_shape == (3, 10, 10)
    assert sum(data.report.kept.values()) == 24
    problems = " ".join(data.report.unreadable)
    assert "unreadable" in problems and "broken.png" in problems and "big.png" in problems


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` pixels and holds none (a decompression
    bomb's header: read, it would be decoded into gigabytes)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


@pytest.mark.parametrize("stream", [False, True])
def test_hostile_files_in_an_image_folder_are_listed_and_grey_ones_converted(
    tmp_path, stream, monkeypatch
):
    """A FIFO named x.jpg hung the streamed scan inside PIL.Image.open; a 15,000 x 15,000
    image was a DecompressionBombError traceback; greyscale JPEGs in an RGB folder were
    dropped as "wrong shape". Now: only regular files are opened (the rest listed as
    unreadable), an image's size is checked from its header before decoding, and images
    of the other channel count are converted to the folder's."""
    from PIL import Image

    monkeypatch.setenv("AUTOSEARCH_CACHE", str(tmp_path / "cache"))
    load_named.cache_clear()
    root = tmp_path / "images"
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)).save(
                root / cls / f"{i}.png"
            )
        grey = rng.integers(0, 256, (10, 10), dtype=np.uint8)
        Image.fromarray(grey).save(root / cls / "grey.jpg", quality=95)
    os.mkfifo(root / "cat" / "x.jpg")
    os.symlink("/dev/zero", root / "dog" / "zero.png")
    (root / "dog" / "bomb.png").write_bytes(_png_header(15_000, 15_000))
    (root / "cat" / "large.png").write_bytes(_png_header(10_000, 10_000))
    data = load_data(f"folder:{root}", stream=stream)
    assert data.input_shape == (3, 10, 10) and sum(data.report.kept.values()) == 22
    problems = data.report.unreadable
    said = {Path(line.split(": ", 1)[1].split(" ")[0]).name: line for line in problems}
    assert set(said) == {"x.jpg", "zero.png", "bomb.png", "large.png"}, problems
    assert "is a FIFO (named pipe), not a regular file" in said["x.jpg"]
    assert "is a character device, not a regular file" in said["zero.png"]
    assert "10000 x 10000 pixels, more than Pillow's limit of" in said["large.png"]
    assert "exceeds limit" in said["bomb.png"] and "resize it" in said["bomb.png"]
    assert all("\n" not in line for line in problems)


def test_a_study_from_arrays_needs_them_again(tmp_path, tiny_space):
    from controllers import RandomSearch

    images, labels = _images(150, 3, shape=(8, 8))
    url = f"sqlite:///{tmp_path}/a.db"
    study = autosearch.create_study(
        "a",
        controller=RandomSearch(tiny_space, seed=0),
        data=(images, labels),
        storage=url,
        train=autosearch.TrainConfig(epochs=1),
    )
    study.optimize(1)
    assert study.definition.data_report["kept"]["train"] > 0
    stored = autosearch.load_study("a", storage=url)
    with pytest.raises(autosearch.StudyError, match="pass them again"):
        stored.optimize(1)
    with pytest.raises(autosearch.StudyError, match="created from other data"):
        autosearch.load_study("a", storage=url, data=(images[::-1], labels))
    assert len(autosearch.load_study("a", storage=url, data=(images, labels)).optimize(1)) == 1


def test_a_streamed_folder_is_cleaned_and_split_like_one_in_memory(
    digits_folder, tmp_path, monkeypatch
):
    from autosearch.data import FileSplit, Split

    monkeypatch.setenv("AUTOSEARCH_CACHE", str(tmp_path / "cache"))
    load_named.cache_clear()
    held = load_data(f"folder:{digits_folder}", stream=False)
    streamed = load_data(f"folder:{digits_folder}", stream=True)
    assert isinstance(held.train, Split) and isinstance(streamed.train, FileSplit)
    assert streamed.streamed and not held.streamed
    # The same samples in the same splits, the same statistics, the same report.
    assert streamed.content_hash() == held.content_hash()
    for part in ("train", "val", "test"):
        a, b = getattr(held, part), getattr(streamed, part)
        assert torch.equal(a.y, b.y)
        assert torch.equal(a.x[:5], b.take(torch.arange(5)))
    np.testing.assert_allclose(streamed.mean, held.mean, rtol=1e-9)
    np.testing.assert_allclose(streamed.std, held.std, rtol=1e-9)
    assert streamed.report.to_dict() == held.report.to_dict()
    assert streamed.report.duplicates == 1 and streamed.report.read == 1798
    problems = " ".join(streamed.report.unreadable)
    assert "broken.png" in problems and "wrong shape (1, 9, 8)" in problems
    # The scan is cached: a second load lists the folder without decoding it.
    assert list((tmp_path / "cache").glob("scan-*.json"))
    load_named.cache_clear()
    monkeypatch.setattr(
        "autosearch.data._stream.decode_image", lambda f: pytest.fail("decoded again")
    )
    cached = load_data(f"folder:{digits_folder}", stream=True)
    assert cached.content_hash() == held.content_hash()
    assert cached.input_shape == cached.train.shape == (1, 8, 8)


def test_folders_stream_only_past_the_memory_budget(digits_folder, tmp_path, monkeypatch):
    from autosearch.data import memory_budget

    monkeypatch.setenv("AUTOSEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTOSEARCH_DATA_MEMORY", "1.5K")
    assert memory_budget() == 1536
    load_named.cache_clear()
    assert load_data(f"folder:{digits_folder}").streamed  # 1.8 k images of 64 bytes
    monkeypatch.setenv("AUTOSEARCH_DATA_MEMORY", "1G")
    load_named.cache_clear()
    assert not load_data(f"folder:{digits_folder}").streamed
    monkeypatch.setenv("AUTOSEARCH_DATA_MEMORY", "lots")
    with pytest.raises(DataError, match="AUTOSEARCH_DATA_MEMORY='lots' is not a size"):
        memory_budget()
    with pytest.raises(DataError, match="only image folders"):
        load_data("digits", stream=True)


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        ("stray", r"labels of arrays must be 0..K-1 .* run 0..99 with only 11 distinct"),
        ("one class", "has one class .*needs at least two"),
        ("empty", "has no images"),
    ],
)
def test_labels_that_do_not_make_a_classification_problem_are_refused(labels, match):
    rng = np.random.default_rng(0)
    images = rng.random((300, 8, 8))
    y = {
        "stray": np.where(np.arange(300) < 5, 99, rng.integers(0, 10, 300)),
        "one class": np.zeros(300, dtype=int),
        "empty": np.zeros(0, dtype=int),
    }[labels]
    x = images[: len(y)]
    with pytest.raises(DataError, match=match):
        load_data((x, y))
    if labels == "stray":  # a class count given on purpose is honoured
        assert load_data((x, y), num_classes=100).num_classes == 100


@pytest.mark.parametrize("stream", [False, True])
def test_a_folder_with_one_class_is_refused(tmp_path, stream):
    from PIL import Image

    folder = tmp_path / "only-cats" / "cat"
    folder.mkdir(parents=True)
    for i in range(20):
        Image.fromarray(np.full((8, 8), i * 10, np.uint8)).save(folder / f"{i}.png")
    with pytest.raises(DataError, match="needs at least two"):
        load_data(f"folder:{tmp_path / 'only-cats'}", stream=stream)


def test_a_cache_entry_rewritten_by_other_ranks_is_always_read_whole(tmp_path, monkeypatch, caplog):
    """Ranks of one run may write the same entry while another reads it: every read
    sees a whole entry (never half a file, never a miss once it exists)."""
    from autosearch.data._cache import load_cached, store
    from autosearch.data._readers import Raw

    monkeypatch.setenv("AUTOSEARCH_CACHE", str(tmp_path))
    images, labels = _images(64, 3, shape=(6, 6))
    raw = Raw(images=images, labels=labels, test_images=None, test_labels=None,
              classes=["a", "b", "c"], problems=["x.png"])  # fmt: skip
    store("k", raw)
    stop = threading.Event()

    def rewrite() -> None:
        while not stop.is_set():
            store("k", raw)

    writers = [threading.Thread(target=rewrite) for _ in range(2)]
    for writer in writers:
        writer.start()
    try:
        with caplog.at_level(logging.WARNING):
            reads = [load_cached("k") for _ in range(200)]
    finally:
        stop.set()
        for writer in writers:
            writer.join()
    assert all(r is not None and r.classes == ["a", "b", "c"] for r in reads)
    assert "unreadable" not in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.json", "k.safetensors"]


def test_a_kept_split_is_the_drawn_one_and_a_damaged_one_is_drawn_again(tmp_path, monkeypatch):
    """The stratified split is kept on disk by what decides it, so a process that finds
    it does not import scikit-learn; what reads back as no split of these labels (a
    damaged file, another file's indices) is drawn again, the same as before."""
    import subprocess
    import sys

    from autosearch.data._cache import cached_split

    monkeypatch.setenv("AUTOSEARCH_CACHE", str(tmp_path / "cache"))
    labels = np.repeat(np.arange(5), 20)
    draws = []

    def draw():
        draws.append(1)
        rng = np.random.default_rng(len(draws))
        drawn = np.sort(rng.choice(100, 25, replace=False))
        return np.setdiff1d(np.arange(100), drawn), drawn

    first = cached_split(labels, 0.25, 3, draw)
    again = cached_split(labels, 0.25, 3, draw)
    assert len(draws) == 1 and all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    cached_split(labels, 0.25, 4, draw)  # another seed: drawn
    assert len(draws) == 2
    entries = sorted((tmp_path / "cache" / "splits").iterdir())
    assert len(entries) == 2
    for damage in (b"garbage", None):
        for entry in entries:
            if damage is None:  # readable, but its indices are no split of these labels
                np.savez(entry, kept=np.arange(10), drawn=np.arange(5))
            else:
                entry.write_bytes(damage)
        before = len(draws)
        redrawn = cached_split(labels, 0.25, 3, draw)
        assert len(draws) == before + 1  # drawn again, and kept again
        assert sorted(np.concatenate(redrawn).tolist()) == list(range(100))
        assert np.array_equal(cached_split(labels, 0.25, 3, draw)[1], redrawn[1])
        assert len(draws) == before + 1

    # A fresh process that finds the digits' split kept reads digits without scikit-learn.
    probe = (
        "import sys; from autosearch.data import load_data; d = load_data('digits', seed=0); "
        "print(len(d.train.y), len(d.val.y), len(d.test.y), 'sklearn' in sys.modules)"
    )
    env = {**os.environ, "AUTOSEARCH_CACHE": str(tmp_path / "cache")}
    runs = [
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=600
        ).stdout.split()
        for _ in range(2)
    ]
    here = load_data("digits", seed=0)
    sizes = [str(len(here.train.y)), str(len(here.val.y)), str(len(here.test.y))]
    assert runs[0][:3] == runs[1][:3] == sizes
    assert runs[1][3] == "False"  # the second found the split: no scikit-learn imported
