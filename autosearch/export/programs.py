"""The ``torch.export`` programs an export ships where ``build()`` with weights cannot
stand for the network (a channel-pruned network, an int8 one): traced on zeros with a
dynamic batch, saved deflated."""

from __future__ import annotations

import io
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

_MAX_BATCH = 4096


def dynamic_batch() -> tuple[dict[int, Any]]:
    return ({0: torch.export.Dim("batch", min=1, max=_MAX_BATCH)},)


def example_input(input_shape: tuple[int, int, int]) -> torch.Tensor:
    """What programs are traced on: zeros of the input's shape. A saved program keeps
    its example inputs (and a view's whole storage), so tracing on the user's images
    would ship them inside the model file."""
    return torch.zeros(2, *input_shape)


def trace(network: nn.Module, example: torch.Tensor) -> torch.export.ExportedProgram:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(network, (example,), dynamic_shapes=dynamic_batch())


def save_program(program: torch.export.ExportedProgram, path: Path) -> None:
    """``torch.export.save``, compressed: its archive stores the graph's JSON and the
    weights uncompressed, several times the float weights for a small network.
    ``torch.export.load`` reads the deflated archive as it is."""
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    with (
        zipfile.ZipFile(buffer) as saved,
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as packed,
    ):
        for entry in saved.infolist():
            packed.writestr(entry.filename, saved.read(entry.filename))
