"""The SearchSpace and Controller contracts as pytest test classes.

A test class that inherits one of these and provides the fixtures it names runs
every check on its plugin; autosearch's own suite runs them over every registered
space and controller.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
from collections.abc import Callable

import numpy as np
import pytest
import torch

from autosearch.architecture import Architecture
from autosearch.controller import Controller, Outcome
from autosearch.errors import InvalidArchitectureError
from autosearch.space import SearchSpace

__all__ = ["ControllerContract", "SpaceContract"]

_SAMPLES = 20
_ALLOWED_MODEL_IMPORTS = {"torch", "math", "collections", "typing", "__future__", "functools"}


class SpaceContract:
    """Checks for a ``space`` fixture returning a SearchSpace."""

    input_shape: tuple[int, int, int] = (1, 8, 8)
    num_classes: int = 10

    def _samples(self, space: SearchSpace, seed: int = 0, n: int = _SAMPLES) -> list[Architecture]:
        rng = np.random.default_rng(seed)
        return [space.sample(rng) for _ in range(n)]

    def test_has_a_name_and_domains(self, space: SearchSpace) -> None:
        assert space.name, "register the space (register_space) so it has a name"
        domains = space.domains()
        assert domains and list(domains) == list(space.domains()), (
            "domains() must be non-empty and stable"
        )
        for gene, domain in domains.items():
            assert isinstance(gene, str) and len(domain.values()) >= 1

    def test_config_rebuilds_the_space(self, space: SearchSpace) -> None:
        config = json.loads(json.dumps(space.config()))
        again = type(space)(**config)
        assert again.config() == space.config()
        assert list(again.domains()) == list(space.domains())

    def test_samples_are_valid_canonical_and_round_trip(self, space: SearchSpace) -> None:
        for arch in self._samples(space):
            space.validate(arch)
            assert space.canonicalize(arch) == arch
            again = Architecture.from_json(arch.to_json())
            assert again == arch and again.arch_id == arch.arch_id and hash(again) == hash(arch)

    def test_sampling_is_seeded(self, space: SearchSpace) -> None:
        assert self._samples(space, seed=3) == self._samples(space, seed=3)

    def test_mutate_gives_a_different_valid_network(self, space: SearchSpace) -> None:
        rng = np.random.default_rng(1)
        for arch in self._samples(space, n=10):
            child = space.mutate(arch, rng)
            space.validate(child)
            assert child != arch and space.canonicalize(child) == child

    def test_encode_has_fixed_length(self, space: SearchSpace) -> None:
        vectors = [space.encode(a) for a in self._samples(space)]
        assert {v.shape for v in vectors} == {(len(space.domains()),)}
        assert all(np.all((v >= 0) & (v <= 1)) for v in vectors)

    def test_describe_is_one_line(self, space: SearchSpace) -> None:
        for arch in self._samples(space, n=5):
            text = space.describe(arch)
            assert text and "\n" not in text

    def test_samples_build_and_run(self, space: SearchSpace) -> None:
        x = torch.randn(2, *self.input_shape)
        for arch in self._samples(space, n=3):
            model = space.build(arch, input_shape=self.input_shape, num_classes=self.num_classes)
            model.eval()
            with torch.no_grad():
                out = model(x)
            assert out.shape == (2, self.num_classes) and torch.isfinite(out).all()

    def test_validate_names_the_bad_gene(self, space: SearchSpace) -> None:
        arch = self._samples(space, n=1)[0]
        gene = next(iter(space.domains()))
        with pytest.raises(InvalidArchitectureError, match=re.escape(repr(gene))):
            space.validate(arch.replace(**{gene: "no-such-value"}))
        with pytest.raises(InvalidArchitectureError, match="no_such_gene"):
            space.validate(arch.replace(no_such_gene=1))
        with pytest.raises(InvalidArchitectureError, match="space"):
            space.validate(Architecture(space=space.name + "-other", genes=dict(arch)))

    def test_network_file_imports_only_torch(self, space: SearchSpace) -> None:
        arch = self._samples(space, n=1)[0]
        spec = space.network(arch, input_shape=self.input_shape, num_classes=self.num_classes)
        tree = ast.parse(inspect.getsource(importlib.import_module(spec.module)))
        imported = {
            (alias.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        allowed = _ALLOWED_MODEL_IMPORTS | set(space.network_needs)
        assert imported <= allowed, f"{spec.module} imports {imported}"


def _reward(space: SearchSpace, arch: Architecture) -> Outcome:
    """A deterministic, architecture-dependent outcome for driving controllers."""
    score = float(np.mean(space.encode(arch)))
    return Outcome(reward=score, objectives={"accuracy": score, "flops": 1.0 + score})


class ControllerContract:
    """Checks for fixtures ``space`` and ``make_controller`` (``seed -> Controller``)."""

    def _run(self, controller: Controller, steps: int) -> list[Architecture]:
        asked = []
        for _ in range(steps):
            arch = controller.ask()
            asked.append(arch)
            controller.tell(arch, _reward(controller.space, arch))
        return asked

    def test_asks_are_valid_architectures(
        self, space: SearchSpace, make_controller: Callable[[int], Controller]
    ) -> None:
        controller = make_controller(0)
        assert controller.name and controller.space is space
        for arch in self._run(controller, 8):
            space.validate(arch)
            assert space.canonicalize(arch) == arch

    def test_several_asks_before_any_tell_are_distinct(
        self, space: SearchSpace, make_controller: Callable[[int], Controller]
    ) -> None:
        controller = make_controller(0)
        pending = [controller.ask() for _ in range(5)]
        assert len(set(pending)) == len(pending)
        for arch in pending:
            controller.tell(arch, _reward(space, arch))

    def test_tell_accepts_foreign_and_failed_outcomes(
        self, space: SearchSpace, make_controller: Callable[[int], Controller]
    ) -> None:
        controller = make_controller(0)
        rng = np.random.default_rng(123)
        for i in range(6):
            arch = space.sample(rng)
            outcome = Outcome.failed("out of memory") if i % 3 == 0 else _reward(space, arch)
            controller.tell(arch, outcome)
        space.validate(controller.ask())

    def test_same_seed_same_decisions(
        self, space: SearchSpace, make_controller: Callable[[int], Controller]
    ) -> None:
        assert self._run(make_controller(7), 10) == self._run(make_controller(7), 10)

    def test_state_dict_restores_future_decisions(
        self, space: SearchSpace, make_controller: Callable[[int], Controller]
    ) -> None:
        original = make_controller(5)
        self._run(original, 6)
        state = json.loads(json.dumps(original.state_dict()))  # must survive JSON
        restored = make_controller(99)
        restored.load_state_dict(state)
        assert self._run(restored, 6) == self._run(original, 6)

    def test_a_studys_saved_state_and_its_architectures_restore_future_decisions(
        self, space: SearchSpace, make_controller: Callable[[int], Controller]
    ) -> None:
        """A study saves the state without the :attr:`Controller.seen_state` keys and,
        when it opens, marks its trials' architectures seen: the same decisions follow."""
        original = make_controller(5)
        asked = self._run(original, 12)
        state = {k: v for k, v in original.state_dict().items() if k not in original.seen_state}
        restored = make_controller(99)
        restored.load_state_dict(json.loads(json.dumps(state)))
        restored.mark_seen(arch.arch_id for arch in asked)
        assert self._run(restored, 6) == self._run(original, 6)

    def test_config_rebuilds_the_controller(
        self, space: SearchSpace, make_controller: Callable[[int], Controller]
    ) -> None:
        controller = make_controller(3)
        config = json.loads(json.dumps(controller.config()))
        again = type(controller)(space, **config)
        assert again.config() == controller.config()
        assert self._run(again, 4) == self._run(make_controller(3), 4)

    def test_reseeded_workers_propose_differently(
        self, space: SearchSpace, make_controller: Callable[[int], Controller]
    ) -> None:
        """Parallel workers load the same state, then each takes a stream of its own:
        their next proposals must differ, and a stream's must be repeatable."""
        state = json.loads(json.dumps(make_controller(4).state_dict()))
        workers = []
        for stream in (1, 2, 1):
            worker = make_controller(4)
            worker.load_state_dict(state)
            worker.reseed(stream)
            workers.append([worker.ask() for _ in range(3)])
        assert workers[0] != workers[1]
        assert workers[0] == workers[2]
        resumed = make_controller(4)
        resumed.load_state_dict(json.loads(json.dumps(worker.state_dict())))
        assert resumed.ask() == worker.ask()  # the stream travels in the state
