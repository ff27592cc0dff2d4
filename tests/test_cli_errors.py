"""Every option of every command given a bad value: one line on stderr that names the
problem, exit status 2, no traceback, and nothing stored changed."""

from __future__ import annotations

import contextlib
import hashlib
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
        name="errs",
        controller=RandomSearch(
            ResNetSpace(max_stages=2, depths=(1,), widths=(4, 8), stem_widths=(4,)), seed=0
        ),
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
        n_trials=1,
    )
    """
)

SUPERNET = textwrap.dedent(
    """
    from autosearch import StudySpec, SupernetConfig, TrainConfig
    from controllers import RandomSearch
    from search_spaces import ResNetSpace

    space = ResNetSpace(max_stages=2, depths=(1, 2), widths=(4, 8), stem_widths=(4,)).supernet(
        fixed={"stages": 2, "block": "basic", "shortcut": "pad"}
    )
    study = StudySpec(
        name="errs-supernet",
        controller=RandomSearch(space, seed=0),
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
        supernet=SupernetConfig(train=TrainConfig(epochs=1, batch_size=128, lr=0.1)),
        n_trials=1,
    )
    """
)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A study file with one trial run, and an export of it."""
    root = tmp_path_factory.mktemp("cli-errors")
    (root / "s.py").write_text(STUDY)
    (root / "sn.py").write_text(SUPERNET)  # never run: its bad values are refused first
    for name, change in BAD_SPECS.items():  # StudySpec fields of the wrong type
        (root / name).write_text(STUDY.replace(*change))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        assert main(["run", "s.py", "--out", str(root / "out")]) == 0
    return root


# Study files whose StudySpec holds a field of the wrong type (issue 43: B2, B3): a
# traceback before, the first after creating runs/NAME/study.db.
BAD_SPECS = {
    "ntr.py": ("n_trials=1", 'n_trials="ten"'),
    "name5.py": ('name="errs"', "name=5"),
    "seed.py": ("n_trials=1", "n_trials=1, seed=-1"),
}
F = "{root}/s.py"
DB = "sqlite:///{root}/runs/errs/study.db"
EXPORT = "{root}/out/best"

CASES = {
    # run
    "run: missing study file": (["run", "{root}/nope.py"], "does not exist"),
    "run: negative trial budget": (
        ["run", F, "--n-trials", "-5"],
        "--n-trials: expected an integer >= 0",
    ),
    "run: trial budget not a number": (["run", F, "--n-trials", "many"], "expected an integer"),
    "run: bad storage URL": (["run", F, "--storage", "mongodb://x/y"], "unknown storage scheme"),
    "run: no workers": (["run", F, "--workers", "0"], "--workers: expected an integer >= 1"),
    "run: a time budget of none": (
        ["run", F, "--timeout", "0"],
        "--timeout: expected a number > 0",
    ),
    "run: unknown executor": (["run", F, "--executor", "dask"], "invalid choice: 'dask'"),
    "run: ray address without ray": (
        ["run", F, "--ray-address", "127.0.0.1:1"],
        "use it with --executor ray",
    ),
    "run: no workers a GPU": (["run", F, "--per-gpu", "0"], "--per-gpu: expected an integer >= 1"),
    "run: workers a GPU on Slurm": (
        ["run", F, "--executor", "slurm", "--per-gpu", "2"],
        "each job gets the GPUs of its task (drop --per-gpu)",
    ),
    "run: no processes": (
        ["run", F, "--nproc-per-node", "0"],
        "--nproc-per-node: expected an integer >= 1",
    ),
    "run: another artifacts folder than the stored one": (
        ["run", F, "--artifacts", "{root}/elsewhere"],
        "keeps its weights in",
    ),
    "run: a tracking URI of no MLflow kind": (
        ["run", F, "--mlflow", "mongodb://x/y"],
        "unknown MLflow tracking URI scheme 'mongodb'",
    ),
    "run: a TensorBoard folder that is a file": (
        ["run", F, "--tensorboard", "/dev/null"],
        "tensorboard='/dev/null' is not a folder",
    ),
    "run: unwritable output": (
        ["run", F, "--out", "/proc/autosearch/out"],
        "cannot write the report",
    ),
    "run: n_trials that is text": (
        ["run", "{root}/ntr.py"],
        "StudySpec n_trials must be an integer >= 0, got 'ten'",
    ),
    "run: a name that is a number": (["run", "{root}/name5.py"], "study's name must be"),
    "run: a negative seed": (["run", "{root}/seed.py"], "seed=-1 cannot be used"),
    "run: a study file that is a folder": (["run", "{root}"], "is a folder, not a regular file"),
    "run: a study file that is a device": (
        ["run", "/dev/null"],
        "is a character device, not a regular file",
    ),
    # supernet
    "supernet: a study without one": (["supernet", F], "defines no supernet"),
    "supernet: --retrain on a study without one": (
        ["supernet", F, "--retrain"],
        "defines no supernet",
    ),
    "supernet: no processes": (
        ["supernet", "{root}/sn.py", "--nproc-per-node", "0"],
        "--nproc-per-node: expected an integer >= 1",
    ),
    "supernet: artifacts URL without a bucket": (
        ["supernet", "{root}/sn.py", "--artifacts", "s3://"],
        "names no bucket",
    ),
    # search
    "search: unknown space": (["search", "x", "--space", "resnett"], "Did you mean 'resnet'"),
    "search: unknown controller": (
        ["search", "x", "--space", "resnet", "--controller", "evo"],
        "unknown controller 'evo'",
    ),
    "search: negative trials": (
        ["search", "x", "--space", "resnet", "--n-trials", "-1"],
        "--n-trials: expected an integer >= 0",
    ),
    "search: unknown data": (
        ["search", "x", "--space", "resnet", "--data", "digitz"],
        "Did you mean 'digits'",
    ),
    "search: zero epochs": (
        ["search", "x", "--space", "resnet", "--epochs", "0"],
        "TrainConfig epochs=0",
    ),
    "search: missing table": (
        ["search", "x", "--space", "nb201", "--table", "{root}/none.csv"],
        "does not exist",
    ),
    "search: unknown objective": (
        ["search", "x", "--space", "resnet", "--objectives", "accuracy,flop"],
        "Did you mean 'flops'",
    ),
    "search: unknown variant": (
        ["search", "x", "--space", "resnet", "--variants", "base,int4"],
        "unknown variant 'int4'",
    ),
    "search: unknown reward": (
        ["search", "x", "--space", "resnet", "--reward", "mnaz"],
        "unknown reward 'mnaz'",
    ),
    "search: malformed reward": (
        ["search", "x", "--space", "resnet", "--reward", "mnas@flops=lots"],
        "must be numbers",
    ),
    "search: negative FLOPs budget": (
        ["search", "x", "--space", "resnet", "--max-flops", "-1"],
        "--max-flops: expected a number > 0",
    ),
    "search: zero params budget": (
        ["search", "x", "--space", "resnet", "--max-params", "0"],
        "--max-params: expected a number > 0",
    ),
    "search: negative seed": (
        ["search", "x", "--space", "resnet", "--seed", "-3"],
        "--seed: expected an integer >= 0",
    ),
    "search: unwritable output": (
        ["search", "x", "--space", "resnet", "--out", "/proc/x"],
        "cannot write the report and export to",
    ),
    "search: unknown proxy": (
        ["search", "x", "--space", "resnet", "--proxies", "synflw"],
        "--proxies: unknown proxy 'synflw'. Did you mean 'synflow'?",
    ),
    "search: a warm-up without proxies": (
        ["search", "x", "--space", "resnet", "--controller", "zero_cost"],
        "add --proxies default (the zero-cost estimate's proxies)",
    ),
    "search: bad table columns": (
        ["search", "x", "--space", "nb201", "--table", "t.csv", "--table-columns", "acc=v"],
        "--table-columns: expected NAME=COLUMN pairs",
    ),
    "search: artifacts URL without a bucket": (
        ["search", "x", "--space", "resnet", "--artifacts", "s3://"],
        "names no bucket",
    ),
    "search: huge seed": (
        ["search", "x", "--space", "resnet", "--seed", "9" * 30],
        "--seed: expected an integer from 0 to 2147483647",
    ),
    "search: bad storage": (
        ["search", "x", "--space", "resnet", "--storage", "runs/x.db"],
        "has no scheme",
    ),
    # reading commands
    "status: no study named": (
        ["status", "--study", "nope", "--storage", DB],
        "no study named 'nope'",
    ),
    "status: neither file nor name": (["status"], "name the study"),
    "status: a PostgreSQL server that is not there": (
        ["status", "--study", "x", "--storage", "postgresql://postgres@127.0.0.1:1/test"],
        "Connection refused",
    ),
    "report: unwritable path": (
        ["report", F, "--out", "/proc/autosearch/r.html"],
        "cannot write the report",
    ),
    "export: no such trial": (["export", F, "--trial", "7"], "no trial number 7"),
    "export: negative trial": (["export", F, "--trial", "-1"], "--trial: expected an integer >= 0"),
    "export: huge trial": (["export", F, "--trial", "9" * 30], "expected an integer from 0 to"),
    "export: budget nothing fits": (["export", F, "--best", "--max-flops", "1"], "smallest has"),
    "export: unmeasured variant": (["export", F, "--variant", "int8"], "no complete 'int8' record"),
    "export: unknown variant": (
        ["export", F, "--trial", "0", "--variant", "int4"],
        "no trial number 0 with variant 'int4'",
    ),
    "export: negative fine-tuning": (
        ["export", F, "--finetune", "-1"],
        "--finetune: expected an integer >= 0",
    ),
    "export: unwritable folder": (
        ["export", F, "--out", "/proc/autosearch/x"],
        "cannot create export folder",
    ),
    "export: an MLflow URI of no known scheme": (
        ["export", F, "--mlflow", "mongodb://x/y"],
        "unknown MLflow tracking URI scheme 'mongodb'",
    ),
    "export: a model registered without MLflow": (
        ["export", F, "--register", "best"],
        "--register NAME registers an MLflow model: add --mlflow",
    ),
    "rerun: no such trial": (["rerun", F, "--trial", "9"], "no trial number 9"),
    # latency-table
    "latency-table: no samples": (
        ["latency-table", F, "--out", "{root}/t.json", "--samples", "0"],
        "--samples must be >= 1",
    ),
    "latency-table: seed not a number": (
        ["latency-table", F, "--out", "{root}/t.json", "--seed", "x"],
        "invalid int value",
    ),
    "latency-table: unwritable table": (
        ["latency-table", F, "--out", "/proc/autosearch/t.json", "--samples", "1"],
        "cannot write latency table",
    ),
    # worker
    "worker: no study named": (
        ["worker", "--study", "nope", "--storage", DB],
        "no study named 'nope'",
    ),
    "worker: an empty tracking URI": (
        ["worker", "--study", "errs", "--storage", DB, "--mlflow", " "],
        "expected a tracking URI",
    ),
    "worker: a TensorBoard folder that is a file": (
        ["worker", "--study", "errs", "--storage", DB, "--tensorboard", "/dev/null"],
        "is not a folder",
    ),
    "worker: bad storage": (["worker", "--study", "errs", "--storage", "errs.db"], "has no scheme"),
    "worker: a storage that does not exist": (  # B8: made the folder and an empty study
        ["worker", "--study", "errs", "--storage", "sqlite:///{root}/missing/x.db"],
        "does not exist; check the path",
    ),
    "worker: negative trials": (
        ["worker", "--study", "errs", "--storage", DB, "--n-trials", "-2"],
        "--n-trials: expected an integer >= 0",
    ),
    "worker: a time budget that is not a number": (
        ["worker", "--study", "errs", "--storage", DB, "--timeout", "soon"],
        "--timeout: expected a number > 0",
    ),
    "worker: an evaluator that is not MODULE:NAME": (
        ["worker", "--study", "errs", "--storage", DB, "--evaluator", "evaluate"],
        "--evaluator 'evaluate': expected MODULE:NAME",
    ),
    "worker: an evaluator to a study of the built-in trainer": (
        ["worker", "--study", "errs", "--storage", DB, "--evaluator", "json:dumps"],
        "trains its candidates with autosearch's trainer",
    ),
    "worker: a total that is not a count": (
        ["worker", "--study", "errs", "--storage", DB, "--total", "2.5"],
        "--total: expected an integer >= 0, got '2.5'",
    ),
    "worker: no failures allowed": (
        ["worker", "--study", "errs", "--storage", DB, "--max-failures", "0"],
        "--max-failures: expected an integer >= 1",
    ),
    # train
    "train: not an export": (["train", "{root}"], "has no model.py"),
    "train: unknown data": (["train", EXPORT, "--data", "digitz"], "Did you mean 'digits'"),
    "train: zero epochs": (["train", EXPORT, "--epochs", "0"], "TrainConfig epochs=0"),
    "train: unknown parallel": (
        ["train", EXPORT, "--parallel", "zero3"],
        "invalid choice: 'zero3'",
    ),
    "train: shard size without hsdp": (
        ["train", EXPORT, "--shard-size", "2"],
        "applies to parallel='hsdp' only",
    ),
    "confirm: population of one": (
        ["confirm", F, "--population", "1"],
        "--population: expected an integer >= 2",
    ),
    "confirm: zero population interval": (
        ["confirm", F, "--population", "2", "--population-interval", "0"],
        "--population-interval: expected an integer >= 1",
    ),
    "population: population of one": (
        ["population", F, "--size", "1"],
        "--size: expected an integer >= 2",
    ),
    "population: zero interval": (
        ["population", F, "--interval", "0"],
        "--interval: expected an integer >= 1",
    ),
    "population: negative trial": (
        ["population", F, "--trial", "-1"],
        "--trial: expected an integer >= 0",
    ),
    "population: no such trial": (["population", F, "--trial", "99"], "no trial number 99"),
    "train: population of one": (
        ["train", EXPORT, "--population", "1"],
        "--population: expected an integer >= 2",
    ),
    "train: zero population interval": (
        ["train", EXPORT, "--population", "2", "--population-interval", "0"],
        "--population-interval: expected an integer >= 1",
    ),
    "train: missing schedule": (
        ["train", EXPORT, "--schedule", "{root}/nope.json"],
        "cannot read the schedule",
    ),
    "train: zero batch": (["train", EXPORT, "--batch-size", "0"], "TrainConfig batch_size=0"),
    "train: negative lr": (["train", EXPORT, "--lr", "-1"], "TrainConfig lr=-1.0"),
    "train: infinite lr": (["train", EXPORT, "--lr", "inf"], "TrainConfig lr=inf"),
    "train: unknown precision": (
        ["train", EXPORT, "--precision", "fp8"],
        "TrainConfig precision='fp8'",
    ),
    "train: negative padding": (
        ["train", EXPORT, "--crop-padding", "-2"],
        "TrainConfig crop_padding=-2",
    ),
    "train: negative seed": (["train", EXPORT, "--seed", "-1"], "--seed: expected an integer >= 0"),
    "train: huge seed": (["train", EXPORT, "--seed", "1" + "0" * 25], "from 0 to 2147483647"),
    "train: no processes": (
        ["train", EXPORT, "--nproc-per-node", "0"],
        "--nproc-per-node: expected an integer >= 1",
    ),
    # the command itself
    "unknown command": (["serch"], "invalid choice: 'serch'"),
}


def _fingerprint(root: Path) -> dict[str, str]:
    """Every file's hash and every folder: a bad value creates nothing, not even an
    empty output folder."""
    return {
        str(p.relative_to(root)): _content(p) if p.is_file() else ""
        for p in sorted(root.rglob("*"))
        if "full" not in p.parts
        and "__pycache__" not in p.parts
        and not p.name.endswith(("-wal", "-shm", "-journal"))
    }


def _content(path: Path) -> str:
    """A file's hash; an SQLite database's by what it stores (read through its write-ahead
    log: whether a connection still open elsewhere has checkpointed it or not)."""
    if path.suffix == ".db":
        with contextlib.closing(sqlite3.connect(path)) as db:
            return hashlib.sha256("\n".join(db.iterdump()).encode()).hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_value_is_one_line_and_exit_2(case, made, capsys, monkeypatch):
    monkeypatch.chdir(made)
    argv, expected = CASES[case]
    before = _fingerprint(made)
    try:
        code = main([a.format(root=made) for a in argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, f"{case}: exit {code}\n{out}\n{err}"
    assert "Traceback" not in err + out
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"{case}: {err!r}"
    assert expected in lines[0], f"{case}: {lines[0]!r}"
    assert _fingerprint(made) == before  # nothing stored changed


def test_every_option_has_a_bad_value_case():
    from autosearch.cli.parser import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    tried = {(argv[0], a) for argv, _ in CASES.values() for a in argv if a.startswith("--")}
    missing = [
        f"{name} {option}"
        for name, sub in commands.items()
        for action in sub._actions
        for option in action.option_strings
        if option.startswith("--")
        and option
        not in (
            "--help",
            "--json",
            "--best",
            "--flip",
            "--no-flip",
            "--study",
            "--storage",
            "--ranker",
            "--no-export",  # flags: no value to get wrong
        )
        and (name, option) not in tried
    ]
    assert not missing, f"options without a bad-value case: {missing}"


def test_a_reader_that_goes_away_is_no_error(made):
    """`autosearch status | head -1`: the pipe closes before the command writes; it
    stops quietly (exit 141, as a shell reports SIGPIPE), with no traceback."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "autosearch.cli", "status", str(made / "s.py")]
    proc = subprocess.Popen(command, cwd=made, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=1800) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
