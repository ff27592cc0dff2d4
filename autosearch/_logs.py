"""autosearch's log lines reach a plain Python script too, as Optuna's do: when the
program has not configured logging (the root logger has no handler), INFO and above go
to standard error in one short line each; once it has, records simply propagate to its
handlers, and this handler stays silent."""

from __future__ import annotations

import logging

__all__ = ["install"]

_FORMAT = "[autosearch %(asctime)s] %(message)s"


class _WhenUnconfigured(logging.StreamHandler):  # type: ignore[type-arg]
    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def install() -> None:
    """Give the ``autosearch`` logger its default handler and INFO level (once)."""
    root = logging.getLogger("autosearch")
    if any(isinstance(h, _WhenUnconfigured) for h in root.handlers):
        return
    handler = _WhenUnconfigured()
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    root.addHandler(handler)
    if root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
