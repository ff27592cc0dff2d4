"""The suite's own isolation (tests/_hermetic.py, conftest): a user's shell settings and
files reach no test, Hypothesis draws the same examples everywhere and writes nothing
into the checkout."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import _hermetic
from hypothesis import HealthCheck, settings
from hypothesis.configuration import storage_directory

# What a user's shell may hold that the tests, or what they start, would read: a proxy
# that 127.0.0.1's servers would be reached through, bars turned off, gloo bound to an
# interface this machine lacks, warnings turned into errors in the processes a test
# reads (each of these four failed a test before it was cleared), the compiler off, a
# Slurm allocation that submitit would take for the test's job, Hypothesis's CI profile.
HOSTILE = {
    "RAY_ADDRESS": "10.255.255.1:6379",
    "AWS_PROFILE": "user",
    "PGHOST": "10.255.255.1",
    "MASTER_PORT": "1",
    "https_proxy": "http://10.255.255.1:9",
    "HTTP_PROXY": "http://10.255.255.1:9",
    "grpc_proxy": "http://10.255.255.1:9",
    "TQDM_DISABLE": "1",
    "GLOO_SOCKET_IFNAME": "eth9",
    "TORCHDYNAMO_DISABLE": "1",
    "PYTORCH_JIT": "0",
    "OMP_NUM_THREADS": "64",
    "SLURM_JOB_ID": "7",
    "PYTHONWARNINGS": "error",
    "CI": "1",
    "HYPOTHESIS_STORAGE_DIRECTORY": "/nonexistent",
    "AUTOSEARCH_HEARTBEAT_GRACE": "1",
}
FOLDERS = ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "TMPDIR")


def test_a_users_settings_are_cleared_and_the_folders_point_into_the_run(tmp_path, monkeypatch):
    saved = dict(os.environ)  # isolate() edits this process's environment: put back after
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    try:
        os.environ.update(HOSTILE, AUTOSEARCH_REQUIRE_DOCS="1")  # CI's switch, kept
        cleared = _hermetic.isolate(tmp_path)
        left = dict(os.environ)
        temp = tempfile.gettempdir()
    finally:
        os.environ.clear()
        os.environ.update(saved)

    assert HOSTILE.items() <= cleared.items()
    assert not set(HOSTILE) & set(left)
    assert left["AUTOSEARCH_REQUIRE_DOCS"] == "1"
    for name in FOLDERS:
        assert Path(left[name]).is_relative_to(tmp_path) and Path(left[name]).is_dir()
    assert Path(temp).is_relative_to(tmp_path)


def test_what_runs_inside_leaves_the_environment_as_it_was(monkeypatch):
    monkeypatch.setenv("AUTOSEARCH_TEST_KEPT", "before")
    with _hermetic.environment_kept():
        os.environ["RAY_CLIENT_MODE"] = "0"  # what Ray's driver sets in its process
        os.environ["AUTOSEARCH_TEST_KEPT"] = "changed"
        del os.environ["HOME"]
    assert "RAY_CLIENT_MODE" not in os.environ and os.environ["HOME"]
    assert os.environ["AUTOSEARCH_TEST_KEPT"] == "before"


def test_this_process_holds_none_of_them():
    """What conftest cleared at the start of this test process stays cleared (the
    suite's own settings, such as the thread count under xdist, are not a user's)."""
    ours = {_hermetic.TAG, _hermetic.ROOT, "AUTOSEARCH_LATENCY_TABLES", "OMP_NUM_THREADS"}
    ours |= {"AUTOSEARCH_LATENCY_SAMPLE_SECONDS", *_hermetic.KEPT}
    left = [
        name
        for name in os.environ
        if name not in ours
        and (name.startswith(_hermetic.USER_SETTINGS) or name in _hermetic.USER_NAMES)
    ]
    assert left == []


def test_hypothesis_runs_the_suites_profile_beside_pytests_cache(pytestconfig):
    profile = settings.default
    assert profile.derandomize and profile.database is None and profile.deadline is None
    assert HealthCheck.too_slow in profile.suppress_health_check
    where = storage_directory("unicode_data", intent_to_write=False).path.resolve()
    cache = getattr(pytestconfig, "cache", None)  # absent under -p no:cacheprovider
    if cache:
        assert where.parent == cache.mkdir("hypothesis").resolve()
    else:
        assert where.is_relative_to(Path(os.environ[_hermetic.ROOT]).resolve())
