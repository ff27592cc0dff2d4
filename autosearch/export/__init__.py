"""Write a trained candidate as files that need nothing of autosearch.

An export folder holds:

* ``arch.json`` — the architecture, its description, input shape, normalisation, the
  variant, the measured metrics (with the cost conventions) and the ONNX check;
* ``model.safetensors`` — the weights;
* ``model.py`` — the network's torch-only source, its configuration, and ``load()``,
  which reads the weights with a small built-in safetensors reader, so plain torch
  is enough;
* ``model.onnx`` — the same float network for ONNX runtimes (dynamic batch), checked
  in onnxruntime against torch on validation images when written;
* for ``prune-channels`` variants, whose layers no longer match the searched
  configuration, ``model.pt2``: the pruned network as a ``torch.export`` program, which
  ``load()`` returns;
* for ``int8`` variants, ``model_int8.pt2``: the quantized network as a ``torch.export``
  program (int8 weights between quantize / dequantize operations), read by
  ``load_int8()``;
* ``README.md`` — what the folder holds, how to use it, and the metrics.
"""

from autosearch.export.folder import write_export
from autosearch.export.onnx import ONNX_TOLERANCE, onnx_parity, write_onnx

__all__ = ["ONNX_TOLERANCE", "onnx_parity", "write_export", "write_onnx"]
