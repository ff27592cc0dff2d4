"""Other projects' private internals, in one place.

Each name here reaches into a module its project does not promise to keep: it is
imported only here, on first use, with the versions it was checked against, so that an
upgrade that moves it breaks one file (and ``tests/test_compat.py`` names which). The
upper bounds in pyproject.toml keep an installation within the checked versions.

==========================  ========================================  ===================
name                        what                                      checked against
==========================  ========================================  ===================
``rdb_models``              Optuna's RDB table models                 optuna 4.0-5.1
``scoped_session``          Optuna's session context (commit/rollback) optuna 4.0-5.1
``exact_hypervolume``       Optuna's exact hypervolume, any dimension optuna 4.0-5.1
``ARTIFACT_ATTR_PREFIX``    the attribute Optuna marks an upload with optuna 4.0-5.1
``journal_file``            the file a JournalStorage's file backend  optuna 4.0-5.1
                            writes
``TorchDispatchMode``       torch's dispatch-mode base class          torch 2.11-2.13
``tree_flatten``            torch's pytree flattening                 torch 2.11-2.13
``export_lowering``         torch.export and Inductor passes torchao  torch 2.11-2.13
                            lowers int8 programs with
``onnx_registry_built_once``  the ONNX exporter's torchlib registry   torch 2.11-2.13
``ray_token_setup``         Ray's token authentication set-up         ray 2.40-2.60
``ray_gcs_client``          Ray's GCS client (is a head there?)       ray 2.40-2.60
==========================  ========================================  ===================
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = [
    "ARTIFACT_ATTR_PREFIX",
    "TorchDispatchMode",
    "exact_hypervolume",
    "export_lowering",
    "onnx_registry_built_once",
    "ray_gcs_client",
    "ray_token_setup",
    "rdb_models",
    "scoped_session",
    "tree_flatten",
]

# optuna.artifacts._upload.ARTIFACTS_ATTR_PREFIX: the trial (or study) system attribute
# ``artifacts:ID`` that an upload records.
ARTIFACT_ATTR_PREFIX = "artifacts:"


# Optuna ------------------------------------------------------------------------------------
def journal_file(storage: Any) -> str | None:
    """The file a ``JournalStorage`` on a ``JournalFileBackend`` writes; None for another
    backend (Redis, a custom one)."""
    from optuna.storages.journal import JournalFileBackend

    backend = getattr(storage, "_backend", None)
    if not isinstance(backend, JournalFileBackend):
        return None
    return str(backend._file_path)


def rdb_models() -> Any:
    """``optuna.storages._rdb.models``: the RDB storage's tables."""
    from optuna.storages._rdb import models

    return models


def scoped_session(scoped: Any) -> Any:
    """``optuna.storages._rdb.storage._create_scoped_session``: a session that commits at
    the end of its block, rolls back on an error, and wraps SQLAlchemy's errors in
    ``optuna.exceptions.StorageInternalError``."""
    from optuna.storages._rdb.storage import _create_scoped_session

    return _create_scoped_session(scoped)


def exact_hypervolume(points: Any, reference: Any) -> float:
    """``optuna._hypervolume.compute_hypervolume``: the exact hypervolume of minimised
    ``points`` (n × objectives) against ``reference``, in any dimension."""
    from optuna._hypervolume import compute_hypervolume

    return float(compute_hypervolume(points, reference))


# torch -------------------------------------------------------------------------------------
def export_lowering() -> tuple[Callable[..., bool], Callable[..., Any], Callable[..., Any]]:
    """What torchao's ``lower_pt2e_quantized_to_x86`` lowers with: ``(is_cia_op,
    constant_fold, freezing_passes)`` (``torch._export.utils._is_cia_op``,
    ``torch._inductor.constant_folding.constant_fold``,
    ``torch._inductor.fx_passes.freezing_patterns.freezing_passes``)."""
    from torch._export.utils import _is_cia_op
    from torch._inductor.constant_folding import constant_fold
    from torch._inductor.fx_passes.freezing_patterns import freezing_passes

    return _is_cia_op, constant_fold, freezing_passes


_REGISTRIES: dict[tuple[Any, ...], Any] = {}  # by the arguments torch built each with
_REGISTRY_LOCK = threading.Lock()


@contextlib.contextmanager
def onnx_registry_built_once() -> Iterator[None]:
    """While held, torch's ONNX exporter (``torch.onnx.export(..., dynamo=True)``) gets
    the torchlib registry of an opset built before in this process
    (``torch.onnx._internal.exporter._registration.ONNXRegistry.from_torchlib``, which it
    builds at every call, onnxscript reading the source of its functions). It changes a
    registry only for a custom translation table, which autosearch never passes. Where
    the exporter is not laid out as expected, the export goes on as torch's."""
    try:
        from torch.onnx._internal.exporter._registration import ONNXRegistry
    except ImportError:
        yield
        return
    build = ONNXRegistry.__dict__.get("from_torchlib")
    if not isinstance(build, classmethod):
        yield
        return

    def built_once(cls: type, *args: Any, **kwargs: Any) -> Any:  # torch's own defaults
        key = (args, tuple(sorted(kwargs.items())))
        if key not in _REGISTRIES:
            _REGISTRIES[key] = build.__func__(cls, *args, **kwargs)
        return _REGISTRIES[key]

    with _REGISTRY_LOCK:
        ONNXRegistry.from_torchlib = classmethod(built_once)  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            ONNXRegistry.from_torchlib = build  # type: ignore[method-assign,assignment]


# Ray ---------------------------------------------------------------------------------------
def ray_token_setup() -> Any:
    """``ray._private.authentication.authentication_token_setup``: Ray's set-up of token
    authentication from this machine's token (``maybe_enable_token_auth_if_token_available``)."""
    from ray._private.authentication import authentication_token_setup

    return authentication_token_setup


def ray_gcs_client(address: str) -> Any:
    """``ray._raylet.GcsClient``: a client of the Ray head at ``address`` (raises where
    it refuses or does not answer)."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    return GcsClient(address=address)
