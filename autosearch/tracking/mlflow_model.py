"""An export folder logged as an MLflow model, in the run of the trial it came from.

The model is an MLflow ``pyfunc`` written as a model from code (``_LOADER`` below): its
artifacts are the whole export folder (``model.py``, ``model.safetensors``,
``model.onnx``, ``arch.json``, the README and, for variants, their ``torch.export``
programs), and it loads the network with the folder's own ``model.py``, so that
``mlflow.pyfunc.load_model(uri).predict(images)`` needs torch, numpy and MLflow, not
autosearch. It takes uint8 images ``(N, C, H, W)``, normalises them as the network was
trained (``model.preprocess``) and returns the logits. Registered under a name in the
model registry where asked.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from autosearch.errors import ConfigError, PlatformError
from autosearch.tracking.mlflow_runs import MLflowRuns

__all__ = ["LoggedModel", "check_model_name", "log_export"]

# The model from code MLflow stores and runs at load time (it imports no autosearch).
_LOADER = '''"""An autosearch export folder as an MLflow pyfunc model: uint8 images (N, C, H, W)
in, logits out, through the folder's own model.py."""

import importlib.util
import os

import mlflow
import numpy as np
import torch


class ExportedNetwork(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        folder = context.artifacts["export"]
        spec = importlib.util.spec_from_file_location(
            "autosearch_export_model", os.path.join(folder, "model.py")
        )
        self.model = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.model)
        self.network = self.model.load_int8() if self.model.INT8_PROGRAM else self.model.load()

    def predict(self, context, model_input, params=None):
        images = torch.as_tensor(np.asarray(model_input, dtype=np.uint8))
        with torch.no_grad():
            return self.network(self.model.preprocess(images)).float().numpy()


mlflow.models.set_model(ExportedNetwork())
'''


@dataclass(frozen=True)
class LoggedModel:
    """Where an export was logged: ``uri`` loads it (``mlflow.pyfunc.load_model``)."""

    uri: str
    run_id: str
    model_id: str
    registered: str | None = None  # "NAME version V"

    def __str__(self) -> str:
        return self.uri + (f" (registered: {self.registered})" if self.registered else "")


def log_export(
    folder: str | Path, *, uri: str, study: str, uid: str, register: str | None = None
) -> LoggedModel:
    """Log export ``folder`` of study ``study`` (creation id ``uid``) at tracking URI
    ``uri``: into its trial's run where the study was tracked when the trial ran, else
    into a run of its own (``export trial N``) in the study's experiment.

    Raises:
        ConfigError: ``folder`` is not an export folder, or ``register`` is not a name
            MLflow's registry takes.
        PlatformError: the tracking store cannot be reached or refused the model.
    """
    if register is not None:
        check_model_name(register)
    try:
        return _log_export(Path(folder), uri=uri, study=study, uid=uid, register=register)
    except (ConfigError, PlatformError):
        raise
    except Exception as exc:  # the store's own errors: a server down, a refusal
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise PlatformError(
            f"cannot log export {folder} to MLflow at {uri}: {type(exc).__name__}: {first}; "
            "the export folder is written: log it again with `autosearch export ... --mlflow` "
            "once the store answers"
        ) from None


def check_model_name(name: str) -> None:
    """Refuse a name MLflow's model registry would refuse (after the export's work).

    Raises:
        ConfigError: an empty name, or one with ``/`` or ``:``, or a path's parts.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"register={name!r}: give the registered model a name")
    if any(c in name for c in "/:") or name.strip() in (".", ".."):
        raise ConfigError(
            f"register={name!r}: MLflow's registry takes no '/' or ':' in a model's name; "
            "use letters, digits, '-', '_' or '.'"
        )


def _log_export(
    folder: Path, *, uri: str, study: str, uid: str, register: str | None
) -> LoggedModel:
    import mlflow
    import numpy as np
    import torch
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    card = _card(folder)
    trial, variant = card["provenance"].get("trial"), card.get("variant", "base")
    run = MLflowRuns(uri, study, uid).trial_or_export_run(trial)
    channels, height, width = card["input_shape"]
    classes = _classes(folder)
    signature = ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.uint8), (-1, channels, height, width))]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, classes))]),
    )
    name = "model" if variant == "base" else f"model-{_name(variant)}"
    with tempfile.TemporaryDirectory() as scratch, _active(uri, run), warnings.catch_warnings():
        # MLflow suggests type hints on predict for its data validation; the signature
        # above says what the model takes.
        warnings.filterwarnings("ignore", message=".*type hints to the `predict` method")
        loader = Path(scratch) / "exported_network.py"
        loader.write_text(_LOADER)
        info = mlflow.pyfunc.log_model(
            name=name,
            python_model=str(loader),
            artifacts={"export": str(folder)},
            signature=signature,
            input_example=np.zeros((1, channels, height, width), dtype=np.uint8),
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "numpy", "mlflow"],
            registered_model_name=register,
            tags={"autosearch.trial": str(trial), "autosearch.variant": variant},
        )
    version = getattr(info, "registered_model_version", None)
    return LoggedModel(
        uri=info.model_uri,
        run_id=run,
        model_id=str(getattr(info, "model_id", "") or ""),
        registered=f"{register} version {version}" if register else None,
    )


def _card(folder: Path) -> dict:
    try:
        card = json.loads((folder / "arch.json").read_text())
        if not (isinstance(card["input_shape"], list) and isinstance(card["provenance"], dict)):
            raise TypeError("input_shape or provenance of the wrong type")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"{folder} is not an export folder (its arch.json: {exc}); write one with "
            "`autosearch export` or Study.export first"
        ) from exc
    if not (folder / "model.py").is_file():
        raise ConfigError(f"{folder} holds no model.py; write it with `autosearch export`")
    return card


def _classes(folder: Path) -> int:
    """The network's outputs, from the ONNX file's logits (every export writes one)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(
        str(folder / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return int(session.get_outputs()[0].shape[-1])


def _name(variant: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in variant)


@contextlib.contextmanager
def _active(uri: str, run: str) -> Iterator[None]:
    """MLflow's process-wide tracking URI and active run set to ``uri`` and ``run``
    while a model is logged (MLflow logs models only there), then as they were: a run
    the caller had active stays active."""
    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run(run_id=run, nested=mlflow.active_run() is not None):
            yield
    finally:
        mlflow.set_tracking_uri(before)
