"""Which torch build the set-up installs, and why. Standard library only: the Makefile
runs this file before anything else is installed.

    python3 autosearch/_torch_build.py PYTHON torch==2.13.0 [--dry-run] [--isolated]

1. Where pip's configuration already provides torch (a local folder of wheels, a private
   index), that: ``pip install torch==V``.
2. Else, on macOS, PyPI's own build (CPU and Apple GPUs).
3. Else, where ``nvidia-smi`` lists an NVIDIA GPU, the CUDA build from PyPI.
4. Else the CPU build from PyTorch's CPU wheel index (``--index-url``): PyPI's torch for
   Linux is the CUDA build, several GB with its cuDNN, NCCL and Triton wheels.

``--dry-run`` prints the decision and the command without installing; ``--isolated``
ignores pip's configuration, as on a fresh machine.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI_FILES = "files.pythonhosted.org"


@dataclass(frozen=True)
class Plan:
    command: list[str]
    reason: str


def plan(python: str, requirement: str, *, source: str | None, system: str, gpu: bool) -> Plan:
    """The install command for ``requirement``, given where pip would take it from
    (``source``: a URL, None when pip cannot resolve it), the OS and whether an NVIDIA
    GPU is present."""
    pip = [python, "-m", "pip", "install", "-q", requirement]
    if source and PYPI_FILES not in source:
        return Plan(pip, f"pip's configuration provides it ({source.split('/')[-1]})")
    if system == "Darwin":
        return Plan(pip, "PyPI's build for macOS (CPU and Apple GPUs)")
    if gpu:
        return Plan(pip, "the CUDA build from PyPI: nvidia-smi lists an NVIDIA GPU")
    return Plan(
        [*pip, "--index-url", CPU_INDEX],
        "the CPU build from PyTorch's CPU index: no NVIDIA GPU here (PyPI's Linux torch "
        "is the multi-GB CUDA build)",
    )


def pip_source(python: str, requirement: str, *, isolated: bool = False) -> str | None:
    """Where ``pip install requirement`` would take the wheel from, found by a dry run
    that downloads nothing (None when it cannot resolve)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
        command += ["--no-deps", "--quiet", "--report", str(report), requirement]
        if isolated:
            command.insert(3, "--isolated")
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not report.is_file():
            return None
        installs = json.loads(report.read_text()).get("install", [])
        return str(installs[0]["download_info"]["url"]) if installs else None


def nvidia_gpu() -> bool:
    """Whether ``nvidia-smi`` lists at least one GPU."""
    if shutil.which("nvidia-smi") is None:
        return False
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return listed.returncode == 0 and "GPU" in listed.stdout


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    python, requirement, flags = argv[0], argv[1], set(argv[2:])
    source = pip_source(python, requirement, isolated="--isolated" in flags)
    chosen = plan(python, requirement, source=source, system=platform.system(), gpu=nvidia_gpu())
    print(f"torch: {chosen.reason}\n  {' '.join(chosen.command)}")
    if "--dry-run" in flags:
        return 0
    return subprocess.call(chosen.command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
