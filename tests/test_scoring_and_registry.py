from __future__ import annotations

import numpy as np
import pytest
import torch.nn as nn

from autosearch import UnknownNameError
from autosearch.registry import Registry, controllers, spaces
from autosearch.scoring import objective, pareto_mask, reward
from autosearch.scoring.cost import measure


def test_pareto_mask_on_hand_made_points():
    # (accuracy ↑, flops ↓)
    points = np.array([[0.90, 10], [0.95, 20], [0.93, 30], [0.95, 20], [0.80, 5], [0.80, 6]])
    mask = pareto_mask(points, ["maximize", "minimize"])
    assert mask.tolist() == [True, True, False, True, True, False]
    assert pareto_mask(np.array([[1.0, 1.0]]), ["minimize", "minimize"]).tolist() == [True]
    with pytest.raises(ValueError):
        pareto_mask(points, ["maximize"])


def test_objectives_and_rewards_by_name():
    assert objective("flops").direction == "minimize"
    assert reward("accuracy", {"accuracy": 0.9, "flops": 3.0}) == 0.9
    with pytest.raises(UnknownNameError, match="Did you mean 'flops'"):
        objective("flop")
    with pytest.raises(UnknownNameError, match="Did you mean 'accuracy'"):
        reward("acuracy", {})


def test_unknown_plugin_names_suggest_close_matches():
    with pytest.raises(
        UnknownNameError, match="unknown search space 'resnt'. Did you mean 'resnet'"
    ):
        spaces.get("resnt")
    with pytest.raises(UnknownNameError, match="Did you mean 'random'"):
        controllers.get("randm")


def test_registry_refuses_a_second_class_under_a_taken_name():
    registry: Registry[type] = Registry("thing", group="autosearch.test-things")

    @registry.register("a")
    class A:
        pass

    with pytest.raises(ValueError, match="already registered"):

        @registry.register("a")
        class B:
            pass

    assert registry.get("a") is A and registry.names() == ["a"] and A.name == "a"


def test_cost_counts_conv_and_linear_macs_exactly():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8),
        nn.Flatten(),
        nn.Linear(8 * 16, 4),
    )
    cost = measure(model.train(), (3, 4, 4))
    macs = 3 * 8 * 9 * 16 + 8 * 9 * 16 + 8 * 16 * 4
    assert (cost.macs, cost.flops) == (macs, 2 * macs)
    assert cost.params == sum(p.numel() for p in model.parameters())
    assert model.training  # mode restored
