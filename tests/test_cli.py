from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _trials import sigterm_after_first_epoch

from autosearch import StudyFileError
from autosearch.cli import main
from autosearch.studyfile import load_spec

ROOT = Path(__file__).resolve().parents[1]

TINY_STUDY = textwrap.dedent(
    """
    from autosearch import StudySpec, TrainConfig
    from controllers import RandomSearch
    from search_spaces import ResNetSpace

    study = StudySpec(
        name="cli-tiny",
        controller=RandomSearch(
            ResNetSpace(max_stages=2, depths=(1,), widths=(4, 8), stem_widths=(4,)), seed=0
        ),
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
        n_trials=2,
    )
    """
)


@pytest.fixture
def study_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tiny.py"
    path.write_text(TINY_STUDY)
    return path


def test_run_status_report_export(study_file, tmp_path, capsys):
    assert main(["run", str(study_file)]) == 0
    out = capsys.readouterr().out
    assert "Pareto front" in out and "report:  runs/cli-tiny/report.html" in out
    run_dir = tmp_path / "runs" / "cli-tiny"
    assert (run_dir / "study.db").is_file() and (run_dir / "best" / "model.py").is_file()
    html = (run_dir / "report.html").read_text()
    assert "Plotly.newPlot" in html and "cli-tiny" in html and "Pareto front" in html

    # A second run finds the budget spent and trains nothing.
    assert main(["run", str(study_file)]) == 0
    assert "2 of 2 trials done, running 0" in capsys.readouterr().out

    assert main(["status", str(study_file), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["trials"] == {"complete": 2, "failed": 0, "running": 0}
    assert status["pareto"] and status["space"] == "resnet"

    assert main(["status", "--study", "cli-tiny"]) == 0
    assert "2 complete" in capsys.readouterr().out

    assert main(["export", str(study_file), "--trial", "1", "--out", "exp"]) == 0
    assert "ONNX checked in onnxruntime" in capsys.readouterr().out
    assert (tmp_path / "exp" / "model.safetensors").is_file()
    assert main(["export", str(study_file), "--best", "--out", "exp2", "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert "model.onnx" in card["files"] and card["onnx"]["max_abs_diff"] < 1e-4
    assert main(["export", str(study_file), "--variant", "int8", "--out", "exp3"]) == 2
    assert "no complete 'int8' record; measured variants: base" in capsys.readouterr().err
    assert main(["report", str(study_file), "--out", "r.html", "--json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["report"] == "r.html"
    assert (tmp_path / "r.html").stat().st_size > 1_000_000  # plotly.js inlined: works offline


def test_optuna_cli_reads_the_study_unchanged(study_file, tmp_path):
    assert main(["run", str(study_file), "--no-export"]) == 0
    optuna_cli = shutil.which("optuna", path=str(Path(sys.executable).parent))
    assert optuna_cli, "the optuna console script is installed with optuna"
    result = subprocess.run(
        [
            optuna_cli,
            "trials",
            "--study-name",
            "cli-tiny",
            "--storage",
            "sqlite:///runs/cli-tiny/study.db",
            "-f",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
        cwd=tmp_path,
    )
    trials = json.loads(result.stdout)
    assert [t["number"] for t in trials] == [0, 1]
    assert all(t["state"] == "COMPLETE" and "stage1.width" in t["params"] for t in trials)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("x = 1\n", "defines no study"),
        ("raise RuntimeError('oops')\n", "failed to run: RuntimeError: oops"),
        (TINY_STUDY + "\nother = study\n", "defines 2 studies"),
    ],
)
def test_bad_study_files(tmp_path, source, match, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "bad.py"
    path.write_text(source)
    with pytest.raises(StudyFileError, match=match):
        load_spec(path)
    assert main(["run", str(path)]) == 2
    assert match.split(":")[0] in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing created


def test_missing_study_file_and_unknown_study(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "nope.py"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["status", "--study", "nothing-here"]) == 2
    assert "runs/nothing-here/study.db does not exist" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # reading a study creates nothing


def test_a_run_of_zero_trials_of_a_new_study_says_so(study_file, tmp_path, capsys):
    """It said the database "does not exist ... (or run the study first)"."""
    assert main(["run", str(study_file), "--n-trials", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autosearch: error: n_trials is 0, so `run` only reports on study ")
    assert "'cli-tiny', which has not run here" in err and "or run the study first" not in err
    assert err.endswith(f"give {study_file} n_trials > 0, or --n-trials N, to run it")
    assert not (tmp_path / "runs").exists()


def test_the_default_study_file_defines_digits_quick():
    spec = load_spec(ROOT / "studies" / "digits_quick.py")
    assert spec.name == "digits-quick" and spec.data == "digits"
    assert spec.storage == "sqlite:///runs/digits-quick/study.db"
    assert spec.variants == ("base", "prune-channels@0.5", "int8")  # the default study


def test_search_measures_variants_and_shows_them(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["search", "cli-variants", "--space", "resnet", "--n-trials", "2", "--epochs", "1"]
    args += ["--max-flops", "2e6", "--variants", "base,prune-l1@0.5", "--reward", "hard@flops=1e9"]
    assert main(args) == 0
    capsys.readouterr()  # the search's own output
    assert main(["status", "--study", "cli-variants", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["trials"]["complete"] == 2
    assert {p["variant"] for p in status["pareto"]} <= {"base", "prune-l1@0.5"}
    assert main(["search", "cli-variants", "--space", "resnet", "--variants", "int9"]) == 2
    assert "did you mean 'int8'" in capsys.readouterr().err.lower()


def test_help_shows_each_default_and_plain_text(capsys):
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for shown in ("(default: random)", "(default: 10)", "(default: digits)", "(default: 0)"):
        assert shown in text, shown
    assert "per image of --data" in text and "``" not in text


# Libraries a command loads only where it uses them: every CLI command, worker and
# torchrun rank pays what the parser's imports cost.
_HEAVY = ("scipy", "sklearn", "mlflow", "ray", "onnx", "onnxruntime", "onnxscript", "torchao")


def test_the_cli_and_the_packages_of_spaces_and_controllers_load_no_heavy_library():
    probe = (
        "import json, sys; from autosearch.cli import parser; parser.build_parser(); "
        "import controllers, search_spaces; print(json.dumps([m for m in sys.modules]))"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = {name.split(".")[0] for name in json.loads(run.stdout)}
    assert "torch" in loaded and not loaded & set(_HEAVY), sorted(loaded & set(_HEAVY))


def test_a_flops_budget_is_counted_at_the_datas_image_size(tmp_path, monkeypatch):
    """`search --max-flops` on 8×8 digits: the budget holds at 1×8×8, not 3×32×32."""
    import autosearch

    monkeypatch.chdir(tmp_path)
    argv = ["search", "b", "--space", "resnet", "--max-flops", "2e6", "--epochs", "1"]
    assert main([*argv, "--n-trials", "2"]) == 0
    study = autosearch.load_study("b", storage="sqlite:///runs/b/study.db")
    assert study.space.budget_input == (1, 8, 8)
    assert all(r.flops <= 2e6 for r in study.records())


def test_a_run_where_every_trial_failed_says_why(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text(
        TINY_STUDY.replace("lr=0.1", "lr=1e30").replace("cli-tiny", "cli-bad")
    )
    assert main(["run", "bad.py"]) == 1
    out = capsys.readouterr().out
    assert "all 2 trials failed; the last said: TrialFailed: loss became" in out
    assert "Run trials with" not in out  # more trials would fail the same way


def test_an_interrupted_run_says_so_and_exits_with_the_signal(tmp_path):
    """SIGTERM mid-trial: the epoch's checkpoint is written, the run says it was
    interrupted (no Pareto front, no export, as if done) and exits 128 + 15."""
    import signal

    # Epochs enough that the trial cannot end between the epoch seen and the signal
    # (4 epochs of this tiny network took under a second on a fast machine, so the trial
    # sometimes completed first: "after 1 of 2 trials"); the run stops after one more.
    (tmp_path / "slow.py").write_text(
        TINY_STUDY.replace("epochs=1", "epochs=500").replace("cli-tiny", "cli-slow")
    )
    cli = Path(sys.executable).with_name("autosearch")
    url = f"sqlite:///{tmp_path}/runs/cli-slow/study.db"
    code, out = sigterm_after_first_epoch([str(cli), "run", "slow.py"], tmp_path, "cli-slow", url)
    assert code == 128 + signal.SIGTERM, out[-2000:]
    assert "interrupted (SIGTERM) after 0 of 2 trials" in out and "Run the same command" in out
    assert "Pareto front" not in out and "export:" not in out


def test_the_readmes_python_snippets_can_run_again():
    """A snippet run again (after a fault, or Ctrl-C) continues its study instead of
    failing on "already exists": every create_study in the README and the guide pages
    says load_if_exists=True. (The executed tutorials make fresh studies in temporary
    folders: they run once per build.)"""
    import re

    pages = [ROOT / "README.md", ROOT / "docs" / "get-started.md"]
    pages += sorted((ROOT / "docs" / "guide").glob("*.md"))
    text = "\n".join(page.read_text() for page in pages)
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    lines = ["\n" + b for b in blocks if "create_study(" in b]
    calls = [b[b.rindex("\n", 0, b.index("create_study(")) :] for b in lines]  # from its line
    assert len(calls) >= 4
    for call in calls:
        indent = call[: len(call) - len(call.lstrip())]  # the line's own: "\n" and spaces
        closing = call.index(indent + ")")  # the call's own closing parenthesis
        assert "load_if_exists=True" in call[:closing], call[:closing]
