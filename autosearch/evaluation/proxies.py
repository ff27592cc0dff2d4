"""Zero-cost proxies: a candidate scored at initialization, from one mini-batch of the
study's own training images, in seconds, without training it.

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

Batch normalization runs on the batch's statistics (the networks are in training mode,
as in the papers). Every proxy is computed on a fresh copy of the network it is given,
so one proxy never sees another's changes; the caller seeds the network's
initialization (the study's seed and the architecture), which makes the scores
deterministic on the CPU. Higher is better for every proxy.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from autosearch.errors import ConfigError, UnknownNameError

__all__ = ["PROXIES", "ProxyConfig", "candidate_proxies", "proxy_batch", "proxy_scores"]


@dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    """Which proxies, on how many of the study's training images: one batch of
    ``batch`` images drawn with ``seed`` (None: the study's seed), the same batch for
    every candidate of a study."""

    names: tuple[str, ...] = ("synflow", "naswot", "jacob_cov", "snip", "grad_norm")
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


def synflow(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    net = _without_batchnorm(model).double().eval()
    with torch.no_grad():
        for p in net.parameters():
            p.abs_()
    ones = torch.ones((1, *images.shape[1:]), dtype=torch.float64, device=images.device)
    net.zero_grad()
    net(ones).sum().backward()
    return float(sum((w * w.grad).sum().item() for w in _weights(net) if w.grad is not None))


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
    ``C Cᵀ + (1 − C)(1 − C)ᵀ`` as it goes (the codes themselves are not kept)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.kernel: torch.Tensor | None = None  # on the device of the first codes

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in _RECTIFIERS and args and isinstance(args[0], torch.Tensor):
            codes = (args[0].detach() > 0).reshape(args[0].shape[0], -1).double()
            if codes.shape[0] == self.n:
                if self.kernel is None:
                    self.kernel = codes.new_zeros((self.n, self.n))
                self.kernel += codes @ codes.T + (1 - codes) @ (1 - codes).T
        return func(*args, **(kwargs or {}))


def naswot(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    net = copy.deepcopy(model).train()
    codes = _Codes(images.shape[0])
    with torch.no_grad(), codes:
        net(images)
    if codes.kernel is None:
        return -math.inf  # no rectifier: no codes
    sign, logdet = torch.linalg.slogdet(codes.kernel.cpu())
    return float(logdet) if float(sign) != 0 else -math.inf


def jacob_cov(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    net = copy.deepcopy(model).train()
    x = images.clone().requires_grad_(True)
    net(x).sum().backward()
    assert x.grad is not None
    jacobians = x.grad.reshape(x.shape[0], -1).double().cpu().numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        correlation = np.corrcoef(jacobians)
    if not np.isfinite(correlation).all():
        return -math.inf  # an image's gradient is constant (zero): no correlation exists
    eigenvalues = np.linalg.eigvalsh(correlation)
    k = 1e-5
    return float(-np.sum(np.log(eigenvalues + k) + 1.0 / (eigenvalues + k)))


def _loss_gradients(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> nn.Module:
    net = copy.deepcopy(model).train()
    net.zero_grad()
    F.cross_entropy(net(images), labels).backward()
    return net


def _snip(net: nn.Module) -> float:
    return float(sum((w * w.grad).abs().sum().item() for w in _weights(net) if w.grad is not None))


def _grad_norm(net: nn.Module) -> float:
    return float(sum(w.grad.norm().item() for w in _weights(net) if w.grad is not None))


def snip(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    return _snip(_loss_gradients(model, images, labels))


def grad_norm(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    return _grad_norm(_loss_gradients(model, images, labels))


# Proxies of the loss's gradients: one backward pass serves them all.
_OF_GRADIENTS: Mapping[str, Callable[[nn.Module], float]] = {"snip": _snip, "grad_norm": _grad_norm}


Proxy = Callable[[nn.Module, torch.Tensor, torch.Tensor], float]
PROXIES: Mapping[str, Proxy] = {
    "synflow": synflow,
    "naswot": naswot,
    "jacob_cov": jacob_cov,
    "snip": snip,
    "grad_norm": grad_norm,
}


def proxy_scores(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    names: Sequence[str] = tuple(PROXIES),
) -> dict[str, float]:
    """Each named proxy of ``model`` (left untouched) on the batch ``images`` (float,
    normalized as the network trains on them) and ``labels``, with the seconds each took
    (``NAME_seconds``)."""
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            f"{type(model).__name__} has no trainable parameters: zero-cost proxies score a "
            "network's weights at initialization, and this one has none to score"
        )
    scores: dict[str, float] = {}
    gradients: nn.Module | None = None
    for name in names:
        start = time.perf_counter()
        if name in _OF_GRADIENTS:
            if gradients is None:  # charged to the first proxy that needs them
                gradients = _loss_gradients(model, images, labels)
            scores[name] = _OF_GRADIENTS[name](gradients)
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
