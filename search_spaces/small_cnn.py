"""A small CNN space: the autosearch twin of the NNI-written
``search_spaces.nni_examples.SmallCNN`` (same genes, same networks), used to compare
the two toolkits on the same work (benchmarks/vs_nni.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autosearch.architecture import Architecture
from autosearch.registry import register_space
from autosearch.space import Categorical, Domain, NetworkSpec, SearchSpace

__all__ = ["SmallCNNSpace"]

_OPS = ("conv3", "conv5", "skip")


@register_space("small-cnn")
@dataclass(frozen=True, kw_only=True)
class SmallCNNSpace(SearchSpace):
    """Genes: ``width`` in {8, 16, 32}, ``depth`` in {1, 2, 3}, ``op0``..``op2`` in
    {conv3, conv5, skip}. Operations of blocks beyond ``depth`` do not exist in the
    network, so canonicalization resets them (NNI's version keeps them as genes)."""

    def domains(self) -> Mapping[str, Domain]:
        return {
            "width": Categorical((8, 16, 32)),
            "depth": Categorical((1, 2, 3)),
            **{f"op{i}": Categorical(_OPS) for i in range(3)},
        }

    def canonicalize(self, arch: Architecture) -> Architecture:
        self.validate(arch)
        unused = [f"op{i}" for i in range(int(arch["depth"]), 3)]
        return self.reset(arch, unused)

    def network(
        self, arch: Architecture, *, input_shape: Sequence[int], num_classes: int
    ) -> NetworkSpec:
        self.validate(arch)
        depth = int(arch["depth"])
        return NetworkSpec(
            module="search_spaces._small_cnn_net",
            factory="SmallCNN",
            kwargs={
                "in_channels": int(input_shape[0]),
                "num_classes": num_classes,
                "width": int(arch["width"]),
                "ops": [str(arch[f"op{i}"]) for i in range(depth)],
            },
        )

    def describe(self, arch: Architecture) -> str:
        depth = int(arch["depth"])
        return f"small-cnn w{arch['width']} " + "-".join(str(arch[f"op{i}"]) for i in range(depth))
