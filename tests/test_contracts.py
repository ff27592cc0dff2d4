"""The shipped contracts, run over every registered space and controller."""

from __future__ import annotations

import pytest
from _controllers import registered_controller

from autosearch.registry import controllers, spaces
from autosearch.testing import ControllerContract, SpaceContract
from controllers import Reinforce
from search_spaces import ResNetSpace


@pytest.fixture(params=spaces.names())
def registered_space(request):
    cls = spaces.get(request.param)
    if reason := cls.unavailable():  # an optional extra (NNI) not installed here
        pytest.skip(reason)
    return cls.example()


class TestEverySpace(SpaceContract):
    @pytest.fixture
    def space(self, registered_space):
        return registered_space


class TestEveryController(ControllerContract):
    @pytest.fixture
    def space(self):
        return ResNetSpace()

    @pytest.fixture(params=controllers.names())
    def make_controller(self, request, space):
        return lambda seed: registered_controller(request.param, space, seed)


def test_registries_list_the_plugins():
    assert "resnet" in spaces.names()
    assert "random" in controllers.names()


class TestTransformerPolicy(ControllerContract):
    """REINFORCE's Transformer policy passes the contract the LSTM passes."""

    @pytest.fixture
    def space(self):
        return ResNetSpace()

    @pytest.fixture
    def make_controller(self, space):
        return lambda seed: Reinforce(space, seed=seed, policy="transformer")
