"""JSON-safe encoding of nested structures holding tensors (no pickle)."""

from __future__ import annotations

import base64
from typing import Any

import torch

_DTYPES = {str(t): t for t in (torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool)}


def encode(value: Any) -> Any:
    """Tensors become ``{"__tensor__": base64, "dtype": ..., "shape": [...]}``."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        return {
            "__tensor__": base64.b64encode(data.numpy().tobytes()).decode(),
            "dtype": str(data.dtype),
            "shape": list(data.shape),
        }
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    return value


def decode(value: Any) -> Any:
    if isinstance(value, dict) and "__tensor__" in value:
        raw = bytearray(base64.b64decode(value["__tensor__"]))
        dtype = _DTYPES[value["dtype"]]
        if not raw:
            return torch.empty(value["shape"], dtype=dtype)
        return torch.frombuffer(raw, dtype=dtype).reshape(value["shape"]).clone()
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value
