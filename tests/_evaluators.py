"""Evaluators as users write them: module-level, so pool workers receive them."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F


def _accuracy(model, split, data) -> float:
    model.eval()
    with torch.no_grad():
        logits = model(data.normalize(split.x.float()))
    return float((logits.argmax(1) == split.y).float().mean())


def plain_loop(candidate):
    """A user's own loop: Adam, label smoothing, its own epochs; reports each epoch and
    keeps a checkpoint to resume from."""
    model, data = candidate.model, candidate.data
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    start = 1
    kept = candidate.load()
    if kept is not None:
        model.load_state_dict(kept["model"])
        optimizer.load_state_dict(kept["optimizer"])
        start = int(kept["epoch"]) + 1
    generator = torch.Generator().manual_seed(candidate.seed)
    x, y = data.normalize(data.train.x.float()), data.train.y
    for epoch in range(start, candidate.config.epochs + 1):
        model.train()
        for index in torch.randperm(len(y), generator=generator).split(128):
            optimizer.zero_grad()
            F.cross_entropy(model(x[index]), y[index], label_smoothing=0.1).backward()
            optimizer.step()
        candidate.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
        )
        _maybe_die(candidate, epoch)
        candidate.report(epoch, _accuracy(model, data.val, data))
    return {
        "accuracy": _accuracy(model, data.val, data),
        "test_accuracy": _accuracy(model, data.test, data),
        "my_figure": 42.0,
    }


def _maybe_die(candidate, epoch: int) -> None:
    """Where AUTOSEARCH_TEST_DIE_AT names a trial and epoch: the process dies there (once)."""
    at = os.environ.get("AUTOSEARCH_TEST_DIE_AT")
    if not at:
        return
    trial, die_epoch, marker = at.split(":", 2)
    if candidate.trial == int(trial) and epoch == int(die_epoch) and not Path(marker).exists():
        Path(marker).write_text("died")
        os._exit(9)


class Scoring:
    """An evaluator that also scores a given network (a compressed variant)."""

    def __call__(self, candidate):
        return plain_loop(candidate)

    def score(self, model, candidate):
        return {"accuracy": _accuracy(model, candidate.data.val, candidate.data)}


def fixed(candidate):
    """Trains nothing: a figure from the architecture (for fast studies)."""
    width = sum(float(v) for v in candidate.arch.values() if isinstance(v, int | float))
    return {"accuracy": 0.5 + 0.4 * math.tanh(width / 50.0)}


def raises(candidate):
    raise RuntimeError("my loader broke")


def returns(value):
    def evaluate(candidate):
        return value

    return evaluate


def nan_accuracy(candidate):
    return {"accuracy": float("nan")}


def no_accuracy(candidate):
    return {"f1": 0.5}


def text_accuracy(candidate):
    return {"accuracy": "high"}


def out_of_order(candidate):
    candidate.report(2, 0.5)
    candidate.report(1, 0.6)
    return {"accuracy": 0.6}


def with_f1(candidate):
    """Trains nothing; returns a figure of its own beside accuracy."""
    figures = fixed(candidate)
    return {**figures, "f1": round(1.0 - figures["accuracy"] / 2, 6)}
