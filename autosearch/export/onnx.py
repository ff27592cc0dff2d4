"""The export's ONNX file: written by ``torch.onnx.export`` (dynamo) with a dynamic
batch, and checked in onnxruntime against torch on validation images."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn as nn

from autosearch._compat import onnx_registry_built_once as registry_built_once
from autosearch.errors import ExportError
from autosearch.export.programs import dynamic_batch

__all__ = ["ONNX_TOLERANCE", "onnx_parity", "write_onnx"]

# Largest absolute difference allowed between onnxruntime's and torch's logits.
ONNX_TOLERANCE = 1e-4


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The ONNX exporter prints progress and warns about torchvision: not our user's news."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch._dynamo", "torch.export")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def write_onnx(network: nn.Module, samples: torch.Tensor, path: str | Path) -> float:
    """Write ``network`` as ONNX (input ``images``, output ``logits``, dynamic batch) and
    return the largest absolute difference of onnxruntime's logits from torch's on
    ``samples``.

    Raises:
        ExportError: the exporter failed, or the difference exceeds ``ONNX_TOLERANCE``.
    """
    example = torch.zeros(2, *samples.shape[1:])  # traced on zeros: no data in the file
    try:
        with _quiet():
            _onnx_export(network.cpu().eval(), example, Path(path))
    except Exception as exc:
        raise ExportError(f"the ONNX exporter failed: {type(exc).__name__}: {exc}") from None
    diff = onnx_parity(network, samples, path)
    if not diff < ONNX_TOLERANCE:
        raise ExportError(
            f"{path}: onnxruntime's logits differ from torch's by {diff:.3g} "
            f"(tolerance {ONNX_TOLERANCE}); the ONNX file is not trustworthy"
        )
    return diff


def _onnx_export(network: nn.Module, example: torch.Tensor, path: Path) -> None:
    """``torch.onnx.export(..., dynamo=True)``, with its table of ATen-to-ONNX functions
    built once a process: torch builds it again at every export (onnxscript reading the
    source of its ~500 functions), a third of a small network's export. Every other
    step is ``torch.onnx.export``'s own, so the file is the same."""
    with registry_built_once():
        torch.onnx.export(
            network, (example,), str(path), input_names=["images"], output_names=["logits"],
            dynamic_shapes=dynamic_batch(), external_data=False, dynamo=True,
        )  # fmt: skip


def onnx_parity(network: nn.Module, samples: torch.Tensor, path: str | Path) -> float:
    """Largest absolute difference between onnxruntime's and torch's outputs."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        expected = network.cpu().eval()(samples.cpu()).numpy()
    got = session.run(None, {session.get_inputs()[0].name: samples.cpu().numpy()})[0]
    return float(abs(got - expected).max())
