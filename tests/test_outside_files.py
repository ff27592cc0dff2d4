"""Files a user passes are data from outside: whatever a latency table, a study file or a
journal holds, or whatever the path names (a device, a FIFO, a folder), it is refused
in one line that names it, before anything blocks, reads without end or reaches a
system call (issue 43: L16-L21, B6, W8). Property-based where the input is open-ended."""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autosearch import Compression, StorageError, StudyFileError, TrainConfig, create_study
from autosearch.scoring.latency import FORMAT, LatencyTableError, read
from autosearch.studyfile import load_spec
from controllers import RandomSearch

TORCH = torch.__version__.split("+")[0]
CPUS = os.cpu_count() or 1
MAX_MS = 1e6  # the longest time a table's part may take (autosearch.scoring.latency.MAX_MS)


def _table(**fields) -> dict:
    return {
        "format": FORMAT,
        "device": "cpu:a phone",
        "torch": TORCH,
        "threads": 1,
        "entries": {"module_call": 0.01},
        **fields,
    }


def _write(tmp_path, stored) -> str:
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(stored))
    return str(path)


# L19, L20: a thread count from a file reaches torch's thread pool only when it is sane ---
@pytest.mark.parametrize("threads", [10**6, 0, -4, CPUS + 1, True, 1.5, "2", None])
def test_a_table_whose_thread_count_is_not_one_to_the_cpus_is_refused_when_the_study_is_defined(
    threads, tmp_path, tiny_space
):
    path = _write(tmp_path, _table(threads=threads))
    with pytest.raises(LatencyTableError, match="its threads is .*from 1 to this machine") as info:
        create_study(
            "lat",
            controller=RandomSearch(tiny_space, seed=0),
            compression=Compression(latency=path),
            storage=f"sqlite:///{tmp_path}/s.db",
        )
    assert "\n" not in str(info.value)
    assert not (tmp_path / "s.db").exists()  # refused before the storage is touched


def test_no_thread_count_reaches_torch_unchecked():
    """L20: 10**6 threads reached torch's thread pool (SIGSEGV, or 32,048 threads and a
    process deaf to SIGTERM): tried in a process of its own, which must refuse them."""
    script = (
        "import torch\n"
        "from autosearch.scoring.cost import cpu_threads\n"
        "from autosearch.scoring.latency import LatencyTable, LatencyTableError\n"
        "for threads in (10**6, 0, -4, True):\n"
        "    try:\n"
        "        with cpu_threads(threads):\n"
        "            print('ran with', threads)\n"
        "    except ValueError as exc:\n"
        "        assert 'from 1 to this machine' in str(exc), exc\n"
        "    try:\n"
        "        LatencyTable(device='cpu:x', torch='0', threads=threads)\n"
        "        print('made with', threads)\n"
        "    except LatencyTableError as exc:\n"
        "        assert 'from 1 to this machine' in str(exc), exc\n"
        "print('threads', torch.get_num_threads())\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == [f"threads {torch.get_num_threads()}"], run.stdout


# L21: a time nobody could measure -----------------------------------------------------
@pytest.mark.parametrize("ms", [1e308, MAX_MS * 2, -1.0, "fast", None, True])
def test_a_table_time_out_of_range_is_refused_naming_the_part(ms, tmp_path):
    path = _write(tmp_path, _table(entries={"module_call": 0.01, "Conv2d(...)": ms}))
    with pytest.raises(LatencyTableError, match=r"Conv2d\(\.\.\.\)") as info:
        read(path)
    assert "\n" not in str(info.value)


# L16, L17, L18: files that are not regular or not bounded -----------------------------
def test_a_device_a_fifo_or_a_folder_is_refused_without_reading(tmp_path):
    """L16, L17: /dev/zero was read until memory ran out, a FIFO blocked forever. Each is
    tried in a process of its own, with its memory and its time bounded, so that a
    regression fails this test instead of the machine."""
    fifo = tmp_path / "table.fifo"
    os.mkfifo(fifo)
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "from autosearch.scoring.latency import LatencyTableError, read\n"
        "try:\n"
        "    read(sys.argv[1])\n"
        "except LatencyTableError as exc:\n"
        "    print(exc)\n"
    )
    for path, kind in (
        ("/dev/zero", "a character device"),
        (fifo, "a FIFO"),
        (tmp_path, "a folder"),
    ):
        try:
            run = subprocess.run(
                [sys.executable, "-c", script, str(path)],
                capture_output=True,
                text=True,
                timeout=300,  # a blocked open never returns: the bound only catches that
            )
        except subprocess.TimeoutExpired:
            raise AssertionError(f"reading {path} did not return") from None
        assert run.returncode == 0, run.stderr[-1000:]
        said = run.stdout.strip()
        assert kind in said and len(said.splitlines()) == 1, said


def test_json_nested_past_the_parser_is_refused_in_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(LatencyTableError, match="nests its JSON too deep"):
        read(path)


def test_a_file_over_its_bound_is_refused_before_it_is_read(tmp_path):
    from autosearch._files import NotReadable, read_bounded

    path = tmp_path / "big.json"
    path.write_bytes(b" " * 2048)
    with pytest.raises(NotReadable, match="holds 2,048 bytes, more than 1,024 bytes"):
        read_bounded(path, limit=1024)
    assert read_bounded(path, limit=4096) == b" " * 2048


# The property: whatever a table's fields hold, reading it gives a usable table or one line.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
FIELD_VALUES = {
    "device": st.one_of(JSON, st.text(max_size=300)),
    "torch": st.one_of(JSON, st.just(TORCH)),
    "threads": st.one_of(JSON, st.integers(-10, 10**7)),
    "entries": st.one_of(
        JSON, st.dictionaries(st.text(max_size=10), st.one_of(st.floats(), JSON), max_size=4)
    ),
}


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    changes=st.fixed_dictionaries({}, optional=FIELD_VALUES),
    dropped=st.sets(st.sampled_from(sorted(FIELD_VALUES)), max_size=2),
)
def test_whatever_a_table_holds_it_is_read_whole_or_refused_in_one_line(changes, dropped, tmp_path):
    stored = {k: v for k, v in _table(**changes).items() if k not in dropped}
    path = _write(tmp_path, stored)
    try:
        table = read(path)
    except LatencyTableError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        return
    assert 1 <= table.threads <= CPUS and not isinstance(table.threads, bool)
    assert table.device.isprintable() and table.torch == TORCH
    assert all(0 <= ms <= MAX_MS and math.isfinite(ms) for ms in table.entries.values())


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(data=st.binary(max_size=200))
def test_whatever_bytes_a_json_file_holds_it_is_parsed_or_refused(data):
    import tempfile

    from autosearch._files import NotReadable, read_json

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(data)
        f.flush()
        try:
            read_json(f.name, limit=1024)
        except NotReadable as exc:
            assert "\n" not in str(exc)


# B6: a journal that is a device ------------------------------------------------------------
def _bounded(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``autosearch ARGV`` in a process of its own whose memory and time are bounded: a
    regression that reads a device without end fails the test, not the machine."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    return subprocess.run(
        [sys.executable, "-m", "autosearch.cli", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
    )


def test_a_journal_that_is_a_device_is_refused_by_worker_and_status():
    """B6: `journal:/dev/zero` made `worker` read until MemoryError, and `status` called
    it a folder."""
    for argv in (
        ["worker", "--study", "x", "--storage", "journal:/dev/zero", "--n-trials", "1"],
        ["status", "--study", "x", "--storage", "journal:/dev/zero"],
    ):
        run = _bounded(argv)
        err = run.stderr.strip()
        assert run.returncode == 2, err[-2000:]
        assert "names a character device, not a file" in err and "folder" not in err, err
        assert len(err.splitlines()) == 1


def test_a_journal_that_is_a_device_is_not_created_over(tiny_space):
    with pytest.raises(StorageError, match="names a character device, not a file"):
        create_study("x", controller=RandomSearch(tiny_space, seed=0), storage="journal:/dev/null")


# W8: a study file that is not a file ------------------------------------------------------
@pytest.mark.parametrize("which", ["folder", "/dev/null"])
def test_a_study_file_that_is_a_folder_or_a_device_is_named_so(which, tmp_path):
    path = tmp_path if which == "folder" else which
    with pytest.raises(StudyFileError) as info:
        load_spec(path)
    message = str(info.value)
    assert "does not exist" not in message
    assert ("a folder" if which == "folder" else "a character device") in message


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda card: os.mkfifo(card), "is a FIFO (named pipe), not a regular file"),
        (lambda card: os.symlink("/dev/zero", card), "is a character device, not a regular"),
        (lambda card: os.symlink(card.parent / "gone.json", card), "does not exist"),
        (lambda card: card.mkdir(), "is a folder, not a regular file"),
        (lambda card: card.write_text('{"training": {"seed": "x"}}'), "invalid literal"),
        (lambda card: card.write_text('{"training": {"train": [1]}}'), "argument after **"),
    ],
)
def test_an_exports_card_that_is_there_is_read_or_refused_never_taken_as_absent(
    tmp_path, make, said
):
    """An arch.json that was a FIFO or a link to /dev/zero trained with the default
    settings without a word: only an absent card means the defaults."""
    from autosearch.errors import ExportError
    from autosearch.export.retrain import recipe

    assert recipe(tmp_path) == (None, 0, TrainConfig())  # absent: defaults
    make(tmp_path / "arch.json")
    with pytest.raises(ExportError, match="arch.json cannot be read") as refused:
        recipe(tmp_path)
    assert said in str(refused.value) and "\n" not in str(refused.value)
