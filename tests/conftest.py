from __future__ import annotations

import re
import socket
import uuid
from pathlib import Path

import _hermetic

# Before torch is imported (it reads TORCH_LOGS and the like once, at import): this
# process's folders and environment, without the user's settings (tests/_hermetic.py).
_ROOT, _OWNED = _hermetic.isolate_process()

import pytest  # noqa: E402

from autosearch import TrainConfig  # noqa: E402
from autosearch.data import Dataset, load_data  # noqa: E402
from controllers import RandomSearch  # noqa: E402
from search_spaces import ResNetSpace  # noqa: E402

_RUN: dict[str, str] = {}


def pytest_configure(config):
    """Each test process runs in folders of its own (isolated above); latency tables
    filled by tests (on a loaded machine) stay out of any cache a real search would
    predict with."""
    import os

    # pytest-xdist deals whole files out in this order (pytest_collection_modifyitems),
    # not re-sorted by how many tests each file holds: its default put the files of
    # one or two long tests (the chaos round, the report in Chromium) last, where the
    # other process waited on them idle.
    config.option.loadscopereorder = False
    _RUN.update(tag=_hermetic.new_tag())
    os.environ[_hermetic.TAG] = str(_RUN["tag"])
    os.environ["AUTOSEARCH_LATENCY_TABLES"] = str(_ROOT / "latency-tables")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Two test processes share the 2 cores (make test: -n 2): one thread each, in
        # them and in every process they start, or they thrash; and the same count on
        # both sides of a comparison (a run here against a run in a subprocess).
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def pytest_unconfigure(config):
    """Whatever the run's fixtures started and left is stopped; its folders removed by
    the process that made them (under xdist, the controller, once its workers ended)."""
    import shutil
    from multiprocessing import util

    if "tag" in _RUN:
        _hermetic.stop_tagged(str(_RUN["tag"]), helpers=True)
    if _OWNED:  # at exit, after multiprocessing's own temp folder in it (priority -100)
        util.Finalize(None, shutil.rmtree, (_ROOT,), {"ignore_errors": True}, exitpriority=-200)


# The files that take longest, run first (longest processing time first): `make test`
# gives each of its two processes a whole file at a time, and a long file dealt out last
# leaves the other process idle at the end. Measured: per-file seconds summed over the
# two processes, two quiet runs on a 2-core Intel Xeon (AVX-512, VNNI), 2026-11-28; files
# not named (under 15 s) follow in their own order.
_LONGEST_FIRST = (
    "test_scaleout.py",  # 198 s
    "test_executors.py",  # 159
    "test_export.py",  # 137
    "test_estimates.py",  # 119
    "test_supernet_job.py",  # 114
    "test_training_stack.py",  # 110
    "test_tracking.py",  # 101
    "test_integrity.py",  # 96
    "test_faults.py",  # 89
    "test_chaos.py",  # 76, one test
    "test_compress.py",  # 73
    "test_supernet.py",  # 57
    "test_sharding.py",  # 56
    "test_s3.py",  # 54
    "test_confirm.py",  # 49
    "test_controllers.py",  # 45
    "test_nb201_supernet.py",  # 42
    "test_study.py",  # 37
    "test_cli.py",  # 35
    "test_report.py",  # 33, two tests
    "test_interrupts.py",  # 29
    "test_nni.py",  # 28
    "test_population.py",  # 23
    "test_outside_files.py",  # 21
    "test_contracts.py",  # 16
)


def pytest_collection_modifyitems(config, items):
    """Longest files first, each file's tests in their own order (a stable sort)."""
    rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(autouse=True)
def _no_process_left_behind(monkeypatch):
    """What a test starts carries its tag; whatever still runs when it ends (passed,
    failed or timed out) is stopped, and named in a warning."""
    import warnings

    tag = _hermetic.new_tag()
    monkeypatch.setenv(_hermetic.TAG, tag)
    yield
    left = _hermetic.stop_tagged(tag)
    if left:
        warnings.warn(f"stopped processes the test left behind: {left}", stacklevel=1)


@pytest.fixture(scope="session")
def digits() -> Dataset:
    return load_data("digits", seed=0)


@pytest.fixture(scope="session")
def digits_folder(tmp_path_factory) -> Path:
    """scikit-learn's digits written as an image folder (one PNG per image, a sub-folder
    per class), with an exact duplicate, an unreadable file and one of the wrong size
    planted."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("digits-folder")
    bunch = load_digits()
    images = np.clip(np.rint(bunch.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    for i, (image, label) in enumerate(zip(images, bunch.target, strict=True)):
        folder = root / f"class-{label}"
        folder.mkdir(exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:04d}.png")
    (root / "class-0" / "broken.png").write_bytes(b"not a png")
    (root / "class-2" / "copy.png").write_bytes((root / "class-2" / "0002.png").read_bytes())
    Image.fromarray(np.zeros((9, 8), np.uint8)).save(root / "class-1" / "tall.png")
    return root


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


PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres", "dbname": "test"}


@pytest.fixture
def postgres_url():
    """A fresh database on the local PostgreSQL server, dropped afterwards."""
    import psycopg  # the driver SQLAlchemy uses for postgresql:// URLs

    try:
        admin = psycopg.connect(**PG, connect_timeout=5, autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL on 127.0.0.1:5432 is not reachable: {exc}")
    name = f"autosearch_{uuid.uuid4().hex[:12]}"
    admin.execute(f"CREATE DATABASE {name}")
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


@pytest.fixture(scope="session")
def s3_endpoint():
    """An S3 server (moto's) on 127.0.0.1, at a free port."""
    moto_server = pytest.importorskip(
        "moto.server", reason="the S3 tests start moto's server: pip install 'moto[server]'"
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_endpoint, monkeypatch, request):
    env = {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:50].strip("-")
    import boto3

    client = boto3.client("s3")
    client.create_bucket(Bucket=name)
    return name, client
