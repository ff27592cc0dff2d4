"""Imports go down the layers of DESIGN.md only."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Rank of each autosearch module: a module may import only modules of lower rank.
RANKS = {
    "errors": 0,
    "_version": 0,
    "_torch_build": 0,
    "_logs": 0,  # stdlib only: the set-up runs it before anything is installed
    "_paths": 0,  # paths from outside names, confined to their folder (stdlib only)
    "_files": 0,  # files written whole (a temporary name, then renamed)
    "cost": 0,  # counting FLOPs needs only torch; spaces use it for budgets
    "pareto": 1,
    "architecture": 1,
    "_provenance": 1,
    "metrics": 2,  # the metric vocabulary: names, units, directions, titles, formats
    "space": 2,
    "controller": 3,
    "distributions": 3,  # gene domains as Optuna distributions (study and samplers)
    "registry": 4,
    # the shared training stack and measurement
    "data": 5,
    "scoring": 5,
    "_storage": 5,
    "_heartbeat": 5,  # trial heartbeats on any Optuna storage
    "tabular": 5,
    "early_stopping": 5,
    "runtime": 5,
    "_feed": 6,  # each epoch's batches, augmented on the device, each rank its share
    "train": 7,
    "compress": 8,  # derives variants with the trainer
    "supernet": 8,  # trains a supernet with the trainer, evaluates its subnets
    "runner": 9,  # a whole trial: train, variants, costs, rewards
    "export": 9,
    "retrain": 9,  # trains an export folder in full with the shared stack
    "study": 10,
    "plots": 11,
    "studyfile": 11,
    "report": 12,
    "cli": 13,
    "testing": 13,
}
CORE_FOR_PLUGINS = {
    "architecture",
    "space",
    "controller",
    "registry",
    "errors",
    "cost",
    "pareto",
    "distributions",
}
NO_OPTUNA = {
    "data",
    "cost",
    "train",
    "compress",
    "supernet",
    "runner",
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
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _module_of(path: Path, package: str) -> str:
    rel = path.relative_to(ROOT / package).with_suffix("")
    return rel.parts[0]


def _autosearch_deps(path: Path) -> set[str]:
    return {n.split(".")[1] for n in _imports(path) if n.startswith("autosearch.")} & set(RANKS)


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
    assert deps == {"study"} and RANKS["study"] > RANKS["train"]


# Inside the study package: the facade at the top, the definition and codec at the bottom.
STUDY_RANKS = {
    "_s3": 0,
    "executors": 0,
    "interrupts": 0,  # Ctrl-C and SIGTERM: stop after the epoch's checkpoint
    "jobs": 0,  # work done once per study (the supernet), claimed like a trial
    "supernet_state": 0,  # what a study stores of its supernet, checked on read
    "supernet_file": 0,  # a supernet's weights as a file of their own
    "definition": 1,
    "records": 1,
    "artifacts": 1,
    "supernet_job": 2,  # the supernet's training as a job of the study; its evaluator
    "results": 2,
    "claims": 2,
    "replay": 2,
    "loop": 3,
    "workers": 4,
    "rebuild": 4,
    "progress": 4,
    "study": 5,
}


def test_the_study_package_is_layered_too():
    folder = ROOT / "autosearch" / "study"
    assert {p.stem for p in folder.glob("*.py")} - {"__init__"} == set(STUDY_RANKS)
    bad = []
    for path in folder.glob("*.py"):
        if path.stem == "__init__":
            continue
        deps = {
            n.split(".")[2]
            for n in _imports(path, runtime=True)
            if n.startswith("autosearch.study.") and n.split(".")[2] in STUDY_RANKS
        }
        for dep in deps - {path.stem}:
            if STUDY_RANKS[dep] >= STUDY_RANKS[path.stem]:
                bad.append(f"study/{path.stem} imports study/{dep}")
    assert not bad, "\n".join(bad)
