"""The zero-cost proxies over NAS-Bench-201's whole space (benchmarks/nb201_proxies.py
--whole-space): hours of CPU or minutes of a lent GPU at a time, so the file is resumed
by each run, never scores a cell twice, survives an interruption with every cell scored
before it, and its cells so far follow the seed's order of the space."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from search_spaces import NB201Space
from search_spaces._nb201_net import OPERATIONS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import nb201_proxies  # noqa: E402


@pytest.fixture(scope="module")
def table() -> dict[str, dict[str, float]]:
    """Every cell of the space with a made-up accuracy and costs."""
    space = NB201Space()
    genes = list(space.domains())
    out = {}
    for ops in itertools.product(sorted(OPERATIONS), repeat=len(genes)):
        key = space.to_string(space.make(dict(zip(genes, ops, strict=True))))
        h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")
        out[key] = {"accuracy": 50 + h % 4000 / 100, "flops": h % 97, "params": h % 89}
    return out


def _stand_in(calls: list[str], fail_at: int | None = None):
    """Proxies computed from the cell's key (the real ones take a second a cell)."""

    def score(space, key, seed, images, labels, names=tuple(nb201_proxies.PROXIES)):
        if fail_at is not None and len(calls) == fail_at:
            raise KeyboardInterrupt
        calls.append(key)
        h = int.from_bytes(hashlib.sha256(f"{seed}{key}".encode()).digest()[:8], "little")
        return {n: float((h >> i) % 1000) for i, n in enumerate(names)}

    return score


def test_the_whole_space_run_resumes_where_it_stopped_and_scores_no_cell_twice(
    table, tmp_path, monkeypatch
):
    monkeypatch.setattr(nb201_proxies, "batch_of", lambda seed, batch, device: (None, None))
    path = tmp_path / "whole.json"
    earlier = tmp_path / "run.json"
    reused = sorted(table)[:5]  # a seed-0 run's rows (the same protocol)
    rows = [[k, table[k]["accuracy"], *range(len(nb201_proxies.PROXIES))] for k in reused]
    run = {"seed": 0, "batch": 64, "scored": rows,
           "scored_columns": ["cell", "published", *nb201_proxies.PROXIES]}  # fmt: skip
    earlier.write_text(json.dumps({"seeds": [run], "machine_name": "elsewhere"}))

    calls: list[str] = []
    monkeypatch.setattr(nb201_proxies, "score_cell", _stand_in(calls))
    first = nb201_proxies.whole_space(path, 0, 64, table, "cpu", None, earlier, limit=7)
    assert first["cells_scored"] == 12 and not first["complete"]
    assert not set(calls) & set(reused)  # the reused cells are not scored again

    monkeypatch.setattr(nb201_proxies, "score_cell", _stand_in(calls, fail_at=len(calls) + 4))
    cut = nb201_proxies.whole_space(path, 0, 64, table, "cpu", None, None, limit=20)
    assert cut["cells_scored"] == 16  # the four scored before the interruption kept
    kept = json.loads(path.read_text())
    assert [r[0] for r in kept["scored"]] == [*reused, *calls]

    monkeypatch.setattr(nb201_proxies, "score_cell", _stand_in(calls))
    again = nb201_proxies.whole_space(path, 0, 64, table, "cpu", None, None, limit=10)
    cells = [r[0] for r in again["scored"]]
    assert len(cells) == len(set(cells)) == 26 and cells[5:] == calls
    # The seed's order of the space, the reused cells left out of it.
    order = [k for k in np.random.default_rng(0).permutation(sorted(table)) if k not in reused]
    assert calls == order[:21]
    assert [p.get("cells") for p in again["parts"]] == [5, 7, 4, 10]
    figures = again["estimators"][next(iter(nb201_proxies.ENSEMBLES))]
    assert -1 <= figures["kendall_tau"] <= 1
    assert again["best_of_the_cells_published"] == max(table[k]["accuracy"] for k in cells)
    with pytest.raises(SystemExit, match="holds seed 0, batch 64"):
        nb201_proxies.whole_space(path, 1, 64, table, "cpu", None, None, limit=1)


def test_a_cell_is_scored_by_every_proxy_at_the_benchmarks_size():
    space = NB201Space(channels=16, cells=5)
    key = "|nor_conv_3x3~0|+|nor_conv_3x3~0|skip_connect~1|+|skip_connect~0|none~1|nor_conv_1x1~2|"
    torch.manual_seed(0)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    found = nb201_proxies.score_cell(space, key, 0, images, labels)
    assert all(math.isfinite(found[n]) for n in nb201_proxies.PROXIES), found
    again = nb201_proxies.score_cell(space, key, 0, images, labels)
    assert [found[n] for n in nb201_proxies.PROXIES] == [again[n] for n in nb201_proxies.PROXIES]


def test_parts_run_at_once_keep_each_others_cells(table, tmp_path, monkeypatch):
    """Part 0 of 2 saves while part 1 ran and saved in between (as two processes at once
    do): the file holds both parts' cells, each from its own half of the seed's order."""
    monkeypatch.setattr(nb201_proxies, "batch_of", lambda seed, batch, device: (None, None))
    path = tmp_path / "whole.json"
    first: list[str] = []
    other: list[str] = []
    stand_in = _stand_in(first)

    def part_0(space, key, seed, images, labels, names=tuple(nb201_proxies.PROXIES)):
        if len(first) == 2:  # the other part runs and saves meanwhile
            monkeypatch.setattr(nb201_proxies, "score_cell", _stand_in(other))
            nb201_proxies.whole_space(path, 0, 64, table, "cpu", None, None, 3, part=(1, 2))
            monkeypatch.setattr(nb201_proxies, "score_cell", part_0)
        return stand_in(space, key, seed, images, labels, names)

    monkeypatch.setattr(nb201_proxies, "score_cell", part_0)
    report = nb201_proxies.whole_space(path, 0, 64, table, "cpu", None, None, 5, part=(0, 2))
    order = list(np.random.default_rng(0).permutation(sorted(table)))
    assert first == order[0:10:2] and other == order[1:6:2]
    cells = [r[0] for r in report["scored"]]
    assert sorted(cells) == sorted(first + other) and len(set(cells)) == 8
    assert report == json.loads(path.read_text())
    assert sorted((p["part"], p["cells"]) for p in report["parts"]) == [("0/2", 5), ("1/2", 3)]
