"""The fault and worker tests on a loaded machine: ``make test-loaded``.

Competing processes keep every core busy (torch matrix products, as another training
job would) while the tests that kill, stop, interrupt and race workers run, so that a
test that leans on timing (a heartbeat grace, one process finishing first) fails here
rather than in someone's CI. Prints one JSON line: the load, what ran, the outcome.

    python tests/loaded.py              # the default files, two competing processes
    python tests/loaded.py --hogs 4 tests/test_faults.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = (
    "tests/test_faults.py",
    "tests/test_scaleout.py",
    "tests/test_executors.py",
    "tests/test_supernet_job.py",
    "tests/test_confirm.py",
    "tests/test_s3.py",
    "tests/test_jobs.py",
    "tests/test_heartbeat.py",
    "tests/test_interrupts.py",
    "tests/test_chaos.py",
    "tests/test_population.py",  # workers sharing a population, one killed
    "tests/test_population_study.py",  # a population trial helped by a second worker, cut
    "tests/test_sharding.py",  # torchrun ranks, one killed mid-epoch
    "tests/test_tracking.py",  # a tracker down or slow, two workers, a resumed run
)
HOG = (
    "import torch\n"
    "torch.set_num_threads(1)\n"
    "a = torch.randn(512, 512)\n"
    "while True:\n"
    "    a = torch.tanh(a @ a)\n"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", default=list(FILES))
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", *args.files],
            cwd=ROOT,
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print(
        json.dumps(
            {
                "competing_processes": args.hogs,
                "cores": os.cpu_count(),
                "files": args.files,
                "exit": done.returncode,
                "seconds": round(time.monotonic() - start, 1),
            }
        )
    )
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
