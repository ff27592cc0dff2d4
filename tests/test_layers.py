"""The layering of docs/design.md, as declared in pyproject.toml's import-linter contracts:
imports go down the layers only, plugins import only the core protocols, the training
stack never imports Optuna; and the shape of the tree: no import circles, a package per
concept, few top-level modules, no gross outliers among files and functions."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autosearch", "search_spaces", "controllers")
TOP_LEVEL_MOST = 15  # the shared contracts at autosearch's top; the rest in packages


def test_the_import_contracts_hold():
    """`lint-imports` (make lint runs it too) over the contracts in pyproject.toml."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert f"Contracts: {len(contracts['contracts'])} kept, 0 broken." in done.stdout


def test_every_module_of_autosearch_sits_in_a_layer():
    """A new module is placed in the layers (pyproject.toml) when it is added: only a
    package's __init__ (its docstring, its re-exports) may sit outside them."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in contracts["contracts"] if c["id"] == "layers"]
    placed = [m.strip() for layer in layers for m in layer.replace(":", "|").split("|")]
    modules = _modules()
    unplaced = [
        name
        for name, path in modules.items()
        if name.startswith("autosearch.")
        and path.name != "__init__.py"
        and not any(name == p or name.startswith(p + ".") for p in placed)
    ]
    assert not unplaced, f"place these in pyproject.toml's layers: {unplaced}"


def test_no_import_circles_in_the_three_packages():
    """No module imports itself through others (type-checking and lazy imports too)."""
    graph = grimp.build_graph(*PACKAGES)
    after = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert not _circles(after), _circles(after)


def _circles(after: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in after.get(node, []):
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

    for node in sorted(after):
        if node not in index:
            visit(node)
    return found


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": ["b"], "b": ["a", "c"], "c": []}) == [["a", "b"]]


def test_the_top_level_holds_few_modules_and_a_package_per_concept():
    top = sorted(p.stem for p in (ROOT / "autosearch").glob("*.py") if p.stem != "__init__")
    assert len(top) <= TOP_LEVEL_MOST, top
    for concept in (
        "data",
        "training",
        "scoring",
        "compress",
        "evaluation",
        "export",
        "report",
        "study",
        "storage",
        "workers",
        "tracking",
        "population",
        "weight_sharing",
    ):
        assert (ROOT / "autosearch" / concept / "__init__.py").is_file(), concept


def test_no_package_holds_more_than_eighteen_flat_parts():
    for package in (ROOT / "autosearch").rglob("__init__.py"):
        flat = [p for p in package.parent.glob("*.py") if p.stem != "__init__"]
        assert len(flat) <= 18, f"{package.parent.relative_to(ROOT)}: {len(flat)} flat parts"


# Files are cut by concept, not by a line count: one concept may run past 500 lines.
# Only the gross outliers are flagged, as a smell to look at.
MAX_FILE_LINES = 1000
MAX_FUNCTION_LINES = 100


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


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


@pytest.mark.parametrize("package", ["autosearch", "search_spaces", "controllers"])
def test_each_package_says_it_is_typed(package):
    assert (ROOT / package / "py.typed").is_file()


def test_no_benchmark_edits_the_import_path():
    """Nothing in benchmarks/ shadows a package (the controller benchmark is
    search_quality.py), so no script mends sys.path before its imports."""
    edits = [
        f"{path.name}:{number}"
        for path in sorted((ROOT / "benchmarks").glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "sys.path" in line
    ]
    assert not edits, edits
    assert not (ROOT / "benchmarks" / "controllers.py").exists()
