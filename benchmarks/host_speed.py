"""How much work a CPU-second of this machine does now: a fixed Python loop and a fixed
convolution in one thread, timed in CPU-seconds of this process, printed as JSON.

On a shared host the same guest's CPU-second varies with its neighbours (seen on a 2-core
Zen 3: a 1.5-fold spread of such a loop within one hour, next to no steal time shown), so a
suite's or a benchmark's wall time is read beside this figure taken before and after it::

    python benchmarks/host_speed.py
"""

from __future__ import annotations

import json
import time

import torch


def main() -> None:
    start = time.process_time()
    total = 0
    for i in range(20_000_000):
        total += i * i % 7
    loop = time.process_time() - start
    torch.set_num_threads(1)
    x = torch.randn(64, 32, 32, 32, generator=torch.Generator().manual_seed(0))
    conv = torch.nn.Conv2d(32, 32, 3, padding=1)
    start = time.process_time()
    with torch.no_grad():
        for _ in range(30):
            conv(x)
    convolutions = time.process_time() - start
    print(json.dumps({
        "python_loop_cpu_s": round(loop, 2),
        "conv_cpu_s": round(convolutions, 2),
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
