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

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import json
import logging
import pprint
import re
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from autosearch._compat import onnx_registry_built_once as registry_built_once
from autosearch._files import save_tensors
from autosearch.architecture import Architecture
from autosearch.compress import Derived, parse_variant
from autosearch.errors import ExportError
from autosearch.scoring.cost import CONVENTIONS
from autosearch.scoring.metrics import metric
from autosearch.space import NetworkSpec

__all__ = ["ONNX_TOLERANCE", "onnx_parity", "write_export", "write_onnx"]

# Largest absolute difference allowed between onnxruntime's and torch's logits.
ONNX_TOLERANCE = 1e-4
_MAX_BATCH = 4096

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
    (out / "model.py").write_text(_model_file(spec, card, **programs))
    state = {k: v.detach().cpu().contiguous() for k, v in network.state_dict().items()}
    save_tensors(state, out / "model.safetensors", metadata={"arch_id": arch.arch_id})
    samples = samples.cpu()
    reference = derived.reference if derived else None
    for name, net in ((programs["program"], network), (programs["int8_program"], reference)):
        if name and net is not None:
            _save_program(_program(net, _example(input_shape)), out / name)
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


def _model_file(
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


def _dynamic_batch() -> tuple[dict[int, Any]]:
    return ({0: torch.export.Dim("batch", min=1, max=_MAX_BATCH)},)


def _example(input_shape: tuple[int, int, int]) -> torch.Tensor:
    """What programs are traced on: zeros of the input's shape. A saved program keeps
    its example inputs (and a view's whole storage), so tracing on the user's images
    would ship them inside the model file."""
    return torch.zeros(2, *input_shape)


def _program(network: nn.Module, example: torch.Tensor) -> torch.export.ExportedProgram:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(network, (example,), dynamic_shapes=_dynamic_batch())


def _save_program(program: torch.export.ExportedProgram, path: Path) -> None:
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
            dynamic_shapes=_dynamic_batch(), external_data=False, dynamo=True,
        )  # fmt: skip


def onnx_parity(network: nn.Module, samples: torch.Tensor, path: str | Path) -> float:
    """Largest absolute difference between onnxruntime's and torch's outputs."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        expected = network.cpu().eval()(samples.cpu()).numpy()
    got = session.run(None, {session.get_inputs()[0].name: samples.cpu().numpy()})[0]
    return float(abs(got - expected).max())


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
