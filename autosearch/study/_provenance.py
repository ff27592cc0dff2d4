"""What a trial's result depends on besides its architecture and seed: package
versions and the code version (for ``autosearch rerun``)."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

from autosearch._version import __version__

__all__ = ["provenance"]

_PACKAGES = ("torch", "numpy", "optuna", "torchao", "torch-pruning", "scikit-learn")


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _code_version() -> str:
    """The git commit of the source tree autosearch runs from (``+dirty`` when it has
    uncommitted changes), else the package version."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return __version__
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return __version__
    return commit.stdout.strip() + ("+dirty" if dirty else "")


@functools.lru_cache(maxsize=1)
def provenance() -> dict[str, Any]:
    """Versions of Python, autosearch (with its code version) and the packages results
    depend on."""
    return {
        "python": platform.python_version(),
        "autosearch": __version__,
        "code": _code_version(),
        "packages": {name: _installed(name) for name in _PACKAGES},
    }
