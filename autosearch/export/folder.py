"""Write an export folder (what it holds: :mod:`autosearch.export`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from autosearch._files import save_tensors
from autosearch.architecture import Architecture
from autosearch.compress import Derived, parse_variant
from autosearch.errors import ExportError
from autosearch.export.model_file import model_file
from autosearch.export.onnx import ONNX_TOLERANCE, write_onnx
from autosearch.export.programs import example_input, save_program, trace
from autosearch.scoring.cost import CONVENTIONS
from autosearch.scoring.metrics import metric
from autosearch.space import NetworkSpec

__all__ = ["write_export"]


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
    samples: torch.Tensor,
    variant: str = "base",
    derived: Derived | None = None,
    training: Mapping[str, Any] | None = None,
) -> Path:
    """Write an export folder (see the module docstring) into ``out_dir``.

    Args:
        model: The trained network (the variant's parent).
        samples: Normalised input images the ONNX file is checked on.
        variant: The variant exported; ``derived`` holds it unless it is ``base``.
        metrics: The variant's measured metrics, for ``arch.json`` and the README.
        training: How the trial was trained (``data``, ``seed``, ``train``: its
            TrainConfig), the recipe ``autosearch train`` starts from.

    Raises:
        ExportError: the folder cannot be written, or onnxruntime's output differs from
            torch's by more than ``ONNX_TOLERANCE``.
    """
    kind = parse_variant(variant).kind
    if kind != "base" and derived is None:
        raise ExportError(f"exporting variant {variant!r} needs it derived")
    out = _folder(out_dir)
    # The float network load() returns: the variant's own where it is a float network.
    network = (model if derived is None or kind == "int8" else derived.model).cpu().eval()
    programs = {
        "program": "model.pt2" if kind == "prune-channels" else None,
        "int8_program": "model_int8.pt2" if kind == "int8" else None,
    }
    card = _card(arch, description, variant, input_shape, mean, std, metrics, provenance)
    card["training"] = dict(training or {})
    (out / "model.py").write_text(model_file(spec, card, **programs))
    state = {k: v.detach().cpu().contiguous() for k, v in network.state_dict().items()}
    save_tensors(state, out / "model.safetensors", metadata={"arch_id": arch.arch_id})
    samples = samples.cpu()
    reference = derived.reference if derived else None
    for name, net in ((programs["program"], network), (programs["int8_program"], reference)):
        if name and net is not None:
            save_program(trace(net, example_input(input_shape)), out / name)
    card["onnx"] = {
        "max_abs_diff": write_onnx(network, samples, out / "model.onnx"),
        "checked_images": len(samples),
        "tolerance": ONNX_TOLERANCE,
    }
    (out / "arch.json").write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
    (out / "README.md").write_text(_readme(card, **programs))
    return out


def _folder(path: str | Path) -> Path:
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create export folder {out}: {exc}") from None
    return out


def _card(
    arch: Architecture,
    description: str,
    variant: str,
    input_shape: tuple[int, int, int],
    mean: tuple[float, ...],
    std: tuple[float, ...],
    metrics: Mapping[str, Any],
    provenance: Mapping[str, Any],
) -> dict[str, Any]:
    """What arch.json says of the export (the ONNX check is added once it is made)."""
    return {
        "architecture": arch.to_dict(),
        "arch_id": arch.arch_id,
        "description": description,
        "variant": variant,
        "input_shape": list(input_shape),
        "normalization": {"mean": list(mean), "std": list(std), "scale": "pixels / 255"},
        "metrics": dict(metrics),
        "conventions": CONVENTIONS,
        "provenance": dict(provenance),
    }


_README_METRICS = (
    "accuracy",
    "test_accuracy",
    "flops",
    "params",
    "bytes",
    "latency",
    "latency_batched",
)


_README = """# {description}

Exported by autosearch: variant `{variant}`, architecture `{arch_id}`
({origin}).

| file | what |
| --- | --- |
{files}

## Use it with plain torch

```python
import torch
import model  # this folder on sys.path

net = model.load()
images = torch.randint(0, 256, (8, {c}, {h}, {w}), dtype=torch.uint8)  # uint8 (N, C, H, W)
probabilities = net(model.preprocess(images)).softmax(1)
```
{int8_use}
With onnxruntime (normalise the same way: pixels / 255, then mean {mean}
and std {std} per channel):

```python
import onnxruntime
session = onnxruntime.InferenceSession("model.onnx")
logits = session.run(None, {{"images": model.preprocess(images).numpy()}})[0]
```

`model.onnx` was checked in onnxruntime on {checked} validation images: the
largest absolute difference from torch's logits was {diff:.3g}
(tolerance {tolerance}).

Train it again from scratch, in full: `autosearch train <this folder> --epochs 200`
(the data and training recipe of its trial, recorded in arch.json; any option overrides).

## Measured

| metric | value |
| --- | --- |
{table}

{conventions}
"""

_INT8_USE = """
The int8 variant (what was measured as `int8`):

```python
net8 = model.load_int8()
logits = net8(model.preprocess(images))
fast = torch.compile(net8)  # x86: lowers to int8 kernels
```
"""


def _readme(card: Mapping[str, Any], *, program: str | None, int8_program: str | None) -> str:
    metrics, onnx = card["metrics"], card["onnx"]
    c, h, w = card["input_shape"]
    files = [
        "| `model.py` | the network's source (torch only), `build()`, `preprocess()`, `load()` |",
        "| `model.safetensors` | the trained weights |",
        f"| `model.onnx` | the float network for ONNX runtimes (input `images` (N, {c}, {h}, {w}),"
        " output `logits`) |",
        "| `arch.json` | architecture, normalisation, metrics, provenance |",
    ]
    if program:
        files.append(
            f"| `{program}` | the channel-pruned network (`torch.export`), what `load()` returns |"
        )
    if int8_program:
        files.append(
            f"| `{int8_program}` | the int8 network (`torch.export`; int8 weights between "
            "quantize / dequantize operations), read by `load_int8()` |"
        )
    return _README.format(
        description=card["description"],
        variant=card["variant"],
        arch_id=card["arch_id"],
        origin=", ".join(f"{k} {v}" for k, v in card["provenance"].items()),
        files="\n".join(files),
        c=c,
        h=h,
        w=w,
        int8_use=_INT8_USE if int8_program else "",
        mean=card["normalization"]["mean"],
        std=card["normalization"]["std"],
        checked=onnx["checked_images"],
        diff=onnx["max_abs_diff"],
        tolerance=onnx["tolerance"],
        table="\n".join(
            f"| {metric(name).title} | {metrics[name]:.6g} |"
            for name in _README_METRICS
            if isinstance(metrics.get(name), int | float)
        ),
        conventions=card["conventions"],
    )
