"""Write a trained candidate as files that need nothing of autosearch.

An export folder holds:

* ``arch.json`` — the architecture, its description, input shape, normalisation and
  the measured metrics (with the cost conventions);
* ``model.safetensors`` — the weights;
* ``model.py`` — the network's torch-only source, its configuration, and ``load()``,
  which reads the weights with a small built-in safetensors reader, so plain torch
  is enough.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pprint
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch.nn as nn
from safetensors.torch import save_file

from autosearch.architecture import Architecture
from autosearch.cost import CONVENTIONS
from autosearch.errors import ExportError
from autosearch.space import NetworkSpec

__all__ = ["write_export"]

_PRELUDE = ("from __future__ import annotations", "import torch", "import torch.nn as nn")

_LOADER = '''

# ---------------------------------------------------------------------------------------
# Export: the searched configuration, input normalisation and a torch-only weight loader.

ARCHITECTURE = {architecture}

CONFIG = {config}

INPUT_SHAPE = {input_shape}  # (channels, height, width)
MEAN = {mean}  # per channel, on pixels scaled to [0, 1]
STD = {std}


def build() -> nn.Module:
    """The network with freshly initialised weights."""
    return {factory}(**CONFIG)


def preprocess(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (N, C, H, W) → the normalised float input the network was trained on."""
    mean = torch.tensor(MEAN).view(1, -1, 1, 1)
    std = torch.tensor(STD).view(1, -1, 1, 1)
    return (images.float() / 255.0 - mean) / std


def load(path: str | None = None) -> nn.Module:
    """The trained network in eval mode, weights from ``model.safetensors`` beside this file."""
    import os

    path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.safetensors")
    model = build()
    model.load_state_dict(read_safetensors(path))
    return model.eval()


_DTYPES = {{
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}}


def read_safetensors(path: str) -> dict[str, torch.Tensor]:
    """Read a .safetensors file with torch alone (8-byte header size, JSON header, data)."""
    import json

    with open(path, "rb") as f:
        data = bytearray(f.read())
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    header.pop("__metadata__", None)
    start = 8 + size
    tensors = {{}}
    for name, info in header.items():
        dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        if end == begin:
            tensors[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        flat = torch.frombuffer(data, dtype=dtype, count=(end - begin) // dtype.itemsize,
                                offset=start + begin)
        tensors[name] = flat.reshape(info["shape"]).clone()
    return tensors
'''


def _model_source(spec: NetworkSpec, header: str, tail: str) -> str:
    module = importlib.import_module(spec.module)
    source = inspect.getsource(module)
    if re.search(r"^\s*(from|import)\s+(autosearch|search_spaces|controllers)\b", source, re.M):
        raise ExportError(
            f"network module {spec.module} imports autosearch code; a space's model file must "
            "import only torch so that exports run anywhere"
        )
    # The export's own docstring and imports replace the model file's.
    first = ast.parse(source).body[:1]
    if first and isinstance(first[0], ast.Expr) and isinstance(first[0].value, ast.Constant):
        source = "".join(source.splitlines(keepends=True)[first[0].end_lineno :])
    lines = [line for line in source.splitlines(keepends=True) if line.strip() not in _PRELUDE]
    prelude = "\n".join(_PRELUDE[:1]) + "\n\n" + "\n".join(_PRELUDE[1:]) + "\n"
    return f'"""{header}"""\n\n{prelude}' + "".join(lines).lstrip("\n") + tail


def write_export(
    out_dir: str | Path,
    *,
    arch: Architecture,
    spec: NetworkSpec,
    model: nn.Module,
    description: str,
    input_shape: tuple[int, int, int],
    mean: tuple[float, ...],
    std: tuple[float, ...],
    metrics: Mapping[str, Any],
    provenance: Mapping[str, Any],
) -> Path:
    """Write ``arch.json``, ``model.safetensors`` and ``model.py`` into ``out_dir``."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create export folder {out}: {exc}") from None
    tail = _LOADER.format(
        architecture=pprint.pformat(arch.to_dict(), sort_dicts=True),
        config=pprint.pformat(dict(spec.kwargs), sort_dicts=True),
        input_shape=tuple(input_shape),
        mean=tuple(mean),
        std=tuple(std),
        factory=spec.factory,
    )
    origin = ", ".join(f"{k} {v}" for k, v in provenance.items())
    header = (
        f"{description}\n\nExported by autosearch ({origin})."
        "\nNeeds only torch:\n\n"
        "    import model\n"
        "    net = model.load()                        # weights from model.safetensors\n"
        "    logits = net(model.preprocess(images))    # images: uint8 (N, C, H, W)\n"
    )
    (out / "model.py").write_text(_model_source(spec, header, tail))
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"arch_id": arch.arch_id})
    card = {
        "architecture": arch.to_dict(),
        "arch_id": arch.arch_id,
        "description": description,
        "input_shape": list(input_shape),
        "normalization": {"mean": list(mean), "std": list(std), "scale": "pixels / 255"},
        "metrics": dict(metrics),
        "conventions": CONVENTIONS,
        "provenance": dict(provenance),
    }
    (out / "arch.json").write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    return out
