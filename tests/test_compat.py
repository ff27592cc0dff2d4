"""Other projects' private internals are reached in one place, autosearch/_compat.py,
and each one it names is still there in the installed versions (the upper bounds in
pyproject.toml keep an installation within the versions it was checked against)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("autosearch", "search_spaces", "controllers")


def _private_imports(path: Path) -> list[str]:
    """Modules of other projects with a private part (``torch._inductor``,
    ``optuna.storages._rdb``) that ``path`` imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        for name in names:
            top, *rest = name.split(".")
            if top not in OURS and any(part.startswith("_") for part in rest):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_private_imports_of_other_projects_sit_in_compat_only():
    sources = [p for package in OURS for p in (ROOT / package).rglob("*.py")]
    elsewhere = [i for p in sources if p.name != "_compat.py" for i in _private_imports(p)]
    assert not elsewhere, elsewhere


@pytest.mark.parametrize(
    "module",
    [
        "optuna.storages._rdb.models",
        "optuna.storages._rdb.storage",
        "optuna._hypervolume",
        "torch.utils._python_dispatch",
        "torch.utils._pytree",
        "torch._export.utils",
        "torch._inductor.constant_folding",
        "torch._inductor.fx_passes.freezing_patterns",
        "torch.onnx._internal.exporter._registration",
    ],
)
def test_each_internal_compat_names_is_there(module):
    assert importlib.util.find_spec(module) is not None, module


def test_the_internals_compat_names_work():
    import numpy as np
    import optuna.artifacts._upload as upload

    from autosearch import _compat

    assert _compat.ARTIFACT_ATTR_PREFIX == upload.ARTIFACTS_ATTR_PREFIX
    assert _compat.exact_hypervolume(np.array([[1.0, 1.0]]), np.array([2.0, 2.0])) == 1.0
    is_cia_op, constant_fold, freezing_passes = _compat.export_lowering()
    assert callable(is_cia_op) and callable(constant_fold) and callable(freezing_passes)
    assert _compat.rdb_models().TrialModel.__tablename__ == "trials"
