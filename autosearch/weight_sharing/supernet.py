"""Weight sharing: one supernet trained once on the shared stack, its subnets
evaluated in a fraction of a second each (Once-for-All, Cai et al. 2020; BigNAS, Yu et
al. 2020).

The space plugin owns its elastic network (``space.supernet(...)``, an elastic space
whose ``build_supernet`` makes the module, see search_spaces.elastic); this module owns
how a supernet is trained and how a subnet is evaluated:

* **Training** (:func:`train_supernet`) is :func:`autosearch.training.train.train` (its
  optimizer, schedule, AMP, DDP, per-epoch checkpoints and resume) with a criterion that
  applies the *sandwich rule*: each step trains the largest subnet on the labels, then
  the smallest and ``sandwich`` random ones, each on the largest's soft predictions
  (*in-place distillation*), and steps once on the summed loss. With
  ``schedule="progressive"`` the elastic genes unlock in OFA's order over the epochs
  (the largest alone first, then kernel sizes, depths, then widths and expansions).
* **Evaluation** (:class:`SubnetEvaluator`): a subnet inherits its slices of the
  weights as an ordinary network of the space, its batch-norm statistics are
  recalibrated on a few hundred training images (the supernet's running statistics
  mix every subnet's), and it is scored on the validation split.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from autosearch._files import tensors_digest
from autosearch.architecture import Architecture
from autosearch.data import Dataset, Split
from autosearch.errors import ConfigError, require
from autosearch.space import SearchSpace
from autosearch.training.precise_bn import recompute_statistics
from autosearch.training.runtime import Runtime
from autosearch.training.train import EpochResult, TrainConfig, TrainResult, evaluate, train

__all__ = [
    "ElasticSpaceLike",
    "Sandwich",
    "SubnetEvaluator",
    "SupernetConfig",
    "fingerprint",
    "no_autotuning",
    "recalibrate",
    "train_supernet",
    "weights_digest",
]

# OFA's order of unlocking elastic genes in progressive shrinking (by the gene's last
# part); genes of other kinds unlock last, with the widths.
_PROGRESSIVE = (("kernel",), ("depth",), ("width", "expansion", "se"))
_SCHEDULES = ("sandwich", "progressive", "uniform", "fair")


@runtime_checkable
class ElasticSpaceLike(Protocol):
    """What the core needs of an elastic space (search_spaces.elastic.ElasticSpace)."""

    elastic: tuple[str, ...]

    def largest(self) -> Architecture: ...

    def smallest(self) -> Architecture: ...

    def build_supernet(self, *, input_shape: Any, num_classes: int) -> nn.Module: ...

    def fingerprint(self) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True)
class SupernetConfig:
    """How a study's supernet is trained and its subnets evaluated.

    Attributes:
        train: How the supernet trains (None: the study's TrainConfig). Each step
            costs about ``2 + sandwich`` forward and backward passes of subnets.
        sandwich: Random subnets per step, besides the largest and the smallest.
        distill: Train the other subnets on the largest's soft predictions (in-place
            distillation) rather than on the labels.
        schedule: Which subnets each step trains. ``"sandwich"``: the largest, the
            smallest and ``sandwich`` random ones, every elastic gene from the first
            epoch (BigNAS); ``"progressive"``: the same, genes unlocked in OFA's order
            (progressive shrinking); ``"uniform"``: ``paths`` subnets drawn uniformly,
            each on the labels (single-path one-shot, SPOS: the rule for spaces whose
            genes are choices of operation, NAS-Bench-201's); ``"fair"``: FairNAS's
            strict fairness, as many subnets as a gene has choices, together using
            each choice of every gene exactly once, each on the labels, one update.
        paths: With ``schedule="uniform"``, the subnets each step trains.
        calibration_images: Training images a subnet's batch-norm statistics are
            recalibrated on before it is evaluated.
        eval_images: Validation (and test) images each subnet is scored on; 0: all.
        test_accuracy: Also score each subnet on the test split (for reports only; off
            halves an evaluation's cost).
        latency: Give each subnet its CPU latency (batch 1 and 32), as trials do
            (predicted from the lookup table, or timed: ``Compression.latency``).
        weights: A trained supernet's weights (``study.supernet.save(path)`` of another
            study of the same supernet) to use instead of training one: one supernet
            serves studies of several budgets.
    """

    train: TrainConfig | None = None
    sandwich: int = 2
    distill: bool = True
    schedule: Literal["sandwich", "progressive", "uniform", "fair"] = "sandwich"
    paths: int = 1
    calibration_images: int = 256
    eval_images: int = 0
    test_accuracy: bool = True
    latency: bool = True
    weights: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.train, Mapping):  # from a stored study
            object.__setattr__(self, "train", TrainConfig(**self.train))
        require(
            self.train is None or isinstance(self.train, TrainConfig),
            "SupernetConfig train",
            self.train,
            "a TrainConfig or None (the study's)",
        )
        for name in ("distill", "test_accuracy", "latency"):
            value = getattr(self, name)
            require(isinstance(value, bool), f"SupernetConfig {name}", value, "True or False")
        for name, least in (
            ("sandwich", 0),
            ("paths", 1),
            ("calibration_images", 1),
            ("eval_images", 0),
        ):
            value = getattr(self, name)
            require(
                isinstance(value, int) and not isinstance(value, bool) and value >= least,
                f"SupernetConfig {name}",
                value,
                f"an integer >= {least}",
            )
        require(
            self.weights is None or (isinstance(self.weights, str) and bool(self.weights)),
            "SupernetConfig weights",
            self.weights,
            "None or the path of a supernet's weights (study.supernet.save(path))",
        )
        require(
            self.schedule in _SCHEDULES,
            "SupernetConfig schedule",
            self.schedule,
            "'sandwich', 'progressive', 'uniform' or 'fair'",
        )

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))


def fingerprint(space: ElasticSpaceLike, input_shape: Any, num_classes: int) -> str:
    """A short hash of what a supernet's weights are for: its space (genes, fixed
    values, options; not its budget) and the images and classes it was built for."""
    what = {"space": space.fingerprint(), "input": list(input_shape), "classes": num_classes}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def weights_digest(state: Mapping[str, torch.Tensor]) -> str:
    """A content hash of a supernet's weights (names, dtypes, shapes and values), so
    that a trial records which weights scored it and an export can tell whether the
    study's supernet is still those weights."""
    return tensors_digest(state)


def _elastic_space(space: SearchSpace) -> ElasticSpaceLike:
    if not isinstance(space, ElasticSpaceLike):
        raise ConfigError(
            f"space {space.name!r} has no supernet: weight sharing searches the elastic part "
            "of a space, e.g. MobileNetSpace(...).supernet(elastic=(...)) or ResNetSpace(...)"
            ".supernet()"
        )
    return space


class Sandwich(nn.Module):
    """The supernet as it trains under the sandwich rule with in-place distillation
    (see the module docstring): the model :func:`autosearch.training.train.train` steps, with
    :meth:`loss` as its criterion.

    In training, ``forward`` runs the largest subnet, then the smallest and
    ``sandwich`` random ones, and returns their logits stacked (largest first): one
    forward pass holds the whole step, so DDP sees every subnet's use of the weights
    (each step runs another part of the supernet: :attr:`find_unused_parameters`). In
    evaluation it runs the largest subnet alone: with ``calibration`` images, a copy of
    it whose batch-norm statistics are recalibrated on them (the supernet's own
    statistics, averaged over every subnet trained, say little of any one subnet; the
    copy leaves them, and so the checkpoints, untouched). Subnets are drawn from torch's
    global generator, which :func:`train_supernet` seeds and training checkpoints and
    restores, so a run repeats and a resumed run draws the same ones; under torchrun
    every rank draws the same."""

    find_unused_parameters = True  # read by autosearch.training.train when it wraps DDP

    def __init__(
        self,
        net: nn.Module,
        space: ElasticSpaceLike,
        config: SupernetConfig,
        *,
        epochs: int,
        label_smoothing: float = 0.0,
        calibration: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.net, self.space, self.config = net, space, config
        self.calibration = calibration  # normalised training images (None: no recalibration)
        self._recalibrated: nn.Module | None = None  # the largest subnet, evaluated
        self.epochs, self.label_smoothing = epochs, label_smoothing
        self.largest, self.smallest = space.largest(), space.smallest()
        self.unlocked: tuple[str, ...] = tuple(space.elastic)
        self.trained: list[Architecture] = []  # the subnets of the last step, largest first

    def set_epoch(self, epoch: int) -> None:
        """Progressive shrinking: unlock the elastic genes of this epoch's phase."""
        if self.config.schedule != "progressive":
            return
        groups = [g for g in _phases(self.space.elastic) if g]
        phase = min(len(groups), (epoch - 1) * (len(groups) + 1) // self.epochs)
        self.unlocked = tuple(gene for group in groups[:phase] for gene in group)

    def _draw(self, rng: np.random.Generator) -> Architecture:
        domains = self.space.domains()  # type: ignore[attr-defined]
        genes = {
            g: (domains[g].sample(rng) if g in self.unlocked else self.largest[g])
            for g in self.space.elastic
        }
        return self.space.make(genes)  # type: ignore[attr-defined,no-any-return]

    def subnets(self) -> list[Architecture]:
        """This step's subnets besides the largest (the sandwich rules): the smallest
        (of the unlocked genes), then ``sandwich`` random ones."""
        if not self.unlocked:
            return []
        smallest = self.space.make(  # type: ignore[attr-defined]
            {g: self.smallest[g] if g in self.unlocked else self.largest[g] for g in self.largest}
        )
        rng = self._rng()
        return [smallest, *(self._draw(rng) for _ in range(self.config.sandwich))]

    def step(self) -> list[Architecture]:
        """The subnets this step trains, in order (see SupernetConfig.schedule)."""
        rule = self.config.schedule
        if rule == "uniform":
            rng = self._rng()
            return [self._draw(rng) for _ in range(self.config.paths)]
        if rule == "fair":
            return self._fair(self._rng())
        return [self.largest, *self.subnets()]

    def _fair(self, rng: np.random.Generator) -> list[Architecture]:
        """FairNAS's strict fairness: m subnets (m: the most choices of any gene), the
        k-th taking each gene's k-th choice of a fresh permutation of its choices."""
        domains = self.space.domains()  # type: ignore[attr-defined]
        choices = {g: list(domains[g].values()) for g in self.space.elastic}
        m = max(len(values) for values in choices.values())
        orders = {
            g: [values[i % len(values)] for i in rng.permutation(m)]
            for g, values in choices.items()
        }
        return [self.space.make({g: orders[g][k] for g in orders}) for k in range(m)]  # type: ignore[attr-defined]

    def _rng(self) -> np.random.Generator:
        """A generator for this step's draws, from torch's global one (seeded by the
        trainer, checkpointed, the same on every rank)."""
        return np.random.default_rng(int(torch.randint(0, 2**31 - 1, ()).item()))

    def train(self, mode: bool = True) -> Sandwich:
        if mode:
            self._recalibrated = None  # the weights move on: recalibrate at the next eval
        return super().train(mode)

    def _largest(self) -> nn.Module:
        """The largest subnet as evaluated: the supernet itself, or a copy recalibrated
        on the calibration images (made once per evaluation)."""
        if self.calibration is None:
            return self.net
        if self._recalibrated is None:
            copy_ = copy.deepcopy(self.net)
            device = next(self.net.parameters()).device
            recalibrate(copy_, self.calibration.to(device))
            self._recalibrated = copy_.eval()
        return self._recalibrated

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return self._largest()(x)  # type: ignore[no-any-return]  # largest (active)
        step, outputs = self.step(), []
        try:
            for arch in step:
                self.net.activate(arch)  # type: ignore[operator]
                outputs.append(self.net(x))
        finally:
            self.net.activate(self.largest)  # type: ignore[operator]
        self.trained = step
        return torch.stack(outputs)

    def loss(self, outputs: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The step's loss (the criterion of :func:`autosearch.training.train.train`).
        Sandwich rules: the largest subnet's on the labels, plus each other's on the
        largest's soft predictions (in-place distillation) or on the labels. Uniform and
        fair: every subnet's on the labels, summed (one update for all of them)."""
        if self.config.schedule in ("uniform", "fair"):
            losses = [
                F.cross_entropy(out, y, label_smoothing=self.label_smoothing) for out in outputs
            ]
            return torch.stack(losses).sum()
        largest = outputs[0]
        loss = F.cross_entropy(largest, y, label_smoothing=self.label_smoothing)
        teacher = largest.detach().float().softmax(1)
        for out in outputs[1:]:
            if self.config.distill:
                loss = loss + torch.sum(-teacher * out.float().log_softmax(1), 1).mean()
            else:
                loss = loss + F.cross_entropy(out, y, label_smoothing=self.label_smoothing)
        return loss


def _phases(elastic: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The elastic genes grouped in progressive shrinking's order."""
    kinds = [set(kind) for kind in _PROGRESSIVE]
    groups: list[list[str]] = [[] for _ in kinds]
    for gene in elastic:
        part = gene.rsplit(".", 1)[-1]
        index = next((i for i, kind in enumerate(kinds) if part in kind), len(kinds) - 1)
        groups[index].append(gene)
    return [tuple(g) for g in groups]


def train_supernet(
    net: nn.Module,
    space: SearchSpace,
    data: Dataset,
    config: TrainConfig,
    supernet: SupernetConfig,
    *,
    seed: int,
    checkpoint: Any = None,
    on_epoch: Callable[[EpochResult], None] | None = None,
    runtime: Runtime | None = None,
) -> TrainResult:
    """Train ``net`` (``space.build_supernet(...)``) in place with the sandwich rule;
    :func:`autosearch.training.train.train` does the rest (checkpoints every epoch,
    resume, AMP, DDP). The per-epoch validation accuracy is the largest subnet's, its
    batch norm recalibrated on the calibration images as every subnet's is when scored.
    The subnets each step draws come from a generator seeded with ``seed``: two runs of
    the same settings train the same supernet."""
    elastic = _elastic_space(space)
    sandwich = Sandwich(
        net,
        elastic,
        supernet,
        epochs=config.epochs,
        label_smoothing=config.label_smoothing,
        calibration=calibration_images(data, supernet, torch.Generator().manual_seed(seed)),
    )
    net.activate(elastic.largest())  # type: ignore[operator]
    with torch.random.fork_rng(devices=[]):  # seeded here; the caller's stream untouched
        torch.manual_seed(seed)
        return train(
            sandwich,
            data,
            config,
            seed=seed,
            on_epoch=on_epoch,
            checkpoint=checkpoint,
            runtime=runtime,
            criterion=sandwich.loss,
        )


def calibration_images(
    data: Dataset, config: SupernetConfig, generator: torch.Generator
) -> torch.Tensor:
    """The ``config.calibration_images`` training images (normalised) a subnet's batch
    norm is recalibrated on, drawn with ``generator`` (seeded: the same for every
    subnet)."""
    count = min(config.calibration_images, len(data.train))
    pick = torch.randperm(len(data.train), generator=generator)[:count]
    return data.normalize(data.train.take(pick))


@torch.no_grad()
def recalibrate(model: nn.Module, images: torch.Tensor, *, batch_size: int = 256) -> None:
    """Recompute a subnet's batch-norm running statistics on ``images`` (normalised), in
    batches of ``batch_size`` (autosearch.training.precise_bn.recompute_statistics)."""
    recompute_statistics(model, images.split(batch_size))


class SubnetEvaluator:
    """Scores subnets of a trained supernet (see the module docstring): each inherits
    its weights, its batch-norm statistics are recalibrated on ``calibration_images``
    training images (the same ones for every subnet), and it is evaluated on
    ``eval_images`` validation and test images (a seeded draw, the same for every
    subnet; all when 0). ``digest``: the content hash of the supernet's weights
    (:func:`weights_digest`), which every trial it scores records.

    Everything a subnet's evaluation reads lives on ``device`` from the start: the
    supernet, the calibration images and the evaluation images (held in memory), so a
    subnet costs its slicing and its arithmetic; on a GPU, cuDNN's autotuner is off while
    a subnet runs (each subnet brings shapes of its own, tuned once and never again)."""

    def __init__(
        self,
        net: nn.Module,
        space: SearchSpace,
        data: Dataset,
        config: SupernetConfig,
        *,
        seed: int,
        digest: str = "",
        device: torch.device | str = "cpu",
    ) -> None:
        self.space, self.data, self.config = _elastic_space(space), data, config
        self.digest = digest  # of the supernet's weights: each trial records it
        self.device = torch.device(device)
        self.net = net.to(self.device).eval()
        generator = torch.Generator().manual_seed(seed)
        self.calibration = calibration_images(data, config, generator).to(self.device)
        self.val = _resident(_subset(data.val, config.eval_images, generator), self.device)
        self.test = _resident(_subset(data.test, config.eval_images, generator), self.device)

    def subnet(self, arch: Architecture) -> nn.Module:
        """``arch``'s ordinary network with inherited weights and recalibrated batch-norm
        statistics, in eval mode (on the evaluator's device)."""
        with no_autotuning():
            model = self.net.subnet(arch)  # type: ignore[operator]
            recalibrate(model, self.calibration)
        return model.eval()

    def evaluate(self, arch: Architecture) -> tuple[nn.Module, dict[str, float]]:
        """``arch``'s subnet and its validation and test accuracy (on the evaluation
        images)."""
        model = self.subnet(arch)
        with no_autotuning():
            accuracy, loss = evaluate(model, self.val, self.data)
            metrics = {"accuracy": accuracy, "val_loss": loss if math.isfinite(loss) else math.inf}
            if self.config.test_accuracy:
                metrics["test_accuracy"] = evaluate(model, self.test, self.data)[0]
        return model, metrics


@contextlib.contextmanager
def no_autotuning() -> Iterator[None]:
    """cuDNN's autotuner off inside the block (as it was, after): a subnet's shapes are
    its own, met once, and tuned for nothing (off CUDA the flag does nothing)."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def _resident(split: Any, device: torch.device) -> Any:
    """An in-memory split on ``device`` (a streamed one stays with its files)."""
    if device.type == "cpu" or not getattr(split, "in_memory", False):
        return split
    return Split(x=split.x.to(device), y=split.y.to(device))


def _subset(split: Any, count: int, generator: torch.Generator) -> Any:
    if not count or count >= len(split):
        return split
    pick = torch.randperm(len(split), generator=generator)[:count]
    return Split(x=split.take(pick), y=split.y[pick])
