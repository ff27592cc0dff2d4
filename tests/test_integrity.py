"""Nothing read runs code, nothing written leaks or scatters: properties over whatever a
stored definition or a bucket listing may hold (hypothesis), and the faults an
adversarial run found, one test each.

A stored study (a database someone sent, a shared server) and a bucket are data. Names
in them resolve only through registries that code filled; paths built from them stay
inside their folder; whatever they hold, opening the study, status, report, export and
a worker either work or fail in one line.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autosearch
from autosearch import AutosearchError, TrainConfig
from autosearch.cli import main
from controllers import RandomSearch

PAYLOAD = "touch PWNED"  # what an evil name would run: a file appears if it ever does

# Names a stored study may hold where a space, controller, sampler or NNI model space is
# named: registered ones, and every shape of "module and attribute" an attacker could try.
NAMES = [
    "resnet",
    "mobilenet",
    "nni",
    "random",
    "evolution",
    "tpe",
    "optuna",
    "qmc",
    "optuna.samplers.QMCSampler",
    "optuna.samplers:QMCSampler",
    "search_spaces.nni_examples:SmallCNN",
    "nni.nas.hub.pytorch:NasBench201",
    "os:system",
    "os.system",
    "posix:system",
    "subprocess:getoutput",
    "subprocess.run",
    "builtins:exec",
    "builtins.eval",
    "canary:boom",
    "canary.boom",
    "canary:Evil",
    "canary:Evil.__init__",
    "evilmod:X",
    "evilmod.X",
    "evilmod",
    "__main__:boom",
    "autosearch.registry:spaces.register",
    "",
]
KWARGS = [
    {"command": PAYLOAD},
    {"cmd": PAYLOAD},
    {"args": ["sh", "-c", PAYLOAD]},
    {"source": f"__import__('os').system({PAYLOAD!r})"},
    {"width": 2},
    {},
]
# Values a stored field may hold: any JSON, the names and keyword arguments above, and
# locations that are not this study's.
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-5, max_value=40)
    | st.sampled_from([10**30, -(10**30), math.nan, math.inf, 1e-300, 0.5])
    | st.text(max_size=12)
    | st.sampled_from(NAMES),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
VALUES = JSON | st.sampled_from(KWARGS)
LOCATIONS = st.sampled_from(
    [
        "../../escape",
        "/nonexistent/escape",
        "s3://bucket/prefix",
        "s3://",
        "s3:///x",
        "",
        "~/escape",
    ]
)
DATA = st.sampled_from(
    [
        "digits",
        "cifar10:/nonexistent",
        "folder:/nonexistent",
        "mnist:/nonexistent",
        "fashion-mnist:/nonexistent",
        "arrays:0123",
        "evilmod:X",
        "",
    ]
)
# Where a mutation goes: a path into the stored definition, and what it may be set to.
TARGETS = st.one_of(
    st.tuples(st.just(("space", "name")), st.sampled_from(NAMES)),
    st.tuples(st.just(("space", "config", "factory")), st.sampled_from(NAMES)),
    st.tuples(st.just(("space", "config", "kwargs")), VALUES),
    st.tuples(st.just(("space", "config")), VALUES),
    st.tuples(st.sampled_from([("space", "config", k) for k in ("widths", "depths", "x")]), JSON),
    st.tuples(st.just(("controller", "name")), st.sampled_from(NAMES)),
    st.tuples(st.just(("controller", "config", "sampler")), st.sampled_from(NAMES)),
    st.tuples(st.just(("controller", "config", "options")), VALUES),
    st.tuples(st.sampled_from([("controller", "config", k) for k in ("seed", "x")]), JSON),
    st.tuples(st.just(("controller",)), VALUES),
    st.tuples(st.just(("artifacts",)), LOCATIONS | JSON),
    st.tuples(st.just(("data",)), DATA),
    st.tuples(st.sampled_from([("objectives",), ("reward",), ("variants",), ("seed",)]), JSON),
    st.tuples(st.sampled_from([("table",), ("early_stopping",), ("format",)]), JSON),
    st.tuples(st.sampled_from([("train", "lr"), ("train", "optimizer")]), JSON),
    st.tuples(st.just(()), JSON),  # the whole definition replaced
    # Fields the adversarial run found unchecked: names, devices, tables, sizes.
    st.tuples(
        st.just(("objectives",)),
        st.lists(st.sampled_from(["accuracy", "flops", "params", "nonsense", ""]), max_size=3),
    ),
    st.tuples(st.just(("train", "device")), st.sampled_from(["tpu", "cuda:x", "", 5, "cpu"])),
    st.tuples(
        st.sampled_from([("table", k) for k in ("path", "key", "input_shape", "num_classes")]),
        JSON,
    ),
    st.tuples(
        st.sampled_from([("space", "config", k) for k in ("widths", "max_stages", "depths")]),
        st.sampled_from([[8, 10**9], 10**6, [10**7], 0, -1]),
    ),
    st.tuples(st.sampled_from([("supernet",), ("supernet", "distill")]), JSON),
)


def _set(tree: Any, path: tuple[str, ...], value: Any) -> Any:
    """``tree`` with the value at ``path`` replaced (made where missing)."""
    if not path:
        return value
    if not isinstance(tree, dict):
        tree = {}
    tree = dict(tree)
    tree[path[0]] = _set(tree.get(path[0]), path[1:], value)
    return tree


class _Canary:
    """Callables an evil name could reach: each call is recorded."""

    calls: ClassVar[list[str]] = []

    @staticmethod
    def boom(*args: Any, **kwargs: Any) -> None:
        _Canary.calls.append(f"boom{args}{kwargs}")

    class Evil:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _Canary.calls.append(f"Evil{args}{kwargs}")


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A trained study (two tiny trials), its stored definition, and its folders."""
    from search_spaces import ResNetSpace

    root = tmp_path_factory.mktemp("integrity")
    space = ResNetSpace(
        min_stages=2, max_stages=2, depths=(1,), widths=(4,), stem_widths=(4, 8), blocks=("basic",)
    )
    url = f"sqlite:///{root}/study/study.db"
    study = autosearch.create_study(
        "kept",
        controller=RandomSearch(space, seed=0),
        storage=url,
        train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
    )
    study.optimize(2)
    definition = study._storage.get_study_user_attrs(study._study_id)["autosearch"]
    # What the commands import on their first run (plotly, onnx, NNI...) is imported
    # here, so that the test sees what a stored definition would make them import.
    out = root / "out"
    for argv in (
        ["status", "--study", "kept", "--storage", url],
        ["report", "--study", "kept", "--storage", url, "--out", str(out / "r.html")],
        ["export", "--study", "kept", "--storage", url, "--trial", "0", "--out", str(out)],
        ["worker", "--study", "kept", "--storage", url, "--n-trials", "1"],
    ):
        assert main(argv) == 0
    try:
        from search_spaces import from_nni

        from_nni("nni.nas.hub.pytorch:NasBench201").domains()
    except ImportError:
        pass  # without the NNI extra, NNI names are refused like any unknown name
    return {"root": root, "url": url, "study": study, "definition": definition}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


_STDLIB = set(sys.stdlib_module_names)


def _top_level() -> set[str]:
    return {name.split(".")[0] for name in list(sys.modules)}


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _one_line_or_works(code: int, output: str, what: str) -> None:
    assert "Traceback" not in output, f"{what}: {output[-2000:]}"
    errors = [line for line in output.splitlines() if line.startswith("autosearch: error")]
    assert code in (0, 2), f"{what} exited {code}: {output[-2000:]}"
    assert (code == 2) == (len(errors) == 1), f"{what}: {output[-2000:]}"


@pytest.mark.slow
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same examples in every run: a test, not a fuzzing campaign
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mutations=st.lists(TARGETS, min_size=1, max_size=3))
def test_whatever_a_stored_definition_holds_nothing_runs_or_leaks(
    mutations, stored, tmp_path_factory, monkeypatch, capsys
):
    study, root, url = stored["study"], stored["root"], stored["url"]
    here = tmp_path_factory.mktemp("cwd")
    (here / "evilmod.py").write_text(
        "from pathlib import Path\nPath('IMPORTED').write_text('yes')\nclass X: pass\n"
    )
    monkeypatch.chdir(here)
    monkeypatch.syspath_prepend(str(here))
    monkeypatch.setitem(sys.modules, "canary", _Canary)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # a bucket fails fast
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "none")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "none")
    _Canary.calls.clear()

    definition = copy.deepcopy(stored["definition"])
    touched = set()
    for path, value in mutations:
        definition = _set(definition, path, value)
        touched.add(path[0] if path else "")
    study._storage.set_study_user_attr(study._study_id, "autosearch", definition)
    before_files = _files(root.parent)
    before_modules = _top_level()
    out = root / "out"
    try:
        try:
            autosearch.load_study("kept", storage=url, read_only=True)
        except AutosearchError as exc:
            assert "\n" not in str(exc).strip(), str(exc)
        reading = [
            ["status", "--study", "kept", "--storage", url, "--json"],
            ["report", "--study", "kept", "--storage", url, "--out", str(out / "r.html")],
            ["export", "--study", "kept", "--storage", url, "--trial", "0", "--out", str(out)],
        ]
        for argv in reading:
            _one_line_or_works(*_cli(argv, capsys), what=argv[0])
        if not touched & {"train", ""}:  # a stored epoch count could make a worker train long
            argv = ["worker", "--study", "kept", "--storage", url, "--n-trials", "1"]
            _one_line_or_works(*_cli(argv, capsys), what="worker")
    finally:
        study._storage.set_study_user_attr(study._study_id, "autosearch", stored["definition"])

    assert not (here / "IMPORTED").exists() and "evilmod" not in sys.modules
    assert not list(here.rglob("PWNED")) and not list(root.rglob("PWNED"))
    assert _Canary.calls == []
    new = _top_level() - before_modules - _STDLIB
    assert not new, f"imported {sorted(new)}"
    # Written only inside the study's folder and the output folder given.
    written = _files(root.parent) - before_files
    outside = sorted(
        p for p in written if not p.startswith((f"{root.name}/study", f"{root.name}/out"))
    )
    assert not outside, outside
    assert {p.name for p in here.iterdir()} <= {"evilmod.py", "__pycache__"}


# Bucket listings ------------------------------------------------------------------------
class _Bucket:
    """An in-memory S3Folder: keys relative to the prefix, read and written whole."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.url = "s3://bucket/prefix"

    def list(self, relative: str) -> list[str]:
        start = relative.rstrip("/") + "/"
        return sorted(k for k in self.objects if k.startswith(start))

    def get(self, relative: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.objects[relative])

    def cache(self) -> Path:  # pragma: no cover - not used: the test gives the folder
        raise AssertionError


SEGMENTS = (
    st.sampled_from(
        ["..", ".", "", "train.pt", "variants", "x.json", "0", "1", "12", "a\\b", "~", "-", "/"]
    )
    | st.text(alphabet="abc./\\\x00-0123456789", max_size=6)
    # Names a file system refuses or that are hard to write: too long (in characters or
    # in UTF-8 bytes), unicode, a lone surrogate.
    | st.sampled_from(["x" * 256, "é" * 128, "x" * 255, "日本語", "naïve", "\udcff", "\ud800"])
)
# Where the listing is taken: a trial's attempts, or the supernet job's claims.
WORKS = {
    "trial": ("checkpoints/ARCH", lambda a, arch: a.start_attempt(arch, 5)),
    "supernet": ("supernet/JOB", lambda a, arch: a.start_job("JOB", 5)),
}


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    kind=st.sampled_from(sorted(WORKS)),
    keys=st.lists(
        st.tuples(
            st.sampled_from(
                ["WORK", "checkpoints/OTHER", "checkpoints", "supernet", "weights", ""]
            ),
            st.lists(SEGMENTS, min_size=0, max_size=5),
        ),
        max_size=8,
    ),
    # A file where a folder must go: ``N/a`` and ``N/a/b`` both listed (and train.pt too).
    collisions=st.lists(
        st.tuples(
            st.sampled_from(["0", "1", "7"]),
            st.sampled_from(["a", "train.pt", "variants", "é"]),
            st.sampled_from(["b", "train.pt", "x.json"]),
        ),
        max_size=3,
    ),
    done=st.booleans(),
)
def test_whatever_a_bucket_lists_nothing_lands_outside_the_attempt(
    kind, keys, collisions, done, tmp_path_factory
):
    """Any object a listing returns is used or skipped with a log line: nothing written
    outside the work folder, no listing that stops the run (the reported case: a name
    over 255 characters, or both ``…/0/a`` and ``…/0/a/b``, made every later run exit
    2)."""
    from autosearch.architecture import Architecture
    from autosearch.storage.artifacts import Artifacts

    root = tmp_path_factory.mktemp("bucket")
    arch = Architecture(space="x", genes={"a": 1})
    prefix, start = WORKS[kind]
    prefix = prefix.replace("ARCH", arch.arch_id)
    objects = {
        "/".join([head.replace("WORK", prefix), *parts]).lstrip("/"): b"data"
        for head, parts in keys
    }
    for attempt, folder, name in collisions:
        objects[f"{prefix}/{attempt}/{folder}"] = b"a file"
        objects[f"{prefix}/{attempt}/{folder}/{name}"] = b"under the file"
    if done:
        objects[f"{prefix}/0/train.pt"] = b"state"
    cache = root / "cache"
    outside = root / "outside"
    outside.mkdir()
    (cache / prefix).mkdir(parents=True)
    # A link planted in the cache, out to another folder: never followed out.
    (cache / prefix / "1").symlink_to(outside, target_is_directory=True)
    artifacts = Artifacts(cache, _Bucket(objects))  # type: ignore[arg-type]
    work = start(artifacts, arch)
    written = [p for p in root.rglob("*") if p.is_file()]
    assert all(p.resolve().is_relative_to(work.resolve()) for p in written), written
    assert list(outside.iterdir()) == []
    if done and not any(c[0] > "0" and c[1] == "train.pt" for c in collisions):
        assert (work / "train.pt").is_file()


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(relative=st.text(alphabet="ab./\\\x00~L", max_size=12) | st.sampled_from(NAMES))
def test_a_path_from_outside_is_confined_to_its_folder(relative, tmp_path_factory):
    from autosearch.storage._paths import inside

    root = tmp_path_factory.mktemp("confined")
    base = root / "base"
    (base / "a").mkdir(parents=True)
    (root / "elsewhere").mkdir()
    (base / "L").symlink_to(root / "elsewhere", target_is_directory=True)
    found = inside(base, relative)
    if found is not None:
        assert found.resolve().is_relative_to(base.resolve()) and found.resolve() != base
        assert ".." not in found.relative_to(base).parts


# The faults, one test each --------------------------------------------------------------
STORED_FIELDS = {
    "an unknown objective": (("objectives",), ["nonsense", "flops"], "unknown objective"),
    "an objective that is no name": (("objectives",), [1], "objective 1 is not a metric"),
    "no objectives": (("objectives",), [], "is not a list of metric names"),
    "a device that does not exist": (("train", "device"), "tpu", "TrainConfig device='tpu'"),
    "a table path that is no path": (("table",), {"path": 5}, "Table path=5"),
    "a table of huge images": (
        ("table",),
        {"path": "t.csv", "input_shape": [3, 10**6, 10**6]},
        "Table input_shape",
    ),
    "a huge width": (("space", "config", "widths"), [8, 10**9], "widths: 1000000000"),
    "a million stages": (("space", "config", "max_stages"), 10**6, "max_stages: 1000000"),
    "a supernet told 'no' to distill": (("supernet",), {"distill": "no"}, "distill='no'"),
    "a supernet told 'x' to measure latency": (("supernet",), {"latency": "x"}, "latency='x'"),
    # Issue 43, U4: a stored warm-up of `true` trained with a one-epoch warm-up.
    "a warm-up that is true": (("train", "warmup_epochs"), True, "warmup_epochs=True"),
    "a fine-tuning that is text": (
        ("compression", "finetune_epochs"),
        "2",
        "Compression finetune_epochs='2'",
    ),
    "a seed that is true": (("seed",), True, "seed True is not an integer"),
}


@pytest.mark.parametrize("case", list(STORED_FIELDS))
def test_a_stored_field_out_of_shape_is_refused_in_one_line(case, stored, tmp_path, capsys):
    """The reported cases: stored objectives, train.device and table were not checked
    on read (status and report ended in a KeyError, a worker stored the trial as failed
    by the architecture's fault), sizes reached an allocation, truthy strings passed
    for booleans. Every command now refuses the study in one line, and nothing runs."""
    study, url = stored["study"], stored["url"]
    path, value, message = STORED_FIELDS[case]
    definition = _set(copy.deepcopy(stored["definition"]), path, value)
    study._storage.set_study_user_attr(study._study_id, "autosearch", definition)
    trials = len(study.trials.all())
    try:
        for argv in (
            ["status", "--study", "kept", "--storage", url],
            ["report", "--study", "kept", "--storage", url, "--out", str(tmp_path / "r.html")],
            ["worker", "--study", "kept", "--storage", url, "--n-trials", "1"],
        ):
            code, output = _cli(argv, capsys)
            assert code == 2 and "Traceback" not in output, output[-2000:]
            assert message in output and len(output.strip().splitlines()) == 1, output
    finally:
        study._storage.set_study_user_attr(study._study_id, "autosearch", stored["definition"])
    assert len(study.trials.all()) == trials  # no trial stored as failed


def test_a_table_that_cannot_be_read_stops_the_worker_not_the_trials(tmp_path, capsys):
    from autosearch import Table
    from autosearch.evaluation import tabular
    from search_spaces import NB201Space

    space = NB201Space()
    rows = tmp_path / "t.csv"
    arch = space.to_string(space.sample(__import__("numpy").random.default_rng(0)))
    rows.write_text(f"arch,val_accuracy\n{arch},50.0\n")
    study = autosearch.create_study(
        "tab",
        controller=RandomSearch(space, seed=0),
        storage=f"sqlite:///{tmp_path}/t.db",
        table=Table(path=str(rows)),
    )
    rows.unlink()
    tabular._load.cache_clear()  # as in a worker of its own: the table not read yet
    argv = ["worker", "--study", "tab", "--storage", study.storage_url, "--n-trials", "2"]
    code, output = _cli(argv, capsys)
    assert code == 2 and "does not exist" in output and "Traceback" not in output
    assert study.trials.all() == []  # not two trials failed "by the architecture"


def test_a_trial_whose_result_lacks_a_metric_is_named_and_left_out(make_study, tmp_path, capsys):
    """The reported case: a stored result of {"points": []} made status and report fail
    with a KeyError."""
    from optuna.trial import TrialState, create_trial

    study = make_study("kept")
    study.optimize(1)
    url = study.storage_url
    kept = study.trials.all()[0]
    for result in ({"points": []}, {"points": [{"variant": "base", "metrics": {}}]}):
        study._storage.create_new_trial(
            study._study_id,
            template_trial=create_trial(
                state=TrialState.COMPLETE,
                values=kept.values,
                params=kept.params,
                distributions=kept.distributions,
                user_attrs={**kept.user_attrs, "result": result},
            ),
        )
    for argv in (
        ["status", "--study", "kept", "--storage", url],
        ["report", "--study", "kept", "--storage", url, "--out", str(tmp_path / "r.html")],
        ["export", "--study", "kept", "--storage", url, "--out", str(tmp_path / "x")],
    ):
        code, output = _cli(argv, capsys)
        assert code == 0 and "Traceback" not in output, output[-2000:]
    status = _cli(["status", "--study", "kept", "--storage", url], capsys)[1]
    assert "trial 1: its stored base point has no accuracy, flops" in status
    assert "trial 2: its stored base point has no accuracy, flops" in status
    assert len(autosearch.load_study("kept", storage=url).optimize(1)) == 1  # the study goes on


def test_plot_labels_show_stored_names_as_text(stored):
    """The reported cases: a quoted study name showed as &quot;, and gene names in the
    importance plot were read as markup (a payload became a link)."""
    from autosearch.report import plots

    study = stored["study"]
    named = copy.copy(study)
    named.name = 'my "best" <a href="x">study</a>'
    title = plots.pareto(named).layout.title.text
    assert '"best"' in title and "&quot;" not in title and "<a href" not in title
    figure = plots.importance(study)
    assert all("<" not in label for label in figure.data[0].y)
    from autosearch.report.plots import _text

    assert _text('<a href="javascript:x">gene</a>') == '&lt;a href="javascript:x"&gt;gene&lt;/a&gt;'


def _edit(study, change) -> None:
    stored = study._storage.get_study_user_attrs(study._study_id)["autosearch"]
    change(stored)
    study._storage.set_study_user_attr(study._study_id, "autosearch", stored)


def test_a_stored_nni_factory_naming_any_callable_is_refused_in_one_line(
    make_study, tmp_path, monkeypatch, capsys
):
    """The reported case: a space {"name": "nni", "config": {"factory": "os:system",
    "kwargs": {"command": ...}}} ran the command on status, report, export, worker and
    load_study(read_only=True)."""
    pytest.importorskip("nni", reason="the NNI adapter is an extra ('autosearch-nas[nni]')")
    from search_spaces import from_nni

    study = make_study(
        "evil", controller=RandomSearch(from_nni("search_spaces.nni_examples:SmallCNN"), seed=0)
    )
    _edit(
        study,
        lambda d: d["space"].update(
            config={"factory": "os:system", "kwargs": {"command": "id > PWNED; echo RAN"}}
        ),
    )
    monkeypatch.chdir(tmp_path)
    for argv in (
        ["status", "--study", "evil", "--storage", study.storage_url],
        ["report", "--study", "evil", "--storage", study.storage_url, "--out", "r.html"],
        ["export", "--study", "evil", "--storage", study.storage_url, "--out", "x"],
        ["worker", "--study", "evil", "--storage", study.storage_url, "--n-trials", "1"],
    ):
        code, output = _cli(argv, capsys)
        assert code == 2 and "RAN" not in output and "Traceback" not in output
        assert "'os:system' is not registered" in output and "register_nni_space" in output
    with pytest.raises(AutosearchError, match="not registered"):
        autosearch.load_study("evil", storage=study.storage_url, read_only=True)
    assert not (tmp_path / "PWNED").exists()


def test_registered_components_are_what_a_stored_study_may_name(make_study, tiny_space):
    import optuna

    from controllers import OptunaController, register_sampler

    register_sampler("qmc-test", optuna.samplers.QMCSampler)
    study = make_study("r", controller=OptunaController(tiny_space, sampler="qmc-test", seed=0))
    assert study.controller.ask().space == tiny_space.name
    again = autosearch.load_study("r", storage=study.storage_url, read_only=True)
    assert again.controller.sampler == "qmc-test"
    # Optuna's own samplers, also by the paths earlier studies stored.
    for name in ("qmc", "cmaes", "optuna.samplers.QMCSampler", "optuna.samplers.RandomSampler"):
        assert OptunaController(tiny_space, sampler=name, seed=0).ask().space == tiny_space.name
    with pytest.raises(AutosearchError, match="takes no option 'nonsense'"):
        OptunaController(tiny_space, sampler="tpe", options={"nonsense": 1})
    with pytest.raises(AutosearchError, match=r"unknown Optuna sampler 'optuna\.samplers\.Base"):
        OptunaController(tiny_space, sampler="optuna.samplers.BaseSampler")


def test_an_nni_space_of_ones_own_is_registered_once_and_reopens(make_study):
    pytest.importorskip("nni", reason="the NNI adapter is an extra ('autosearch-nas[nni]')")
    from search_spaces import from_nni, nni_examples, register_nni_space

    name = register_nni_space(nni_examples.SmallCNN, name="my-small-cnn")
    assert name == "my-small-cnn"
    study = make_study("own", controller=RandomSearch(from_nni("my-small-cnn"), seed=0))
    again = autosearch.load_study("own", storage=study.storage_url, read_only=True)
    assert again.space.factory == "my-small-cnn"
    with pytest.raises(AutosearchError, match="already registered"):
        register_nni_space(print, name="my-small-cnn")
    with pytest.raises(AutosearchError, match="takes no argument 'command'"):
        from_nni("my-small-cnn", command=PAYLOAD).domains()


def test_damaged_weights_in_the_folder_are_named_in_one_line(make_study, tmp_path, capsys):
    import os

    from autosearch.study import records

    study = make_study("w")
    study.optimize(1)
    artifact = records.weights_id(study.trials.get(0))
    (study._artifacts.folder / artifact).write_bytes(os.urandom(4096))
    code, output = _cli(
        [
            "export",
            "--study",
            "w",
            "--storage",
            study.storage_url,
            "--trial",
            "0",
            "--out",
            str(tmp_path / "x"),
        ],
        capsys,
    )
    assert code == 2 and "Traceback" not in output and len(output.strip().splitlines()) == 1
    assert str(study._artifacts.folder / artifact) in output and "damaged" in output


def test_a_teacher_with_damaged_weights_is_a_platform_failure(make_study):
    """Distillation asks for the study's best model: damaged weights there stop the
    worker with a PlatformError (the trial stays resumable), not the candidate."""
    import os

    from autosearch.errors import PlatformError
    from autosearch.study import records

    study = make_study("d")
    study.optimize(1)
    artifact = records.weights_id(study.trials.get(0))
    (study._artifacts.folder / artifact).write_bytes(os.urandom(4096))
    with pytest.raises(PlatformError, match=f"{artifact}.*damaged|damaged.*{artifact}"):
        study._rebuilder.teacher({"accuracy": -1.0})


def test_training_with_other_settings_starts_afresh_and_says_so(
    make_study, tmp_path, capsys, caplog
):
    study = make_study()
    study.optimize(1)
    out = study.export(study.best(), tmp_path / "ex")
    base = ["train", str(out), "--epochs", "2", "--json"]
    assert main([*base, "--lr", "0.05"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main([*base, "--lr", "0.9", "--batch-size", "16"]) == 0
    captured = capsys.readouterr()
    second = json.loads(captured.out)
    assert second["train_config"]["lr"] == 0.9 and second["train_config"]["batch_size"] == 16
    losses = [[e["train_loss"] for e in run["history"]] for run in (first, second)]
    assert losses[0] != losses[1]
    assert "other settings (" in caplog.text and "lr 0.05 -> 0.9" in caplog.text
    # The same settings again resume the finished run: the same result.
    assert main([*base, "--lr", "0.9", "--batch-size", "16"]) == 0
    third = json.loads(capsys.readouterr().out)
    assert third["history"] == second["history"]


# A read-only study folder --------------------------------------------------------------
@pytest.fixture
def read_only():
    """Makes a folder read-only for everyone, root included (a read-only bind mount, as
    a read-only share or container volume is), and undoes it afterwards."""
    import subprocess

    mounted: list[Path] = []

    def make(folder: Path) -> None:
        done = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"read-only bind mounts need root (mount said: {done.stderr.strip()!r})")
        mounted.append(folder)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)

    yield make
    for folder in mounted:  # lazily: this process may still hold the study's file open
        subprocess.run(["umount", "--lazy", str(folder)], check=True)


def _command(*argv: str, cwd: Path) -> SimpleNamespace:
    """``autosearch ARGV`` run in folder ``cwd``, in this process (a new process each
    time cost seconds of imports): its exit status and what it printed."""
    import contextlib
    import io
    import os

    out, err, here = io.StringIO(), io.StringIO(), Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        os.chdir(here)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def _closed(study) -> None:
    """Close the study's connections, as a process that ended would."""
    study._storage._backend.engine.dispose()


def test_a_study_in_a_read_only_folder_is_read(make_study, tmp_path, read_only):
    (tmp_path / "ro").mkdir()
    study = make_study("ro", storage=f"sqlite:///{tmp_path}/ro/study.db")
    study.optimize(1)
    _closed(study)
    folder = Path(study.storage_url[len("sqlite:///") :]).parent
    read_only(folder)
    shown = _command("status", "--study", "ro", "--storage", study.storage_url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "1 complete" in shown.stdout and "damaged" not in shown.stderr
    exported = _command(
        "export",
        "--study",
        "ro",
        "--storage",
        study.storage_url,
        "--out",
        str(tmp_path / "x"),
        cwd=tmp_path,
    )
    assert exported.returncode == 0, exported.stderr


def test_a_read_only_study_with_unmerged_commits_is_named_not_called_damaged(tmp_path, read_only):
    """A write-ahead log holding commits that a crash left unmerged, in a folder SQLite
    cannot write its shared-memory file to: refused in one line that says so (an
    immutable read would silently miss those commits)."""
    import subprocess

    folder = tmp_path / "s"
    folder.mkdir()
    script = (
        "import os, autosearch\n"
        "from controllers import RandomSearch\n"
        "from search_spaces import NB201Space\n"
        f"autosearch.create_study('w', controller=RandomSearch(NB201Space(), seed=0), "
        f"storage='sqlite:///{folder}/s.db', data='digits')\n"
        "import sqlite3\n"
        f"db = sqlite3.connect('{folder}/s.db')\n"
        "db.execute('PRAGMA wal_autocheckpoint=0')\n"
        "db.execute(\"UPDATE studies SET study_name='w' WHERE study_name='w'\")\n"
        "db.commit()\n"
        "os._exit(0)  # as a crash: the log is never merged\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=1800, capture_output=True)
    wal = folder / "s.db-wal"
    assert wal.stat().st_size > 0
    (folder / "s.db-shm").unlink()
    read_only(folder)
    shown = _command(
        "status", "--study", "w", "--storage", f"sqlite:///{folder}/s.db", cwd=tmp_path
    )
    err = shown.stderr.strip()
    assert shown.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "write-ahead log" in err and "damaged" not in err


def test_an_unreadable_study_is_named_a_permission_problem(make_study, tmp_path, capsys):
    """As a user who may not read the study file. Run as root (which reads everything),
    the command runs in a forked child that has become 'nobody' and imported what it
    needs already: so the test needs nothing of the checkout to be readable by others
    (a clone in a private 0700 folder failed when the CLI was started as 'nobody')."""
    import pwd

    study = make_study("p")
    _closed(study)
    path = Path(study.storage_url[len("sqlite:///") :])
    argv = ["status", "--study", "p", "--storage", study.storage_url]
    assert main(argv) == 0  # everything the command imports is imported now
    capsys.readouterr()
    if os.geteuid() != 0:
        path.chmod(0o000)  # this user may not read it: in-process is enough
        try:
            code, output = _cli(argv, capsys)
        finally:
            path.chmod(0o600)
    else:
        try:
            nobody = pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("needs a 'nobody' user to read as another user")
        path.chmod(0o600)
        path.parent.chmod(0o755)
        code, output = _as_user(nobody, lambda: main(argv))
    assert code == 2 and "Traceback" not in output, output
    assert "permission denied" in output and "damaged" not in output


def _as_user(user: Any, run: Any) -> tuple[int, str]:
    """``run()`` in a forked child with ``user``'s ids (real and effective): its exit
    status and what it wrote."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            os.dup2(write, 1)
            os.dup2(write, 2)
            # pytest's capture replaced sys.stdout and sys.stderr: write to the pipe.
            sys.stdout = sys.stderr = open(write, "w", buffering=1, closefd=False)
            os.setgroups([])
            os.setresgid(user.pw_gid, user.pw_gid, user.pw_gid)
            os.setresuid(user.pw_uid, user.pw_uid, user.pw_uid)
            code = int(run())
        except BaseException as exc:
            os.write(2, f"Traceback: {type(exc).__name__}: {exc}\n".encode())
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode(errors="replace")


# Exports carry no data ------------------------------------------------------------------
@pytest.mark.slow
def test_no_exported_file_carries_the_validation_images(make_study, digits, tmp_path):
    from autosearch import Compression
    from search_spaces import ResNetSpace

    space = ResNetSpace(
        min_stages=2, max_stages=2, depths=(1,), widths=(32,), stem_widths=(32,), blocks=("basic",)
    )
    study = make_study(
        "data",
        controller=RandomSearch(space, seed=0),
        variants=("base", "int8", "prune-channels@0.5"),
        compression=Compression(finetune_epochs=1),
        train=TrainConfig(epochs=1, batch_size=64, lr=0.05),
    )
    study.optimize(1)
    images = digits.normalize(digits.val.take(torch_arange(64)))
    fingerprints = [image.numpy().tobytes() for image in images] + [
        image.numpy().tobytes() for image in digits.val.take(torch_arange(64))
    ]
    for variant in ("base", "int8", "prune-channels@0.5"):
        out = study.export(study.record(0, variant), tmp_path / variant)
        for file in out.iterdir():
            content = file.read_bytes()
            if file.suffix == ".pt2":  # a zip archive: look inside every member too
                import zipfile

                with zipfile.ZipFile(file) as archive:
                    content += b"".join(archive.read(n) for n in archive.namelist())
            leaked = sum(f in content for f in fingerprints)
            assert leaked == 0, f"{variant}: {file.name} holds {leaked} validation images"
    float_size = (tmp_path / "int8" / "model.safetensors").stat().st_size
    int8_size = (tmp_path / "int8" / "model_int8.pt2").stat().st_size
    assert int8_size < float_size, (int8_size, float_size)


def torch_arange(n: int):
    import torch

    return torch.arange(n)


# Where weights go -----------------------------------------------------------------------
@pytest.mark.service
def test_every_process_keeps_weights_where_the_study_says(postgres_url, tiny_space, tmp_path):
    """A server storage: the study stores an absolute artifacts folder; a worker started
    in another folder writes there, export reads there, and a process on a machine
    without that folder says so before training."""
    from controllers import RandomSearch

    creator, elsewhere = tmp_path / "creator", tmp_path / "elsewhere"
    creator.mkdir()
    elsewhere.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(creator)
        autosearch.create_study(
            "pg",
            controller=RandomSearch(tiny_space, seed=0),
            storage=postgres_url,
            train=TrainConfig(epochs=1, batch_size=128, lr=0.1),
        )
    stored = creator / "runs" / "pg" / "artifacts"
    assert stored.is_dir()
    worked = _command(
        "worker", "--study", "pg", "--storage", postgres_url, "--n-trials", "1", cwd=elsewhere
    )
    assert worked.returncode == 0, worked.stderr
    assert len([p for p in stored.iterdir() if p.is_file()]) == 1  # the trial's weights
    assert not (elsewhere / "runs").exists()
    exported = _command(
        "export",
        "--study",
        "pg",
        "--storage",
        postgres_url,
        "--out",
        str(tmp_path / "x"),
        cwd=elsewhere,
    )
    assert exported.returncode == 0, exported.stderr
    stored.rename(tmp_path / "moved")  # a machine without the folder
    refused = _command(
        "worker", "--study", "pg", "--storage", postgres_url, "--n-trials", "1", cwd=elsewhere
    )
    err = refused.stderr.strip()
    assert refused.returncode == 2 and "Traceback" not in err
    assert f"keeps its weights in {stored}, which this machine does not have" in err
    again = autosearch.load_study("pg", storage=postgres_url, read_only=True)
    assert again.trials.count("complete", "failed", "running") == 1  # nothing was started
    assert not stored.exists()  # and nothing made it again


def test_training_into_a_read_only_export_is_refused_before_training(
    make_study, tmp_path, read_only, capsys
):
    study = make_study("t")
    study.optimize(1)
    out = study.export(study.best(), tmp_path / "ex" / "best")
    assert main(["train", str(out), "--epochs", "1", "--json"]) == 0  # full/ exists now
    capsys.readouterr()
    read_only(tmp_path / "ex")
    code, output = _cli(["train", str(out), "--epochs", "2"], capsys)
    assert code == 2 and "Traceback" not in output and len(output.strip().splitlines()) == 1
    assert "cannot write the trained weights into" in output and "Read-only" in output


def test_a_refused_open_leaves_the_study_file_closed(make_study, tmp_path):
    """A study refused on opening (another artifacts folder, a name not there) closes
    its connections at once: no write-ahead log or shared-memory file is left beside
    the database while the error is still held (as a caller or a traceback holds it)."""
    from autosearch.errors import StorageError, StudyError

    study = make_study("closed", storage=f"sqlite:///{tmp_path}/s/study.db")
    study._storage._backend.engine.dispose()
    beside = [tmp_path / "s" / f"study.db-{suffix}" for suffix in ("wal", "shm")]
    assert not any(p.exists() for p in beside)
    with pytest.raises(StudyError, match="keeps its weights in") as refused:
        autosearch.create_study(
            "closed",
            controller=RandomSearch(study.space, seed=0),
            storage=study.storage_url,
            train=study.definition.train,
            artifacts=str(tmp_path / "elsewhere"),
            load_if_exists=True,
        )
    assert not any(p.exists() for p in beside), refused
    with pytest.raises(StorageError, match="no study named") as missing:
        autosearch.load_study("nope", storage=study.storage_url)
    assert not any(p.exists() for p in beside), missing
