"""Plugins found by installation: a package that declares an ``autosearch.spaces`` or
``autosearch.controllers`` entry point is found by a process that never imports it,
whether the entry point names a module (whose classes register themselves) or a class
(registered under the entry point's name); one that cannot load is named in one line."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN = textwrap.dedent(
    """
    from autosearch.registry import register_space
    from search_spaces import ResNetSpace
    from controllers import RandomSearch


    @register_space("tiny-resnet")
    class TinyResNet(ResNetSpace):
        def __init__(self, **kwargs):
            kwargs.setdefault("max_stages", 1)
            super().__init__(**kwargs)


    class Wanderer(RandomSearch):
        '''A controller registered by its entry point's name.'''
    """
)


def _install(site: Path, entry_points: str) -> None:
    """A distribution in ``site`` as pip would leave it: its module and its metadata."""
    (site / "my_plugin.py").write_text(PLUGIN)
    info = site / "my_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


def _run(site: Path, code: str) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def test_a_plugins_space_and_controller_are_found_by_a_fresh_process(tmp_path):
    _install(
        tmp_path,
        "[autosearch.spaces]\nmine = my_plugin\n\n"
        "[autosearch.controllers]\nwanderer = my_plugin:Wanderer\n",
    )
    done = _run(
        tmp_path,
        "import sys\n"
        "from autosearch.registry import controllers, spaces\n"
        "assert 'my_plugin' not in sys.modules\n"
        "space = spaces.get('tiny-resnet')()\n"
        "controller = controllers.get('wanderer')(space, seed=0)\n"
        "print(space.name, controller.name, 'resnet' in spaces.names())\n",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["tiny-resnet", "wanderer", "True"]


def test_a_plugin_that_cannot_load_is_named_in_one_line(tmp_path):
    _install(tmp_path, "[autosearch.spaces]\nbroken = no_such_module\n")
    done = _run(
        tmp_path,
        "from autosearch.errors import ConfigError\n"
        "from autosearch.registry import spaces\n"
        "try:\n    spaces.get('resnet')\nexcept ConfigError as exc:\n    print(exc)\n",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().startswith(
        "the search space plugin 'broken' (no_such_module) cannot be loaded: ModuleNotFoundError"
    )


@pytest.mark.parametrize("group", ["autosearch.spaces", "autosearch.controllers"])
def test_this_distribution_declares_its_own_plugins(group):
    from importlib.metadata import entry_points

    assert [p.value for p in entry_points(group=group) if p.name == "builtin"] == [
        "search_spaces" if group == "autosearch.spaces" else "controllers"
    ]
