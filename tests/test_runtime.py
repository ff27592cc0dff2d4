"""The process group follows the run's device; ranks never share a GPU (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from autosearch.errors import ConfigError
from autosearch.training.runtime import backend_for


@pytest.mark.parametrize(
    ("device", "ranks", "gpus", "backend"),
    [
        ("cpu", 2, 0, "gloo"),
        ("cpu", 4, 8, "gloo"),  # a CPU run on a GPU machine: gloo, not nccl
        ("cuda:0", 1, 1, "nccl"),
        ("cuda", 8, 8, "nccl"),
        ("mps", 1, 0, "gloo"),
    ],
)
def test_the_backend_follows_the_device(device, ranks, gpus, backend):
    assert backend_for(torch.device(device), ranks, gpus) == backend


def test_more_ranks_than_gpus_is_refused_with_what_to_do():
    with pytest.raises(ConfigError, match=r"4 processes .* 2 GPU\(s\): use --nproc-per-node 2"):
        backend_for(torch.device("cuda"), 4, 2)
