"""Contract tests that every search space and controller must pass.

Use them for your own plugins::

    from autosearch.testing import ControllerContract, SpaceContract

    class TestMySpace(SpaceContract):
        @pytest.fixture
        def space(self):
            return MySpace()

    class TestMyController(ControllerContract):
        @pytest.fixture
        def space(self):
            return MySpace()

        @pytest.fixture
        def make_controller(self, space):
            return lambda seed: MyController(space, seed=seed)
"""

from autosearch.testing.contracts import ControllerContract, SpaceContract

__all__ = ["ControllerContract", "SpaceContract"]
