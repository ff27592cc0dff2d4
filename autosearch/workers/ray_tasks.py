"""Workers as Ray tasks on a Ray cluster (:class:`RayExecutor`; ``pip install
'autosearch-nas[ray]'``): a head checked before connecting, CPUs and GPUs (fractional
for small candidates) asked per task, a lost task started again by Ray."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from autosearch._checks import check_fields, real, whole
from autosearch.errors import ConfigError, PlatformError
from autosearch.training import placement
from autosearch.training.placement import Need
from autosearch.workers import _ray_connect
from autosearch.workers._executor import POLL_SECONDS, Call, require_extra

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayExecutor:
    """Each worker a Ray task with these resources; Ray places the tasks on the
    cluster's nodes and runs a task again (``max_retries``) when its worker process or
    node dies. ``num_gpus`` may be fractional, so that several small candidates share
    one GPU. ``address``: the cluster (None: ``RAY_ADDRESS``, else a local one);
    ``env_vars``: environment variables the workers get (object-store credentials,
    ``AUTOSEARCH_HEARTBEAT_GRACE``; a Ray node otherwise has its own environment);
    ``init`` is passed on to ``ray.init`` when this process has not joined a cluster
    yet (``_node_ip_address``, ``runtime_env``, ...).

    ``num_gpus="auto"``: the placement rule's fraction, ``1 / per_gpu``, with
    ``per_gpu`` given or from a trial's size and the free memory of a GPU of the cluster
    (read by one task on a GPU node); 0 on a cluster without GPUs."""

    address: str | None = None
    num_cpus: float = 1
    num_gpus: float | Literal["auto"] = 0
    max_retries: int = 3
    env_vars: dict[str, str] = field(default_factory=dict)
    init: dict[str, Any] = field(default_factory=dict)
    per_gpu: int | None = None
    _resolved: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        auto = self.num_gpus == "auto"
        check_fields(
            "RayExecutor",
            self,
            [
                ("num_gpus", lambda v: v == "auto" or real(0)(v), "a number >= 0, or 'auto'"),
                ("per_gpu", lambda v: v is None or whole(1)(v), "None or a whole number >= 1"),
            ],
        )
        if self.per_gpu is not None and not auto:
            raise ConfigError(
                f"per_gpu={self.per_gpu} sets the GPU fraction only with num_gpus='auto'; "
                f"drop one (num_gpus={self.num_gpus!r} is what each worker asks for)"
            )

    @property
    def gpus_per_worker(self) -> float:
        """What each worker asks Ray for: ``num_gpus``, or the rule's fraction once
        :meth:`resources` resolved ``"auto"``."""
        if self.num_gpus != "auto":
            return float(self.num_gpus)
        if "num_gpus" not in self._resolved:
            raise ConfigError("num_gpus='auto' is resolved by resources() before map()")
        return self._resolved["num_gpus"]

    def map(
        self, worker: Callable[..., Any], calls: Sequence[Call], poll: Callable[[], None]
    ) -> list[Any]:
        ray = self._connect()
        self._check_fits(ray)
        task = ray.remote(
            num_cpus=self.num_cpus,
            num_gpus=self.gpus_per_worker,
            max_retries=self.max_retries,
            runtime_env={"env_vars": dict(self.env_vars)} if self.env_vars else None,
        )(worker)
        refs = [task.remote(**call) for call in calls]
        pending = list(refs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_SECONDS)
            poll()
        try:
            return list(ray.get(refs))
        except ray.exceptions.RayError as exc:
            missing = re.search(r"No module named '([^']+)'", str(exc))
            if missing is None:
                raise
            raise ConfigError(
                f"a Ray worker cannot import module {missing.group(1)!r}, which its call "
                "needs (the study's evaluator, say): install it on every node, or send it "
                "with the call (a script's functions travel by value; for a module: "
                "ray.cloudpickle.register_pickle_by_value(module))"
            ) from None

    def resources(self, n_workers: int, need: Callable[[], Need]) -> tuple[int, list[int | None]]:
        if self.num_gpus == "auto":
            self._resolved["num_gpus"] = self._fraction(self._connect(), need)
        return max(1, int(self.num_cpus)), [None] * n_workers  # Ray sets each task's GPUs

    def _connect(self) -> Any:
        ray = require_extra("ray", "ray")
        # Where a Ray worker dies, the driver prints the cluster's message through Ray's
        # progress-bar manager, which replaces ``builtins.print`` for the rest of this
        # process (the user's): Ray's own switch keeps the user's print, unless the user
        # set it.
        os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
        if not ray.is_initialized():
            address = self.address or os.environ.get("RAY_ADDRESS")
            _ray_connect.check_head(address)
            _ray_connect.check_token(address)
            try:
                ray.init(address=self.address, **{"log_to_driver": False, **self.init})
            except Exception as exc:
                if not _ray_connect.token_refused(exc):
                    raise
                advice = _ray_connect.token_advice(address or "the local cluster")
                raise PlatformError(advice) from None
        return ray

    def _fraction(self, ray: Any, need: Callable[[], Need]) -> float:
        """The placement rule's GPU fraction on this cluster (0 where it has no GPU)."""
        if ray.cluster_resources().get("GPU", 0) < 1:
            return 0.0
        if self.per_gpu is not None:
            return 1 / self.per_gpu
        free = ray.get(ray.remote(num_gpus=1, num_cpus=0)(_free_gpu_memory).remote())
        return 1 / placement.per_gpu(need(), free)

    def _check_fits(self, ray: Any) -> None:
        """Refuse workers no node of the cluster can run (Ray would wait for such a node
        forever, silently)."""
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        gpus = self.gpus_per_worker
        if any(n.get("CPU", 0) >= self.num_cpus and n.get("GPU", 0) >= gpus for n in nodes):
            return
        largest = (
            ", ".join(f"{n.get('CPU', 0):g} CPUs and {n.get('GPU', 0):g} GPUs" for n in nodes)
            or "no live node"
        )
        raise ConfigError(
            f"each worker asks Ray for {self.num_cpus:g} CPUs and {gpus:g} GPUs, but "
            f"no node of the cluster has that (its nodes: {largest}); lower num_cpus / "
            "num_gpus of the RayExecutor, or add a node that has them"
        )


def _free_gpu_memory() -> int:
    """On a Ray GPU node, in a task given one GPU: its free memory, in bytes."""

    return int(torch.cuda.mem_get_info()[0])
