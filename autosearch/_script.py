"""Whether the main script would run its work again in a spawned process.

A process started by ``spawn`` or a fork server imports the parent's main script (as
``__mp_main__``) to find what it defined; code at the script's top level, outside
``if __name__ == "__main__":``, then runs again in the child: a study or a training
started twice. Found from the line of the script that led to the current call.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path
from types import FrameType

__all__ = ["unguarded_line"]


def unguarded_line() -> tuple[str, int] | None:
    """``(script name, line)`` where the main script's unguarded top level led to this
    call; None when it is guarded, or when there is no script to run again (a notebook,
    ``python -c``, a module run with ``-m`` from a guarded entry point, code another
    main module ran as ``__main__``: a profiler's ``python -m cProfile script.py``)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    frame: FrameType | None = sys._getframe()
    while frame is not None and not (
        frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__"
    ):
        frame = frame.f_back
    if frame is None or path is None or not Path(path).is_file():
        return None
    if not _same_file(frame.f_code.co_filename, path):
        # Code run as "__main__" by another main module (``python -m cProfile
        # script.py``, ``runpy.run_path``): a spawned process imports that module, not
        # this code, so nothing here runs again; its lines are not the module's lines.
        return None
    line = frame.f_lineno
    for start, end, guarded in _top_level(path, Path(path).stat().st_mtime_ns):
        if start <= line <= end:
            return None if guarded else (Path(path).name, line)
    return None


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


@functools.lru_cache(maxsize=8)
def _top_level(path: str, mtime_ns: int) -> tuple[tuple[int, int, bool], ...]:
    """The script's top-level statements: (first line, last line, is the main guard).
    Parsed once per version of the file: loaders ask at every epoch."""
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except (SyntaxError, UnicodeDecodeError, OSError):
        return ()
    return tuple((s.lineno, s.end_lineno or s.lineno, _is_main_guard(s)) for s in tree.body)


def _is_main_guard(statement: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (either way round)."""
    if not isinstance(statement, ast.If) or not isinstance(statement.test, ast.Compare):
        return False
    test = statement.test
    sides = [test.left, *test.comparators]
    names = {s.id for s in sides if isinstance(s, ast.Name)}
    texts = {s.value for s in sides if isinstance(s, ast.Constant)}
    return isinstance(test.ops[0], ast.Eq) and names == {"__name__"} and texts == {"__main__"}
