"""The export's ``model.py``: the network's torch-only source from the space's model
file, then its configuration, input normalisation and loaders (a small safetensors
reader, so plain torch is enough)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pprint
import re
from collections.abc import Mapping
from typing import Any

from autosearch.errors import ExportError
from autosearch.space import NetworkSpec

_PRELUDE = ("from __future__ import annotations", "import torch", "import torch.nn as nn")

_LOADER = '''

# ---------------------------------------------------------------------------------------
# Export: the searched configuration, input normalisation and a torch-only weight loader.

ARCHITECTURE = {architecture}

CONFIG = {config}

INPUT_SHAPE = {input_shape}  # (channels, height, width)
MEAN = {mean}  # per channel, on pixels scaled to [0, 1]
STD = {std}


_NETWORK = {factory}  # the model file's factory (which may itself be called build)


def build() -> nn.Module:
    """The network with freshly initialised weights."""
    return _NETWORK(**CONFIG)


def preprocess(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (N, C, H, W) → the normalised float input the network was trained on."""
    mean = torch.tensor(MEAN).view(1, -1, 1, 1)
    std = torch.tensor(STD).view(1, -1, 1, 1)
    return (images.float() / 255.0 - mean) / std


VARIANT = {variant!r}
# Set when the variant changed the network's structure (channel pruning): the network is
# then the torch.export program in this file, not build() with weights.
PROGRAM = {program!r}
INT8_PROGRAM = {int8_program!r}  # int8 variants: the quantized torch.export program


def _here(name: str) -> str:
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def load(path: str | None = None) -> nn.Module:
    """The trained network in eval mode, weights from ``model.safetensors`` beside this file."""
    if PROGRAM:
        return torch.export.load(path or _here(PROGRAM)).module()
    model = build()
    model.load_state_dict(read_safetensors(path or _here("model.safetensors")))
    return model.eval()


def load_int8(path: str | None = None) -> nn.Module:
    """The int8 variant: int8 weights between quantize / dequantize operations (runs with
    torch alone; ``torch.compile`` lowers it to int8 kernels on x86)."""
    if not INT8_PROGRAM:
        raise FileNotFoundError("this export holds no int8 variant (export it with --variant int8)")
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers the q/dq operations)

    return torch.export.load(path or _here(INT8_PROGRAM)).module()


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


def model_file(
    spec: NetworkSpec, card: Mapping[str, Any], *, program: str | None, int8_program: str | None
) -> str:
    """The export's model.py: the network's source, then its configuration and loaders."""
    tail = _LOADER.format(
        architecture=pprint.pformat(card["architecture"], sort_dicts=True),
        config=pprint.pformat(dict(spec.kwargs), sort_dicts=True),
        input_shape=tuple(card["input_shape"]),
        mean=tuple(card["normalization"]["mean"]),
        std=tuple(card["normalization"]["std"]),
        factory=spec.factory,
        variant=card["variant"],
        program=program,
        int8_program=int8_program,
    )
    origin = ", ".join(f"{k} {v}" for k, v in card["provenance"].items())
    header = (
        f"{card['description']}\n\nExported by autosearch ({origin}); variant "
        f"{card['variant']}.\nNeeds only torch:\n\n"
        "    import model\n"
        "    net = model.load()                        # weights from model.safetensors\n"
        "    logits = net(model.preprocess(images))    # images: uint8 (N, C, H, W)\n"
    )
    return _model_source(spec, header, tail)
