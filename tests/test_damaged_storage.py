"""Stored studies that are damaged or missing: one line that names the file or the
trial, exit status 2, and commands that read a study never create or change anything."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import textwrap
from pathlib import Path

import pytest

from autosearch.cli import main

STUDY = textwrap.dedent(
    """
    from autosearch import StudySpec, TrainConfig
    from controllers import RandomSearch
    from search_spaces import ResNetSpace

    study = StudySpec(
        name="d",
        controller=RandomSearch(
            ResNetSpace(max_stages=2, depths=(1,), widths=(4, 8), stem_widths=(4,)), seed=0
        ),
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
        n_trials=3,
        storage=STORAGE,
    )
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two stored copies of one 3-trial study: SQLite and a journal file."""
    root = tmp_path_factory.mktemp("damaged")
    for kind, url in (("sqlite", f"sqlite:///{root}/d.db"), ("journal", f"journal:{root}/d.log")):
        (root / f"{kind}.py").write_text(STUDY.replace("STORAGE", repr(url)))
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(root)
            assert main(["run", f"{kind}.py", "--out", str(root / f"out-{kind}")]) == 0
    return root


def _one_line_error(capsys, code: int) -> str:
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err + out, err
    return lines[0]


def _copy(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite study (its latest commits may still be in the WAL),
    with its artifacts folder beside it."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    if not (target.parent / "artifacts").exists():
        shutil.copytree(source.parent / "artifacts", target.parent / "artifacts")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_malformed_trial_is_named_and_left_out(runs, tmp_path, capsys):
    db = tmp_path / "d.db"
    _copy(runs / "d.db", db)
    with sqlite3.connect(db) as edit:  # trial 1's architecture edited into bad JSON
        edit.execute(
            "UPDATE trial_user_attributes SET value_json = ? WHERE key = 'arch' AND trial_id = "
            "(SELECT trial_id FROM trials WHERE number = 1)",
            ('"{not json"',),
        )
    url = f"sqlite:///{db}"
    assert main(["status", "--study", "d", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "2 complete" in out and "left out, unreadable: trial 1" in out
    report = tmp_path / "r.html"
    assert main(["report", "--study", "d", "--storage", url, "--out", str(report)]) == 0
    assert "left out (unreadable)" in report.read_text() and "trial 1" in report.read_text()
    assert main(["export", "--study", "d", "--storage", url, "--out", str(tmp_path / "e")]) == 0


@pytest.mark.parametrize("command", ["status", "report", "export"])
def test_random_bytes_inside_a_sqlite_file_are_one_line(command, runs, tmp_path, capsys):
    db = tmp_path / "d.db"
    _copy(runs / "d.db", db)
    with db.open("r+b") as raw:  # a page in the middle overwritten; the header stays
        raw.seek(db.stat().st_size // 2)
        raw.write(bytes(range(256)) * 16)
    before = _sha(db)
    line = _one_line_error(capsys, main([command, "--study", "d", "--storage", f"sqlite:///{db}"]))
    assert str(db) in line and "damaged" in line
    assert _sha(db) == before


def test_garbage_inside_a_journal_is_one_line(runs, tmp_path, capsys):
    log = tmp_path / "d.log"
    lines = (runs / "d.log").read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:5]) + "garbage {{{\n" + "".join(lines[5:]))
    line = _one_line_error(capsys, main(["status", "--study", "d", "--storage", f"journal:{log}"]))
    assert str(log) in line and "damaged" in line


@pytest.mark.parametrize("command", ["status", "report", "export", "rerun"])
def test_reading_a_missing_or_empty_storage_creates_and_writes_nothing(command, tmp_path, capsys):
    extra = ["--trial", "0"] if command == "rerun" else []
    missing = tmp_path / "nowhere" / "x.db"
    code = main([command, "--study", "x", "--storage", f"sqlite:///{missing}", *extra])
    assert "does not exist" in _one_line_error(capsys, code)
    assert not missing.parent.exists()
    empty = tmp_path / "empty.db"
    empty.touch()
    code = main([command, "--study", "x", "--storage", f"sqlite:///{empty}", *extra])
    assert "is empty (0 bytes)" in _one_line_error(capsys, code)
    assert empty.stat().st_size == 0


def test_reading_commands_leave_the_storage_byte_for_byte(runs, tmp_path, capsys):
    db = tmp_path / "d.db"
    _copy(runs / "d.db", db)
    before = _sha(db)
    url = f"sqlite:///{db}"
    assert main(["status", "--study", "d", "--storage", url]) == 0
    assert (
        main(["report", "--study", "d", "--storage", url, "--out", str(tmp_path / "r.html")]) == 0
    )
    assert main(["export", "--study", "d", "--storage", url, "--out", str(tmp_path / "e")]) == 0
    assert _sha(db) == before


def test_run_with_no_trials_to_run_creates_no_study(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "s.py"
    study.write_text(STUDY.replace("STORAGE", repr(f"sqlite:///{tmp_path}/s.db")))
    line = _one_line_error(capsys, main(["run", str(study), "--n-trials", "0"]))
    assert "does not exist" in line and not (tmp_path / "s.db").exists()


def test_a_study_file_that_exits_is_an_error_not_a_silent_success(tmp_path, capsys):
    study = tmp_path / "exits.py"
    study.write_text("raise SystemExit(0)\n")
    line = _one_line_error(capsys, main(["status", str(study)]))
    assert "exited while it was read" in line


def test_an_export_whose_model_file_raises_is_one_line(runs, tmp_path, capsys):
    export = tmp_path / "broken"
    shutil.copytree(runs / "out-sqlite" / "best", export)
    source = (export / "model.py").read_text()
    (export / "model.py").write_text(source + "\nraise RuntimeError('edited by hand')\n")
    line = _one_line_error(capsys, main(["train", str(export), "--epochs", "1"]))
    assert "model.py failed to load: RuntimeError: edited by hand" in line


@pytest.mark.parametrize("damage", ["shrunk", "replaced", "rewritten", "deleted"])
def test_a_journal_changed_under_its_reader_is_refused_before_anything_is_written(tmp_path, damage):
    """J3's class: a journal only grows. One that shrank, was replaced, rewritten to
    the same length, or deleted under an open storage stops the next read or write."""
    import optuna

    from autosearch.errors import PlatformError
    from autosearch.storage._urls import open_storage

    journal = tmp_path / "j.log"
    storage = open_storage(f"journal:{journal}")
    study = optuna.create_study(storage=storage, study_name="j")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    data = journal.read_bytes()
    if damage == "shrunk":
        journal.write_bytes(data[: len(data) // 2])
    elif damage == "replaced":  # by another journal (its inode may be the freed one)
        journal.unlink()
        journal.write_bytes(data.replace(b'"j"', b'"k"') + data)
    elif damage == "rewritten":
        journal.write_bytes(data[:-40] + b"x" * 39 + b"\n")
    else:
        journal.unlink()
    before = journal.read_bytes() if journal.exists() else None
    with pytest.raises(PlatformError, match=f"journal {journal} .*restore the journal"):
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert (journal.read_bytes() if journal.exists() else None) == before


@pytest.mark.parametrize("damage", ["zeroed", "replaced"])
def test_trial_weights_that_are_not_those_stored_are_refused_in_one_line(
    runs, tmp_path, capsys, damage
):
    """W2: 64 bytes of a trained trial's weights zeroed (still valid safetensors) were
    loaded and exported with no line, arch.json stating the stored accuracy. The trial
    stores its weights' digest; every load (export, load_model, a bucket's copy) checks
    it, and the file's own."""
    import autosearch
    from autosearch.errors import PlatformError
    from autosearch.study.records import weights_digest, weights_id

    db = tmp_path / "d.db"
    _copy(runs / "d.db", db)
    url = f"sqlite:///{db}"
    study = autosearch.load_study("d", storage=url)
    trial = study.trials.all()[0]
    assert weights_digest(trial)  # stored with the trial
    weights = tmp_path / "artifacts" / weights_id(trial)
    data = bytearray(weights.read_bytes())
    if damage == "zeroed":  # in the middle of the tensors' bytes, after the header
        start = 8 + int.from_bytes(data[:8], "little")
        middle = (start + len(data)) // 2
        assert data[middle : middle + 64] != bytes(64)
        data[middle : middle + 64] = bytes(64)
        weights.write_bytes(bytes(data))
    else:  # a whole, valid file of other values, without the file's own digest
        from safetensors.torch import load_file, save_file

        state = load_file(str(weights))
        save_file({k: v * 0 for k, v in state.items()}, str(weights))
    with pytest.raises(PlatformError, match=r"weights of trial 0 are not those it stored"):
        study.load_model(study.record(0))
    code = main(["export", "--study", "d", "--storage", url, "--trial", "0",
                 "--out", str(tmp_path / "x")])  # fmt: skip
    line = _one_line_error(capsys, code)
    assert "weights of trial 0 are not those it stored" in line and "run the trial again" in line
    assert not (tmp_path / "x" / "arch.json").exists()  # nothing exported


def test_a_copied_study_keeps_its_weights_beside_its_copy(runs, tmp_path):
    """A study database copied elsewhere with its artifacts folder read (and would have
    written) the original's folder, by its stored absolute path. A file storage's
    default folder is stored relative to the file: the copy is a study of its own."""
    import autosearch

    db = tmp_path / "d.db"
    _copy(runs / "d.db", db)
    original = autosearch.load_study("d", storage=f"sqlite:///{runs / 'd.db'}")
    copy = autosearch.load_study("d", storage=f"sqlite:///{db}")
    assert original._artifacts.folder == (runs / "artifacts").resolve()
    assert copy._artifacts.folder == (tmp_path / "artifacts").resolve()


def test_studies_whose_storages_share_a_folder_never_share_a_checkpoint(tmp_path, tiny_space):
    """L1: two studies beside each other share the default artifacts folder; an
    architecture both train had one checkpoint folder, each overwriting the other's."""
    import autosearch
    from controllers import RandomSearch

    studies = [
        autosearch.create_study(
            name,
            controller=RandomSearch(tiny_space, seed=0),
            storage=f"sqlite:///{tmp_path}/{name}.db",
        )
        for name in ("a", "b")
    ]
    arch = tiny_space.default()
    a, b = (s._artifacts.attempt(arch, 0) for s in studies)
    assert studies[0]._artifacts.folder == studies[1]._artifacts.folder
    assert a != b and a.is_relative_to(studies[0]._artifacts.folder / "checkpoints")


def test_a_search_ending_sweeps_only_its_own_study(runs, tmp_path, monkeypatch):
    """Two studies beside each other share their artifacts folder: one's end-of-search
    sweep (weights no trial of it refers to) never takes the other's weights."""
    import autosearch

    db = tmp_path / "d.db"
    _copy(runs / "d.db", db)
    shutil.copy(runs / "d.log", tmp_path / "d.log")
    (tmp_path / "journal.py").write_text(
        STUDY.replace("STORAGE", repr(f"journal:{tmp_path}/d.log")).replace(
            "n_trials=3", "n_trials=4"
        )
    )
    monkeypatch.chdir(tmp_path)
    assert main(["run", "journal.py", "--no-export"]) == 0  # one more trial, then the sweep
    beside = autosearch.load_study("d", storage=f"sqlite:///{db}")
    for record in beside.records(variants=False):
        beside.load_model(record)  # every weights file of the other study still there


@pytest.fixture
def four_record_journal(tmp_path):
    """A checked journal of four records: (journal, its path, a record, its size)."""
    from autosearch.storage._journal import CheckedJournalFile

    path = tmp_path / "s.log"
    journal = CheckedJournalFile(str(path))
    record = {"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}
    journal.append_logs([record] * 4)
    return journal, path, record, path.stat().st_size


def test_a_journal_cut_between_the_check_and_the_write_stops_the_worker_in_one_line(
    four_record_journal, monkeypatch
):
    """The cut lands after the journal was checked and before this process appends (a
    race the soak found): the append's own check after writing stops it, and a read of
    the torn line that the cut left is said as the journal's damage, not a traceback of
    JSON."""
    from optuna.storages.journal import JournalFileBackend

    from autosearch.errors import PlatformError
    from autosearch.storage._journal import CheckedJournalFile

    journal, path, record, size = four_record_journal
    real = JournalFileBackend.append_logs

    def cut_first(self, logs):
        with path.open("r+b") as file:
            file.truncate(size // 2 + 3)  # mid-line
        real(self, logs)

    monkeypatch.setattr(JournalFileBackend, "append_logs", cut_first)
    with pytest.raises(PlatformError, match=r"journal .*s\.log (shrank|was rewritten)"):
        journal.append_logs([record])
    monkeypatch.undo()
    with path.open("ab") as file:  # another worker's record after the torn one
        file.write(b'{"op_code": 0, "worker_id": "w2", "study_name": "t", "directions": [1]}\n')
    fresh = CheckedJournalFile(str(path))
    with pytest.raises(PlatformError, match="holds a line that is not a journal record"):
        list(fresh.read_logs(0))


def test_a_journal_cut_while_it_is_read_is_never_remembered_as_its_length(
    four_record_journal, monkeypatch
):
    """A cut that lands during a read (after its check): the read finds nothing past the
    cut and used to remember the shorter file as seen, so the next append went after
    half a line. The look that remembers the length checks it again."""
    from optuna.storages.journal import JournalFileBackend

    from autosearch.errors import PlatformError

    journal, path, record, size = four_record_journal
    real = JournalFileBackend.read_logs

    def cut_first(self, log_number_from):
        with path.open("r+b") as file:
            file.truncate(size // 2 + 3)
        yield from real(self, log_number_from)

    monkeypatch.setattr(JournalFileBackend, "read_logs", cut_first)
    with pytest.raises(PlatformError, match=r"shrank from \d+ to \d+ bytes"):
        list(journal.read_logs(4))
    monkeypatch.undo()
    with pytest.raises(PlatformError, match="shrank"):  # and it stays refused
        journal.append_logs([record])
    assert path.stat().st_size == size // 2 + 3  # nothing appended after the cut
