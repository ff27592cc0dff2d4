"""Zero-cost proxies: a candidate scored at initialization, from one mini-batch of the
study's own training images, in a fraction of a second, without training it; and the
ranks of several proxies combined into one estimate.

Each proxy follows its paper's definition (written here from the definitions, not from
anyone's code):

- ``synflow`` (Tanaka et al. 2020, as a NAS proxy in Abdelfattah et al. 2021): the
  network with every weight replaced by its absolute value and batch normalization
  taken out, in double precision, fed one all-ones input; R is the sum of its outputs
  and the score the sum over the weights of convolutions and linear layers of
  ``θ ⊙ ∂R/∂θ``. It needs no data.
- ``naswot`` (Mellor et al. 2021, "NAS without training"): each image of the batch gets a
  binary code, whether each rectifier's input is positive; the kernel
  ``K[i, j] = N_A − Hamming(c_i, c_j)`` (``N_A`` units) and the score ``log |det K|``.
- ``jacob_cov`` (Mellor et al. 2020, the first version of the same paper): the
  gradient of each image's summed outputs with respect to that image, the correlation
  matrix of those gradients over the batch, and the score
  ``−Σ (log(λ + k) + 1 / (λ + k))`` over its eigenvalues λ, k = 1e-5.
- ``snip`` (Lee et al. 2019): ``Σ |θ ⊙ ∂L/∂θ|`` over the weights of convolutions and
  linear layers, L the cross-entropy of the batch.
- ``grad_norm`` (Abdelfattah et al. 2021): the sum over those weights of each weight
  tensor's gradient's Euclidean norm.
- AZ-NAS's four (Lee & Ham, CVPR 2024), on the network's primary blocks (the children of
  its longest ``nn.Sequential``: NAS-Bench-201's cells, ResNet's blocks, MobileNet's
  layers) and the features entering the first of them, ``f_0 … f_L``:
  ``expressivity``, the sum over blocks of the entropy of the normalized eigenvalues of
  each block's feature covariance (channels against the batch's every position: how
  evenly, isotropically, the features fill their space); ``progressivity``, the least
  increase of that entropy from one block to the next; ``trainability``,
  ``−mean_l (σ_l + 1/σ_l − 2)`` where σ_l estimates the spectral norm of block l's
  Jacobian as ``‖∂R/∂f_{l−1}‖ / ‖∂R/∂f_l‖`` for R the projection of each image's last
  block's features on one fixed Gaussian vector (1 is best: gradients neither explode nor vanish);
  ``complexity``, the multiply-accumulates of the convolutions and linear layers an
  image takes (FLOPs).
- ``meco`` (Jiang et al., NeurIPS 2023): over every convolution's output, the least
  eigenvalue of the correlation matrix of its channels (across positions), averaged over
  the batch's first eight images, summed over the convolutions.

One forward pass of a copy of the network, and one backward pass for each kind of
gradient asked (the loss's, the outputs', R's), serve every proxy but synflow (which
needs its own network of absolute weights). Batch normalization runs on the batch's
statistics (the networks are in training mode, as in the papers); the caller seeds the
network's initialization (the study's seed and the architecture), which makes the
scores deterministic on the CPU. Higher is better for every proxy.

Several proxies of a pool become one ranking by :func:`autosearch.scoring.ranks.combined`
(AZ-NAS's sum of log ranks by default): the zero-cost estimate of the warm-up, the
ranker's prior and the benchmarks.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from autosearch.errors import ConfigError, UnknownNameError

__all__ = [
    "PROXIES",
    "ProxyConfig",
    "candidate_proxies",
    "proxy_batch",
    "proxy_scores",
]


@dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    """Which proxies, on how many of the study's training images: one batch of
    ``batch`` images drawn with ``seed`` (None: the study's seed), the same batch for
    every candidate of a study."""

    names: tuple[str, ...] = (
        "expressivity",
        "progressivity",
        "jacob_cov",
        "meco",
        "synflow",
        "complexity",
    )
    batch: int = 64
    seed: int | None = None

    def __post_init__(self) -> None:
        names = (self.names,) if isinstance(self.names, str) else self.names  # one, by name
        if not isinstance(names, Iterable) or not all(isinstance(n, str) for n in names):
            raise ConfigError(
                f"ProxyConfig names={self.names!r}: expected proxy names, of {', '.join(PROXIES)}"
            )
        object.__setattr__(self, "names", tuple(names))
        if not self.names:
            raise ConfigError(f"ProxyConfig names=(): name at least one of {', '.join(PROXIES)}")
        for name in self.names:
            if name not in PROXIES:
                raise UnknownNameError("proxy", name, PROXIES)
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 2:
            raise ConfigError(f"ProxyConfig batch={self.batch!r}: expected an integer >= 2")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise ConfigError(f"ProxyConfig seed={self.seed!r}: expected an integer or None")

    def to_dict(self) -> dict[str, object]:
        return {"names": list(self.names), "batch": self.batch, "seed": self.seed}


def _weights(model: nn.Module) -> list[torch.Tensor]:
    """The weights of the network's convolutions and linear layers (what the pruning
    papers score)."""
    return [
        m.weight
        for m in model.modules()
        if isinstance(m, nn.Conv2d | nn.Linear | nn.Conv1d | nn.Conv3d)
        and m.weight is not None
        and m.weight.requires_grad
    ]


def _without_batchnorm(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose batch normalizations are identities."""
    model = copy.deepcopy(model)
    for name, child in list(model.named_children()):
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            setattr(model, name, nn.Identity())
        else:
            setattr(model, name, _without_batchnorm(child))
    return model


_RECTIFIERS: frozenset[Callable[..., torch.Tensor]] = frozenset(
    {
        F.relu,
        F.relu6,
        F.hardtanh,
        F.hardswish,
        F.silu,
        F.gelu,
        F.leaky_relu,
        torch.relu,
        torch.relu_,
        torch.Tensor.relu,
        torch.Tensor.relu_,
    }
)


class _Codes(TorchFunctionMode):
    """Records, for every rectifier the network calls (as a module or a function),
    which of its inputs' units are positive, image by image; and sums the kernel
    ``N_A − Hamming`` as it goes (the codes themselves are not kept). With ``s = 2c − 1``
    (±1) a rectifier of ``n`` units adds ``(n + s sᵀ) / 2``: one product in single
    precision, exact (integers below 2²⁴), summed in double."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.kernel: torch.Tensor | None = None  # on the device of the first codes

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in _RECTIFIERS and args and isinstance(args[0], torch.Tensor):
            signs = (args[0].detach() > 0).reshape(args[0].shape[0], -1).float() * 2 - 1
            if signs.shape[0] == self.n:
                if self.kernel is None:
                    self.kernel = signs.new_zeros((self.n, self.n), dtype=torch.float64)
                self.kernel += (signs @ signs.T).double().add_(signs.shape[1]).div_(2)
        return func(*args, **(kwargs or {}))


def _blocks(net: nn.Module) -> list[nn.Module]:
    """The network's primary blocks: the children of the ``nn.Sequential`` with the most
    composite children (blocks of layers; the shallowest such, the network itself
    included), or of the longest where none has any (a plain stack of layers), or the
    network's own children where it has no sequence of two."""
    best: list[nn.Module] = []
    best_key = (0, 0)
    for module in net.modules():
        if isinstance(module, nn.Sequential):
            children = list(module)
            key = (sum(1 for c in children if next(c.children(), None) is not None), len(children))
            if key > best_key:
                best, best_key = children, key
    return best if len(best) >= 2 else list(net.children())


def _as_maps(x: torch.Tensor) -> torch.Tensor | None:
    """Features as (images, channels, positions), or None for what is not a feature map."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim < 2:
        return None
    return x.reshape(x.shape[0], x.shape[1], -1)


# What each proxy needs of the shared pass.
_NEEDS: Mapping[str, frozenset[str]] = {
    "naswot": frozenset({"codes"}),
    "jacob_cov": frozenset({"input"}),
    "snip": frozenset({"loss"}),
    "grad_norm": frozenset({"loss"}),
    "expressivity": frozenset({"blocks"}),
    "progressivity": frozenset({"blocks"}),
    "trainability": frozenset({"blocks"}),
    "complexity": frozenset({"layers"}),
    "meco": frozenset({"layers"}),
}


class _Pass:
    """One forward pass of a copy of the network on the batch, recording what the
    proxies in ``names`` need (rectifiers' codes, primary blocks' features, every
    convolution's output and cost); the backward passes they need are taken once each,
    when first asked."""

    def __init__(
        self, model: nn.Module, images: torch.Tensor, labels: torch.Tensor, names: Iterable[str]
    ) -> None:
        needs = frozenset().union(*(_NEEDS.get(n, frozenset()) for n in names))
        self.net = copy.deepcopy(model).train()
        for module in self.net.modules():  # a feature kept must not change after it is kept
            if getattr(module, "inplace", False) is True:
                setattr(module, "inplace", False)  # noqa: B010
        self.labels = labels
        self.images = images.clone().requires_grad_(bool(needs & {"input", "blocks"}))
        self.features: list[torch.Tensor] = []  # f_0 ... f_L
        self.layers: list[torch.Tensor] = []  # every convolution's output (detached)
        self.macs = 0.0  # multiply-accumulates an image takes
        hooks = []
        if "blocks" in needs:
            blocks = _blocks(self.net)
            if blocks:
                hooks.append(blocks[0].register_forward_pre_hook(self._enter))
            hooks += [b.register_forward_hook(self._leave) for b in blocks]
        if "layers" in needs:
            hooks += [
                m.register_forward_hook(self._layer)
                for m in self.net.modules()
                if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d | nn.Linear)
            ]
        self.codes = _Codes(images.shape[0]) if "codes" in needs else None
        try:
            with self.codes or contextlib.nullcontext():
                self.outputs = self.net(self.images)
        finally:
            for hook in hooks:
                hook.remove()
        self._gradients: dict[str, Any] = {}

    def _enter(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if args and _as_maps(args[0]) is not None:
            self.features.append(args[0])

    def _leave(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if _as_maps(output) is not None:
            self.features.append(output)

    def _layer(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not isinstance(output, torch.Tensor):
            return
        if isinstance(module, nn.Linear):
            per_output = module.in_features
        else:
            conv = cast(nn.Conv2d, module)  # of any dimension
            per_output = conv.in_channels // conv.groups * math.prod(conv.kernel_size)
        self.macs += output[0].numel() * per_output
        if output.ndim > 2:
            self.layers.append(output.detach())

    def gradient(self, of: str) -> Any:
        """The backward pass ``of`` the loss (into the weights), the outputs' sum (into
        the images) or R (into the blocks' features), taken once."""
        if of not in self._gradients:
            if of == "loss":
                self.net.zero_grad()
                F.cross_entropy(self.outputs, self.labels).backward(retain_graph=True)
                self._gradients[of] = _weights(self.net)
            elif of == "input":
                (self._gradients[of],) = torch.autograd.grad(
                    self.outputs.sum(), self.images, retain_graph=True
                )
            else:  # "blocks": R = <f_L, v>, v Gaussian of a fixed seed
                last = self.features[-1]
                v = torch.randn(  # one probe for every image: the batch's order is moot
                    (1, *last.shape[1:]),
                    generator=torch.Generator().manual_seed(0),
                    dtype=last.dtype,
                ).to(last.device)
                wanted = [f for f in self.features if f.requires_grad]
                found = torch.autograd.grad(
                    (last * v).sum(), wanted, retain_graph=True, allow_unused=True
                )
                by_id = {id(f): g for f, g in zip(wanted, found, strict=True)}
                self._gradients[of] = [by_id.get(id(f)) for f in self.features]
        return self._gradients[of]


def synflow(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    net = _without_batchnorm(model).double().eval()
    with torch.no_grad():
        for p in net.parameters():
            p.abs_()
    ones = torch.ones((1, *images.shape[1:]), dtype=torch.float64, device=images.device)
    net.zero_grad()
    net(ones).sum().backward()
    return float(sum((w * w.grad).sum().item() for w in _weights(net) if w.grad is not None))


def _naswot(run: _Pass) -> float:
    kernel = run.codes.kernel if run.codes is not None else None
    if kernel is None:
        return -math.inf  # no rectifier: no codes
    sign, logdet = torch.linalg.slogdet(kernel.cpu())
    return float(logdet) if float(sign) != 0 else -math.inf


def _jacob_cov(run: _Pass) -> float:
    gradient = run.gradient("input")
    jacobians = gradient.reshape(gradient.shape[0], -1).double().cpu().numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        correlation = np.corrcoef(jacobians)
    if not np.isfinite(correlation).all():
        return -math.inf  # an image's gradient is constant (zero): no correlation exists
    eigenvalues = np.linalg.eigvalsh(correlation)
    k = 1e-5
    return float(-np.sum(np.log(eigenvalues + k) + 1.0 / (eigenvalues + k)))


def _snip(run: _Pass) -> float:
    weights = run.gradient("loss")
    return float(sum((w * w.grad).abs().sum().item() for w in weights if w.grad is not None))


def _grad_norm(run: _Pass) -> float:
    weights = run.gradient("loss")
    return float(sum(w.grad.norm().item() for w in weights if w.grad is not None))


def _entropies(run: _Pass) -> list[float]:
    """Each of f_0 … f_L's entropy of the normalized eigenvalues of its channels'
    covariance over every image and position (cached on the pass)."""
    if not hasattr(run, "_entropies"):
        found = []
        for f in run.features:
            maps = _as_maps(f.detach())
            assert maps is not None
            x = maps.transpose(1, 2).reshape(-1, maps.shape[1]).double()
            x = x - x.mean(dim=0)
            # XᵀX and XXᵀ share their nonzero eigenvalues: take the smaller matrix
            gram = x.T @ x if x.shape[0] >= x.shape[1] else x @ x.T
            eigenvalues = torch.linalg.eigvalsh(gram / max(len(x), 1)).clamp(min=0)
            total = float(eigenvalues.sum())
            if not total > 0 or not math.isfinite(total):
                found.append(0.0)  # no variance: the features span nothing
                continue
            p = eigenvalues[eigenvalues > 0] / total
            found.append(float(-(p * p.log()).sum()))
        run._entropies = found  # type: ignore[attr-defined]
    return run._entropies  # type: ignore[attr-defined,no-any-return]


def _expressivity(run: _Pass) -> float:
    entropies = _entropies(run)
    return float(sum(entropies[1:])) if len(entropies) > 1 else -math.inf


def _progressivity(run: _Pass) -> float:
    h = _entropies(run)
    return min(h[i] - h[i - 1] for i in range(1, len(h))) if len(h) > 1 else -math.inf


def _trainability(run: _Pass) -> float:
    if len(run.features) < 2:
        return -math.inf
    norms = [float(g.norm()) if g is not None else 0.0 for g in run.gradient("blocks")]
    gains = [
        norms[i - 1] / norms[i] for i in range(1, len(norms)) if norms[i] > 0 and norms[i - 1] > 0
    ]
    if not gains:
        return -math.inf  # no gradient reaches the blocks: nothing trains
    return -float(np.mean([g + 1 / g - 2 for g in gains]))


def _complexity(run: _Pass) -> float:
    return run.macs


def _least_correlation_eigenvalue(maps: torch.Tensor) -> float:
    """The least eigenvalue of the correlation matrix of one image's channels (rows of
    ``maps``) across its positions; a constant channel correlates with nothing (0). More
    channels than positions make the matrix singular: 0, without computing it."""
    if maps.shape[0] > maps.shape[1]:
        return 0.0
    x = maps - maps.mean(dim=1, keepdim=True)
    norms = x.norm(dim=1, keepdim=True)
    x = torch.where(norms > 0, x / norms.clamp(min=torch.finfo(x.dtype).tiny), 0.0)
    return float(torch.linalg.eigvalsh(x @ x.T)[0])


def _meco(run: _Pass) -> float:
    if not run.layers:
        return -math.inf
    return float(
        sum(
            np.mean([_least_correlation_eigenvalue(image) for image in maps[:8].double()])
            for maps in (_as_maps(output) for output in run.layers)
            if maps is not None
        )
    )


_OF_PASS: Mapping[str, Callable[[_Pass], float]] = {
    "naswot": _naswot,
    "jacob_cov": _jacob_cov,
    "snip": _snip,
    "grad_norm": _grad_norm,
    "expressivity": _expressivity,
    "progressivity": _progressivity,
    "trainability": _trainability,
    "complexity": _complexity,
    "meco": _meco,
}


def _alone(name: str) -> Callable[[nn.Module, torch.Tensor, torch.Tensor], float]:
    def proxy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
        return _OF_PASS[name](_Pass(model, images, labels, (name,)))

    proxy.__name__ = proxy.__qualname__ = name
    proxy.__doc__ = f"The {name} proxy of ``model`` on the batch (see the module's docstring)."
    return proxy


naswot, jacob_cov, snip, grad_norm = (
    _alone(n) for n in ("naswot", "jacob_cov", "snip", "grad_norm")
)
expressivity, progressivity, trainability, complexity, meco = (
    _alone(n) for n in ("expressivity", "progressivity", "trainability", "complexity", "meco")
)

Proxy = Callable[[nn.Module, torch.Tensor, torch.Tensor], float]
PROXIES: Mapping[str, Proxy] = {
    "synflow": synflow,
    "naswot": naswot,
    "jacob_cov": jacob_cov,
    "snip": snip,
    "grad_norm": grad_norm,
    "expressivity": expressivity,
    "progressivity": progressivity,
    "trainability": trainability,
    "complexity": complexity,
    "meco": meco,
}


def proxy_scores(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    names: Sequence[str] = tuple(PROXIES),
) -> dict[str, float]:
    """Each named proxy of ``model`` (left untouched) on the batch ``images`` (float,
    normalized as the network trains on them) and ``labels``, with the seconds each took
    (``NAME_seconds``; the shared pass is charged to the first proxy that needs it)."""
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            f"{type(model).__name__} has no trainable parameters: zero-cost proxies score a "
            "network's weights at initialization, and this one has none to score"
        )
    unknown = [n for n in names if n not in PROXIES]
    if unknown:
        raise UnknownNameError("proxy", unknown[0], PROXIES)
    scores: dict[str, float] = {}
    run: _Pass | None = None
    for name in names:
        start = time.perf_counter()
        if name in _OF_PASS:
            if run is None:
                run = _Pass(model, images, labels, names)
            scores[name] = _OF_PASS[name](run)
        else:
            scores[name] = PROXIES[name](model, images, labels)
        scores[f"{name}_seconds"] = time.perf_counter() - start
    return scores


class _Data(Protocol):
    """What :func:`proxy_batch` reads of a dataset (autosearch.data.Dataset)."""

    @property
    def train(self) -> Any: ...

    def normalize(self, x: torch.Tensor) -> torch.Tensor: ...


def proxy_batch(config: ProxyConfig, data: _Data) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch every candidate of a study is scored on: ``config.batch`` training
    images (all, if fewer) drawn with ``config.seed``, normalized as they train."""
    generator = torch.Generator().manual_seed(config.seed or 0)
    index = torch.randperm(len(data.train), generator=generator)[: config.batch]
    return data.normalize(data.train.take(index)), data.train.y[index]


def candidate_proxies(config: ProxyConfig, model: nn.Module, data: _Data) -> dict[str, float]:
    """The configured proxies of ``model`` (at its initialization) as a trial's metrics:
    each finite score under its name (a score that cannot be had, such as NASWOT's
    singular kernel, is left out), and ``proxy_seconds``, their total. Torch's global
    random state is left as it was (a trial trains the same with or without them)."""
    images, labels = proxy_batch(config, data)
    with torch.random.fork_rng(devices=[]):
        scores = proxy_scores(model, images, labels, config.names)
    metrics = {n: scores[n] for n in config.names if math.isfinite(scores[n])}
    metrics["proxy_seconds"] = sum(scores[f"{n}_seconds"] for n in config.names)
    return metrics
