"""int8 with torchao's PT2E flow, lowered to oneDNN int8 kernels on x86.

export (batch dimension dynamic) → X86InductorQuantizer annotates → prepare (observers,
or fake-quantizers for QAT) → calibrate / fine-tune → convert → lower: the freezing
passes replace quantize-dequantize patterns with ``onednn.qconv_pointwise`` /
``qlinear_pointwise`` calls, which is what is evaluated and timed.

Two traps handled here:

* A module instance called twice (one ``nn.ReLU`` after two convolutions, as in
  torchvision's blocks) gives one source partition with two outputs, which the
  quantizer refuses; each call is given its own partition first.
* ``prepare_pt2e`` folds a BatchNorm into the convolution before it even when that
  convolution's output also feeds something else (a DenseNet concatenation), changing
  the other branch. Such convolutions are kept apart from their BatchNorm, and the
  prepared model is checked against the float one before calibrating.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import operator
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

from autosearch.compress.variants import Compression, Derived
from autosearch.data import Dataset
from autosearch.errors import TrialFailed

logger = logging.getLogger(__name__)


class _KnownNoise(logging.Filter):
    """Drops three warnings that importing torchao prints on every CPU machine, each
    harmless here: its CUDA-only extensions (mxfp8, cutlass) do not load, Triton is
    absent, and torchao registers an Enum with torch's pytree the deprecated way. Any
    other message from these loggers still shows."""

    KNOWN = ("Failed to load ", "Detected no triton", "is an Enum subclass and is now natively")

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in self.KNOWN)


for _name in ("torchao", "torchao.kernel.intmm", "torch.utils._pytree"):
    logging.getLogger(_name).addFilter(_KnownNoise())

_MAX_BATCH = 1 << 16
_ACTIVATIONS = ("torch.nn.modules.activation.",)


def has_vnni() -> bool:
    """Whether this CPU has VNNI (AVX512-VNNI, AVX-VNNI or AMX) int8 dot products.

    Without it, x86 int8 kernels can overflow 16-bit intermediates, so activations
    must be quantized to 7 bits (``reduce_range``) or accuracy drops sharply."""
    probe = getattr(torch.cpu, "_is_vnni_supported", None)
    if probe is not None:
        return bool(probe())
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.exists() else ""
    return any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8"))


class Frozen(nn.Module):
    """A lowered program as a module: always in inference mode, never trained.

    Evaluated on one thread (``evaluation_threads``): on several, torch 2.13's oneDNN int8
    convolution with a fused residual sum whose other input is a convolution's (a
    projection shortcut's) gives results that differ from call to call by a
    quantization step (a race; one thread repeats them to the bit), and a point measured
    again must get the same accuracy. Latency is timed on the threads asked for."""

    evaluation_threads = 1

    def __init__(self, program: nn.Module) -> None:
        super().__init__()
        self.program = program

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.program(x)

    def train(self, mode: bool = True) -> Frozen:
        self.training = False  # an int8 program has no training mode
        return self


class _Exported(nn.Module):
    """A prepared (fake-quantized) exported graph that the trainer can train: train()
    and eval() switch its BatchNorm and dropout nodes the way exported graphs need."""

    def __init__(self, graph: torch.fx.GraphModule) -> None:
        super().__init__()
        self.graph_module = graph

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.graph_module(x)

    def train(self, mode: bool = True) -> _Exported:
        from torchao.quantization.pt2e import (
            move_exported_model_to_eval,
            move_exported_model_to_train,
        )

        (move_exported_model_to_train if mode else move_exported_model_to_eval)(self.graph_module)
        self.training = mode
        return self


def _dynamic_batch() -> dict[str, dict[int, torch.export.Dim]]:
    return {"x": {0: torch.export.Dim("batch", min=1, max=_MAX_BATCH)}}


def _export(model: nn.Module, example: torch.Tensor) -> torch.fx.GraphModule:
    class Wrapped(nn.Module):  # names the input "x" for the dynamic-shape spec
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    graph = torch.export.export(
        Wrapped(model), (example,), dynamic_shapes=_dynamic_batch()
    ).module()
    _unshare_activations(graph)
    _keep_shared_convs_unfolded(graph)
    return graph


def _unshare_activations(graph: torch.fx.GraphModule) -> None:
    for node in graph.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if node.op != "call_function" or not stack:
            continue
        key = next(reversed(stack))
        fqn, cls = stack[key]
        if str(cls).startswith(_ACTIVATIONS) or "activation" in str(cls):
            stack[key] = (f"{fqn}@{node.name}", cls)


def _keep_shared_convs_unfolded(graph: torch.fx.GraphModule) -> None:
    aten = torch.ops.aten
    convs = {aten.conv2d.default, aten.conv2d.padding, aten.convolution.default}
    norms = {aten.batch_norm.default, aten._native_batch_norm_legit_no_training.default}
    changed = False
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node.target not in convs or len(node.users) < 2:
            continue
        for user in list(node.users):
            if user.target in norms:
                with graph.graph.inserting_after(node):
                    kept = graph.graph.call_function(aten.clone.default, (node,))
                user.replace_input_with(node, kept)
                changed = True
    if changed:
        graph.graph.lint()
        graph.recompile()


INT8_FLOOR = (2, 13)  # the torch whose CPU build torchao's lowering finds int8 kernels in


def lowering_refusal() -> str | None:
    """Why an int8 program cannot be lowered with this torch (None: it can), in one line
    that names the version and the floor."""
    version = torch.__version__.split("+")[0]
    numbers = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if numbers < INT8_FLOOR:
        floor = ".".join(map(str, INT8_FLOOR))
        return (
            f"int8 programs are lowered only on torch >= {floor}, where torchao finds the "
            f"quantized CPU kernels; this is torch {version}: int8 figures stay estimates "
            "(fake quantization)"
        )
    return None


def _require_lowering() -> None:
    refusal = lowering_refusal()
    if refusal is not None:
        raise TrialFailed(refusal)


def _quantizer(*, is_qat: bool) -> object:
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq

    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(
        xiq.get_default_x86_inductor_quantization_config(is_qat=is_qat, reduce_range=not has_vnni())
    )
    return quantizer


def _lower(converted: torch.fx.GraphModule, example: torch.Tensor) -> torch.fx.GraphModule:
    """torchao's ``lower_pt2e_quantized_to_x86``, with the batch dimension kept dynamic
    so that one lowered program serves batch 1, 32 and evaluation batches, and the
    converted graph exported again without torch's compiler tracing it (``strict=False``;
    torchao's is strict): the converted module is a graph already, and the program is the
    same but for the order its attributes are read in, in less time."""
    from autosearch._compat import export_lowering

    _is_cia_op, constant_fold, freezing_passes = export_lowering()

    table = torch.export.default_decompositions()
    for op in list(table):
        if not _is_cia_op(op):
            del table[op]
    lowered = (
        torch.export.export(converted, (example,), dynamic_shapes=_dynamic_batch(), strict=False)
        .run_decompositions(table)
        .module()
    )
    for node in lowered.graph.nodes:  # aten.t → permute, as torchao does
        if node.target == torch.ops.aten.t.default:
            with lowered.graph.inserting_before(node):
                permuted = lowered.graph.call_function(
                    torch.ops.aten.permute.default, args=(node.args[0], [1, 0])
                )
            node.replace_all_uses_with(permuted)
            lowered.graph.erase_node(node)
    lowered.recompile()
    freezing_passes(lowered, (example,))
    constant_fold(lowered)
    return lowered


def _calibration(data: Dataset, count: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    pick = torch.randperm(len(data.train), generator=generator)[:count]
    return data.normalize(data.train.take(pick)).float()


def int8_ops(program: nn.Module) -> list[str]:
    """The quantized kernels a lowered program calls (empty: it is not really int8)."""
    graph = program.program if isinstance(program, Frozen) else program
    return sorted(
        {
            str(n.target)
            for n in graph.graph.nodes  # type: ignore[union-attr]
            if n.op == "call_function" and str(n.target).startswith("onednn.q")
        }
    )


def _saved_size(converted: torch.fx.GraphModule) -> int:
    """Bytes of the int8 program's tensors (int8 weights, their scales and zero points,
    float biases) saved as safetensors, the convention of float models' bytes."""
    from safetensors.torch import save

    # Only what the graph reads: the state dict still holds the float weights it replaced.
    tensors: dict[str, torch.Tensor] = {}
    for node in converted.graph.nodes:
        if node.op == "get_attr":
            value = operator.attrgetter(node.target)(converted)
            if isinstance(value, torch.Tensor):
                tensors.setdefault(node.target, value.detach().clone())
    return len(save(tensors))


def _only_used(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``graph`` without the parameters and buffers it no longer reads: converting keeps
    the float weights that the int8 ones replaced, which a saved program would carry."""
    used = {str(n.target) for n in graph.graph.nodes if n.op == "get_attr"}
    named = [*graph.named_parameters(), *graph.named_buffers()]
    for name, _ in named:
        if name not in used:
            owner, _, attr = name.rpartition(".")
            module = graph.get_submodule(owner) if owner else graph
            delattr(module, attr)
    graph.delete_all_unused_submodules()
    return graph


@contextlib.contextmanager
def _only_patterns_it_can_hold(*, qat: bool):
    """torchao's PT2E passes, looking only for conv-BatchNorm patterns the graph can hold.

    ``prepare_qat_pt2e`` and ``convert_pt2e`` look for QAT's conv-BatchNorm patterns of
    four conv functions (1-d, 2-d, transposed), each pattern exported as a graph to match
    (about 100 exports): most of a small variant's time, whatever the network. A
    pattern whose conv the graph does not call cannot match, so its search is skipped;
    and a graph prepared for post-training quantization holds no QAT pattern at all
    (PTQ's prepare folds each BatchNorm into its conv, or leaves it apart where the conv
    is shared, as in a DenseNet's stem), so its convert skips the folding pass. The
    graph converted is the same, to the bit."""
    from torchao.quantization.pt2e import qat_utils, quantize_pt2e

    saved: list[tuple[object, str, object]] = []

    def replace(module: object, name: str, wrap: Callable) -> None:
        original = getattr(module, name, None)
        if original is not None:  # another torchao: its passes are left as they are
            saved.append((module, name, original))
            setattr(module, name, wrap(original))

    if not qat:
        replace(quantize_pt2e, "_fold_conv_bn_qat", lambda _: lambda graph: graph)
    for name in ("_fuse_conv_bn_qat_helper", "_fold_conv_bn_qat_helper"):
        replace(qat_utils, name, _when_the_graph_calls_its_conv)
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def _when_the_graph_calls_its_conv(helper: Callable) -> Callable:
    def guarded(graph: torch.fx.GraphModule, conv: Callable, *args, **kwargs):
        calls = {getattr(node.target, "_opname", None) for node in graph.graph.nodes}
        return helper(graph, conv, *args, **kwargs) if conv.__name__ in calls else graph

    return guarded


def _finish(
    prepared: torch.fx.GraphModule,
    parent: nn.Module,
    example: torch.Tensor,
    details: dict,
    *,
    qat: bool,
) -> Derived:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    with _only_patterns_it_can_hold(qat=qat):
        converted = _only_used(convert_pt2e(prepared))
    size = _saved_size(converted)
    lowered = Frozen(_lower(converted, example))
    if not int8_ops(lowered):
        raise TrialFailed("int8 lowering left no quantized kernels; the network was not quantized")
    return Derived(
        model=lowered,
        float_model=parent,
        weight_bits=8,
        activation_bits=8,
        saved_bytes=size,
        details={**details, "reduce_range": float(not has_vnni())},
        reference=converted,
    )


def quantize_ptq(
    parent: nn.Module, data: Dataset, compression: Compression, *, seed: int
) -> Derived:
    """Post-training static int8 of a trained float network (CPU).

    Raises:
        TrialFailed: this torch cannot lower int8 programs (:func:`lowering_refusal`),
            or the prepared graph is not the float network.
    """
    _require_lowering()
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    model = copy.deepcopy(parent).cpu().eval()
    calibration = _calibration(data, compression.calibration_images, seed)
    example = calibration[:2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(_export(model, example), _quantizer(is_qat=False))
        with torch.no_grad():
            reference, observed = model(calibration[:64]), prepared(calibration[:64])
        gap = float((reference - observed).abs().max())
        scale = float(reference.abs().max()) + 1e-6
        if gap > 1e-3 * scale:  # BatchNorm folded into a shared conv, or similar damage
            raise TrialFailed(
                f"the prepared int8 graph differs from the float network by {gap:.3g} "
                "before calibration; it was not quantized"
            )
        with torch.no_grad():
            for batch in calibration.split(128):
                prepared(batch)
        return _finish(prepared, parent, example, {"float_gap": gap}, qat=False)


def quantize_qat(
    parent: nn.Module,
    data: Dataset,
    compression: Compression,
    *,
    seed: int,
    finetune: Callable[[nn.Module], None],
) -> Derived:
    """Quantization-aware fine-tuning (fake-quantized weights and activations), then
    int8 as :func:`quantize_ptq`. Fine-tuning runs on the CPU."""
    _require_lowering()  # before fine-tuning: its result could not be lowered
    from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e

    model = copy.deepcopy(parent).cpu().train()
    example = _calibration(data, 2, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with _only_patterns_it_can_hold(qat=True):
            prepared = prepare_qat_pt2e(_export(model, example), _quantizer(is_qat=True))
        trainable = _Exported(prepared)
        finetune(trainable)
        trainable.cpu().train(False)
        return _finish(prepared, parent, example, {}, qat=True)
