"""Which torch build `make run` / `make test` install: decided, not downloaded."""

from __future__ import annotations

import sys

import pytest

from autosearch._torch_build import CPU_INDEX, main, pip_source, plan

PYPI = "https://files.pythonhosted.org/packages/01/79/torch-2.13.0-cp311-manylinux_2_28_x86_64.whl"
LOCAL = "file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.mark.parametrize(
    ("source", "system", "gpu", "index", "why"),
    [
        (LOCAL, "Linux", False, None, "pip's configuration provides it"),
        (LOCAL, "Linux", True, None, "pip's configuration provides it"),
        (PYPI, "Linux", False, CPU_INDEX, "CPU build"),
        (None, "Linux", False, CPU_INDEX, "CPU build"),  # offline: the CPU index still
        (PYPI, "Linux", True, None, "CUDA build"),
        (PYPI, "Darwin", False, None, "macOS"),
    ],
)
def test_the_build_follows_the_machine(source, system, gpu, index, why):
    chosen = plan("py", "torch==2.13.0", source=source, system=system, gpu=gpu)
    assert chosen.command[:6] == ["py", "-m", "pip", "install", "-q", "torch==2.13.0"]
    assert ("--index-url" in chosen.command) == (index is not None)
    if index:
        assert chosen.command[-1] == index
    assert why in chosen.reason


def test_this_machine_takes_the_wheel_its_pip_configuration_provides(capsys):
    # These machines' pip configuration points at a local folder of CPU wheels.
    source = pip_source(sys.executable, "torch==2.13.0")
    assert source is not None and source.startswith("file:") and "cpu" in source
    assert main([sys.executable, "torch==2.13.0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "pip's configuration provides it" in out and "--index-url" not in out
