"""Imports go down the layers of DESIGN.md only."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Rank of each autosearch module: a module may import only modules of lower rank.
# A package per concept; inside the packages whose parts sit at different heights (the
# training stack, scoring, evaluation, the export, the report), each part has a rank of its
# own ("scoring.cost"); a package's __init__ is ranked by its package's name.
RANKS = {
    "errors": 0,
    "_version": 0,
    "_torch_build": 0,
    "_logs": 0,  # stdlib only: the set-up runs it before anything is installed
    "_files": 0,  # files written whole; files from outside read bounded, regular files only
    "_checks": 1,  # the checks of a config's fields (what each expects, in one line)
    "_script": 0,  # whether the main script would run again in a spawned process (stdlib)
    "_moved": 0,  # 0.1.0's module paths, importable for one release (stdlib only)
    "scoring.cost": 1,  # counting FLOPs needs only torch; spaces use it for budgets
    "scoring.pareto": 1,
    "architecture": 1,
    "scoring.metrics": 2,  # the metric vocabulary: names, units, directions, bounds
    "space": 2,
    "controller": 3,
    "distributions": 3,  # gene domains as Optuna distributions (study and samplers)
    "registry": 4,
    # the shared training stack and measurement
    "data": 5,
    "scoring": 5,  # the objectives, the reward and fronts (the package's own module)
    "evaluation.tabular": 5,
    "evaluation.proxies": 6,  # zero-cost proxies of a candidate at initialization
    "evaluation.ranker": 1,  # a model fitted on trained candidates (scikit-learn)
    "training.early_stopping": 5,
    "training.runtime": 5,
    "training.placement": 5,  # how many trials share a GPU: a trial's size against free memory
    "scoring.latency": 6,  # latency predicted from a lookup table of measured layers
    "training._batch": 6,  # auto_batch_size: the largest batch that fits, within a rule
    "training._optim": 5,  # the optimizers and learning-rate schedules a TrainConfig names
    "training._feed": 6,  # each epoch's batches, augmented on the device, each rank its share
    "training._step": 6,  # one training step, eager or replayed from a CUDA graph; NaN watch
    "training._checkpoint": 1,  # a training run's state after each epoch, resumed by the run
    "training.precise_bn": 6,  # batch-norm statistics recomputed for the weights as they are
    "training._shard_reader": 2,  # a sharded checkpoint's folder read as data (DCP's types)
    "training.sharding": 5,  # FSDP / HSDP: a model sharded over ranks, its checkpoints (DCP)
    "training.train": 7,
    "training": 7,  # the package: its docstring only
    "compress": 8,  # derives variants with the trainer
    "evaluation.supernet": 8,  # trains a supernet with the trainer, evaluates its subnets
    "evaluation.trial": 9,  # a trial's plan and result: what the study and the runner exchange
    "evaluation.runner": 10,  # a whole trial: train, variants, costs, rewards
    "evaluation": 10,  # the package: its docstring only
    "export": 10,  # an export folder (the package's own module)
    "export.retrain": 10,  # trains an export folder in full with the shared stack
    "export._onnx_registry": 1,  # torch only: the ONNX exporter's registry, built once
    "study": 11,
    "report.population": 11,  # a population's accuracy and adapted setting, drawn
    "report.plots": 12,
    "studyfile": 12,
    "report": 13,  # the HTML report (the package's own module)
    "cli": 14,
    "testing": 14,
}
# Packages whose parts are ranked one by one (the others are ranked as a whole).
SPLIT = ("training", "scoring", "evaluation", "export", "report")
CORE_FOR_PLUGINS = {
    "architecture",
    "space",
    "controller",
    "registry",
    "errors",
    "scoring.cost",
    "scoring.pareto",
    "distributions",
}
NO_OPTUNA = {
    "data",
    "scoring.cost",
    "scoring.latency",
    "training.train",
    "compress",
    "evaluation.supernet",
    "evaluation.runner",
    "architecture",
    "space",
    "controller",
}


def _imports(path: Path, *, runtime: bool = False) -> set[str]:
    """Dotted names a file imports anywhere (lazy imports inside functions count);
    ``runtime``: not those only for type checkers (``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    if runtime:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                node.body = []
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = [f"{node.module}.{alias.name}" for alias in node.names]
            names.update(parts)
            if not all(_is_module(part) for part in parts):  # not only a package's modules
                names.add(node.module)
    return names


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of this repository."""
    where = ROOT.joinpath(*dotted.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _module_of(path: Path, package: str) -> str:
    rel = path.relative_to(ROOT / package).with_suffix("")
    if rel.parts[0] in SPLIT and len(rel.parts) > 1 and rel.parts[1] != "__init__":
        return f"{rel.parts[0]}.{rel.parts[1]}"
    return rel.parts[0]


def _ranked(dotted: str) -> str:
    """The ranked module an import of ``autosearch.<dotted>`` names."""
    parts = dotted.split(".")
    part = ".".join(parts[:2])
    return part if parts[0] in SPLIT and part in RANKS else parts[0]


def _autosearch_deps(path: Path) -> set[str]:
    found = {_ranked(n.split(".", 1)[1]) for n in _imports(path) if n.startswith("autosearch.")}
    return found & set(RANKS)


def test_every_module_has_a_rank():
    modules = {_module_of(p, "autosearch") for p in (ROOT / "autosearch").rglob("*.py")}
    assert modules - {"__init__"} <= set(RANKS), "add new modules to RANKS (and DESIGN.md)"


def test_autosearch_imports_go_down_only():
    bad = []
    for path in (ROOT / "autosearch").rglob("*.py"):
        module = _module_of(path, "autosearch")
        if module == "__init__":
            continue
        for dep in _autosearch_deps(path) - {module}:
            if RANKS[dep] >= RANKS[module]:
                bad.append(f"{module} (rank {RANKS[module]}) imports {dep} (rank {RANKS[dep]})")
        plugins = {n for n in _imports(path) if n.split(".")[0] in ("search_spaces", "controllers")}
        if plugins:
            bad.append(f"{module} imports plugins {plugins}: resolve them through the registry")
        if module in NO_OPTUNA and any(n.split(".")[0] == "optuna" for n in _imports(path)):
            bad.append(f"{module} imports optuna: the training stack must not")
    assert not bad, "\n".join(bad)


def test_plugins_import_only_the_core_protocols():
    bad = []
    for package in ("search_spaces", "controllers"):
        for path in (ROOT / package).rglob("*.py"):
            for dep in _autosearch_deps(path) - CORE_FOR_PLUGINS:
                bad.append(f"{path.relative_to(ROOT)} imports autosearch.{dep}")
            other = "controllers" if package == "search_spaces" else "search_spaces"
            if any(n.split(".")[0] == other for n in _imports(path)):
                bad.append(f"{path.relative_to(ROOT)} imports {other}")
    assert not bad, "\n".join(bad)


def test_the_checker_catches_a_violation(tmp_path):
    bad = tmp_path / "train.py"
    bad.write_text("from autosearch.study import Study\nimport optuna\n")
    deps = _autosearch_deps(bad)
    assert deps == {"study"} and RANKS["study"] > RANKS["training.train"]
    assert _ranked("scoring.cost.measure") == "scoring.cost" and _ranked("study.jobs") == "study"


TOP_LEVEL_MOST = 15


def test_the_top_level_holds_few_modules_and_a_package_per_concept():
    """The design card in the tree: the contracts every part uses at the top, a package
    per concept (issue 44)."""
    top = sorted(p.stem for p in (ROOT / "autosearch").glob("*.py") if p.stem != "__init__")
    assert len(top) <= TOP_LEVEL_MOST, top
    for concept in ("training", "scoring", "evaluation", "export", "report", "study", "data"):
        assert (ROOT / "autosearch" / concept / "__init__.py").is_file(), concept


# Inside the study package: the facade at the top, the definition and codec at the bottom.
STUDY_RANKS = {
    "workers._failpoints": -3,  # places a chaos test makes a worker die on purpose (stdlib only)
    "workers._collection": -3,  # the collector in autosearch's own processes (stdlib only)
    "storage._paths": -2,  # paths from outside names, confined to their folder (stdlib only)
    "storage._rdb": -2,  # Optuna's RDB storage, a trial created and ended in few statements
    "storage._journal": -2,  # a journal file that only grows, checked at every read and write
    "storage._urls": -1,  # storage URLs to Optuna storages, with errors that say what works
    "workers._heartbeat": -2,  # trial heartbeats on any storage, timed on the watcher's clock
    "_provenance": -1,  # what ran a trial (versions, machine), compared by rerun
    "workers._ray_connect": -1,  # a Ray head checked before ray.init (answers; its token)
    "workers._mps": -1,  # a CUDA MPS daemon for workers that share a GPU (stdlib only)
    "storage._s3": 0,
    "workers.executors": 0,
    "workers.interrupts": 0,  # Ctrl-C and SIGTERM: stop after the epoch's checkpoint
    "tracking.spec": -1,  # what a study stores of its live tracking (MLflow URI, TensorBoard)
    "tracking._sender": -1,  # calls to a tracker in a thread of their own (stdlib only)
    "tracking.mlflow_runs": 0,  # a study's runs in MLflow, found again by their tags
    "tracking.tensorboard_logs": 0,  # a study's event files for TensorBoard
    "tracking.mlflow_model": 1,  # an export folder logged as an MLflow model, in its trial's run
    "tracking.tracker": 3,  # what one process shows of the trials it runs, live
    "jobs": 0,  # work done once per study (the supernet), claimed like a trial
    "population.ledger": 0,  # a population's record in its folder, under a lock
    "population.rules": 0,  # PopulationBasedTraining: its settings and explore rule
    "population.run": 1,  # a population trained round by round, by any number of workers
    "population.full": 2,  # an export trained as a population, or by a schedule replayed
    "supernet.state": 0,  # what a study stores of its supernet, checked on read
    "supernet.file": 0,  # a supernet's weights as a file of their own
    "supernet.progress": 1,  # the supernet's training shown: an epoch bar, or a log line
    "definition": 0,  # the typed, frozen definition (JSON once each way)
    "records": 1,  # the codec: a trial written and read back as records
    "storage.artifacts": 1,  # weights and per-attempt work folders (a folder, or S3)
    "storage.stored": 1,  # the definition in storage: created once, read back, continued
    "storage.sweep": 2,  # what no trial needs (orphan weights, finished work), swept
    "dataset": 1,  # the study's data, loaded when first needed
    "overlays": 2,  # measured figures laid over a trial's estimates; the latency model
    "trials": 3,  # the stored trials, read as records
    "plans": 2,  # how the study evaluates an architecture
    "claims": 2,
    "replay": 2,
    "results": 2,
    "supernet.job": 2,  # the supernet's training as a job of the study; its evaluator
    "loop": 4,
    "rebuild": 4,
    "measure": 5,  # the front's estimated points measured for real
    "population.study": 5,  # an architecture trained as a population, as a trial of the study
    "supernet.confirm": 5,  # the supernet's front confirmed by training, as trials of the study
    "workers.pool": 5,
    "progress": 5,
    "_typed": 5,  # the definition's properties, typed, as the facade shows them
    "study": 6,  # the facade: composes the parts
    "opening": 7,  # create_study / load_study: give the facade
}
FACADE = "study"


def _study_part(name: str) -> str | None:
    """The part of the study package a module name is (``workers.pool``), or None."""
    part = name.removeprefix("autosearch.study.")
    while part and part != name:
        if part in STUDY_RANKS:
            return part
        part = part.rpartition(".")[0]
    return None


def test_the_study_package_is_layered_too():
    folder = ROOT / "autosearch" / "study"
    parts = {
        ".".join(p.relative_to(folder).with_suffix("").parts): p
        for p in folder.rglob("*.py")
        if p.stem != "__init__"
    }
    assert set(parts) == set(STUDY_RANKS)
    bad = []
    for part, path in parts.items():
        deps = {_study_part(n) for n in _imports(path)} - {None, part}
        # type-checking imports too: a part is read alone
        for dep in deps:
            if STUDY_RANKS[dep] >= STUDY_RANKS[part]:
                bad.append(f"study/{part} imports study/{dep}")
    assert not bad, "\n".join(bad)


def test_the_study_package_groups_its_parts():
    """No package of autosearch past about fifteen flat parts: the study's are grouped
    (storage/, workers/, supernet/)."""
    for package in (ROOT / "autosearch").rglob("__init__.py"):
        flat = [p for p in package.parent.glob("*.py") if p.stem != "__init__"]
        assert len(flat) <= 18, f"{package.parent.relative_to(ROOT)}: {len(flat)} flat parts"


# The import graph of the three packages: no circles, no part that takes the facade.
PACKAGES = ("autosearch", "search_spaces", "controllers")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _arrows(modules: dict[str, Path]) -> set[tuple[str, str]]:
    """(importer, imported) for every import between the packages' modules, those only
    for type checkers included; ``from package import name`` points at the module
    ``package.name`` where there is one, else at the package."""
    arrows = set()
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    arrows.add((name, target))
    return arrows


def _circles(nodes: list[str], arrows: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    after: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in arrows:
        after[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in after[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in nodes:
        if node not in index:
            visit(node)
    return found


def test_no_import_circles_in_the_three_packages():
    modules = _modules()
    circles = _circles(sorted(modules), _arrows(modules))
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_no_part_of_the_study_imports_the_facade():
    modules = _modules()
    above = {f"autosearch.study.{m}" for m, r in STUDY_RANKS.items() if r > STUDY_RANKS[FACADE]}
    takers = sorted(
        a
        for a, b in _arrows(modules)
        if b == f"autosearch.study.{FACADE}"
        and a.startswith("autosearch.study.")
        and a not in above
    )
    assert not takers, f"parts that import the facade (take what they read instead): {takers}"


def test_the_circle_finder_finds_a_circle():
    assert _circles(["a", "b", "c"], {("a", "b"), ("b", "a"), ("b", "c")}) == [["a", "b"]]


# Files are cut by concept, not by a line count: one concept may run past 500 lines.
# Only the gross outliers are flagged, as a smell to look at.
MAX_FILE_LINES = 1000
MAX_FUNCTION_LINES = 100


def test_no_gross_outliers_among_files_and_functions():
    long_files, long_functions = [], []
    for name, path in _modules().items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                size = (node.end_lineno or node.lineno) - first + 1
                if size > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}.{node.name}: {size} lines")
    assert not long_files and not long_functions, "\n".join(long_files + long_functions)
