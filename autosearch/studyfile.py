"""Study files: Python files under ``studies/`` that declare one :class:`StudySpec`."""

from __future__ import annotations

import runpy
from pathlib import Path

from autosearch.errors import StudyFileError
from autosearch.study import StudySpec

__all__ = ["load_spec"]

_EXAMPLE = (
    "study = autosearch.StudySpec(name='my-study', "
    "controller=RandomSearch(ResNetSpace(), seed=0), n_trials=20)"
)


def load_spec(path: str | Path) -> StudySpec:
    """Run the study file at ``path`` and return the one StudySpec it defines."""
    path = Path(path)
    if not path.is_file():
        raise StudyFileError(f"study file {path} does not exist (ready studies are in studies/)")
    try:
        namespace = runpy.run_path(str(path))
    except Exception as exc:
        raise StudyFileError(
            f"study file {path} failed to run: {type(exc).__name__}: {exc}"
        ) from exc
    specs = {name: v for name, v in namespace.items() if isinstance(v, StudySpec)}
    if not specs:
        raise StudyFileError(f"study file {path} defines no study; add a line such as {_EXAMPLE}")
    if len(specs) > 1:
        raise StudyFileError(
            f"study file {path} defines {len(specs)} studies ({', '.join(sorted(specs))}); "
            "keep one per file"
        )
    return next(iter(specs.values()))
