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
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

from autosearch import TrainConfig  # noqa: E402
from autosearch.data import Dataset, load_data  # noqa: E402
from controllers import RandomSearch  # noqa: E402
from search_spaces import ResNetSpace  # noqa: E402

# Property tests draw the same examples on every run and every machine (their seed a
# hash of the test) and replay nothing an earlier run saved: the same profile whether
# or not a `CI` variable is set (Hypothesis's own switch). Registered before the test
# modules are imported: their @settings take the profile's values for what they leave
# out. No time limit or slowness check either: a loaded machine trips both.
settings.register_profile(
    "autosearch",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("autosearch")

_RUN: dict[str, str] = {}


def pytest_configure(config):
    """Each test process runs in folders of its own (isolated above); latency tables
    filled by tests (on a loaded machine) stay out of any cache a real search would
    predict with."""
    import os

    # The files are dealt out in the order collected (pytest_collection_modifyitems).
    config.option.loadscopereorder = False
    # Hypothesis's files (with no example database, only caches of what it derives from
    # Python's Unicode tables and the source) beside pytest's own cache, not in a
    # `.hypothesis` folder of the checkout; in the run's folder where that cache is off.
    cache = getattr(config, "cache", None)
    set_hypothesis_home_dir(cache.mkdir("hypothesis") if cache else _ROOT / "hypothesis")
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


# The order pytest-xdist deals the files out in (``make test``: a whole file to each of
# two processes at a time). Its default, most tests first, deals the files of a few long
# tests last: the chaos round (one long test) and the Ray cluster's seven ran at the end
# while the other process, out of files, idled. Dealing every long file first is no
# better: it ran the files that start processes side by side, and they thrashed the two
# cores. So xdist's order, with those few files moved to the front, each dealt beside a
# file of many short tests in the test process.
_DEALT_EARLY = {"test_chaos.py": 0, "test_executors.py": 2, "test_report.py": 4}


def pytest_collection_modifyitems(config, items):
    """Files with most tests first (xdist's own order), those of ``_DEALT_EARLY`` at
    their places; each file's tests in their own order."""
    from collections import Counter

    counts = Counter(item.path for item in items)
    order = sorted(counts, key=lambda path: -counts[path])
    early = sorted((p for p in order if p.name in _DEALT_EARLY), key=lambda p: _DEALT_EARLY[p.name])
    order = [p for p in order if p.name not in _DEALT_EARLY]
    for path in early:
        order.insert(_DEALT_EARLY[path.name], path)
    place = {path: i for i, path in enumerate(order)}
    items.sort(key=lambda item: place[item.path])


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


def _settle() -> None:
    """What this test process holds now (the libraries and test modules it imported, the
    session's fixtures), frozen out of the collector's later scans (``gc.freeze``), after
    a collection of what is garbage already: every full collection of a test scanned
    them all again (a large part of an in-process file's time in the collector). The
    collector runs as often as before, on what the tests allocate."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_collection_finish(session):
    _settle()


@pytest.fixture(autouse=True, scope="module")
def _settled_after_each_file():
    """At the end of each file (its own fixtures already finalized) what it loaded
    lazily (the ONNX exporter, torchao, NNI, MLflow) is frozen too."""
    yield
    _settle()


@pytest.fixture(autouse=True, scope="module")
def _environment_kept_per_file():
    """This process's environment put back, at the end of each file, as it was before
    it: what a library set in the test process while the file ran is not inherited by
    the processes that later files start (Ray's driver sets ``RAY_AUTH_MODE``,
    ``RAY_CLIENT_MODE`` and ``PYTHONBREAKPOINT`` in the process that joins a cluster,
    and keeps them after ``ray.shutdown()``). Per file, not per test: a file's module
    fixtures (a Ray cluster and the driver joined to it) live across its tests."""
    with _hermetic.environment_kept():
        yield


@pytest.fixture(autouse=True)
def _builtins_kept():
    """Python's builtins as they were before the test: one that a test (or a library it
    drives) replaced or added is put back, and named in a warning, so that no later test
    of this process meets it (Ray's driver once replaced ``print``, and a pickle test
    three files later met Ray's function instead of Python's)."""
    import builtins
    import warnings

    before = dict(vars(builtins))
    yield
    now = vars(builtins)
    changed = sorted(n for n in now.keys() | before.keys() if now.get(n) is not before.get(n))
    if changed:
        for name in changed:
            if name in before:
                setattr(builtins, name, before[name])
            else:
                delattr(builtins, name)
        warnings.warn(f"put back the builtins the test changed: {changed}", stacklevel=1)


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


@pytest.fixture(scope="session")
def tiny_space() -> ResNetSpace:
    """Small enough that one epoch on digits takes a fraction of a second (a frozen
    dataclass: one for the session, module fixtures included)."""
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
