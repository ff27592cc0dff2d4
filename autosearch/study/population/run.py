"""A population trained together, by one worker or many sharing its folder.

Every member starts from the same initial weights and data order (the run's seed);
members differ in their adaptive settings. Rounds are synchronous: at each boundary
(every ``interval`` epochs) all members stop, the bottom ``quantile`` copy the whole
training checkpoint of a top member (weights, momentum, the schedule's position, the
data order) and explore its settings. Members are ranked by their validation accuracy
with batch-norm statistics recomputed (``precise_bn``: statistics that trail a high
learning rate's weights would rank it far below its worth). A round's choices depend
only on the stored scores and the seed, and are made under the ledger's lock, once: a
worker killed while it copies leaves the round undecided in the record, and the next
worker makes the same round again. A member is trained only by the worker that claimed
it; a claim whose process is gone (this machine) or that has not beaten for ``grace``
seconds (another machine) is taken over, and the member resumes from its last epoch's
checkpoint.

Because members share their start, a member's schedule (the settings it trained with,
epoch by epoch, along its lineage) replays it: :func:`replay` trains the same network
again from scratch with that schedule.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from autosearch.data import Dataset
from autosearch.errors import ConfigError, TrialFailed
from autosearch.study.population.ledger import Ledger, State, claim, held
from autosearch.study.population.rules import PopulationBasedTraining, explore
from autosearch.study.workers._heartbeat import worker_id
from autosearch.training.precise_bn import precise_bn
from autosearch.training.runtime import world
from autosearch.training.train import EpochResult, TrainConfig, evaluate, train

__all__ = ["PopulationResult", "replay", "train_population"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PopulationResult:
    """A trained population: its best member and what every member did.

    Attributes:
        folder: The population's folder (its record and every member's checkpoint).
        winner: The member with the best validation accuracy at the last epoch.
        val_accuracy: Its validation accuracy.
        schedule: Its settings, epoch by epoch along its lineage:
            ``[{"from": 0, "to": 4, "settings": {...}}, ...]`` (what :func:`replay` takes).
        members: Each member's record: settings, scores by epoch, schedule, lineage.
        rounds: Each round's ranking and exploits (which member copied whom, with which
            settings before and after).
    """

    folder: Path
    winner: int
    val_accuracy: float
    schedule: list[dict[str, Any]]
    members: list[dict[str, Any]]
    rounds: list[dict[str, Any]]

    def load(self, model: nn.Module) -> nn.Module:
        """``model`` with the winner's trained weights."""
        path = Ledger(self.folder).checkpoint(self.winner)
        state = torch.load(path, weights_only=True, map_location="cpu")
        model.load_state_dict(state["model"])
        return model


def train_population(
    build: Callable[[], nn.Module],
    data: Dataset,
    config: TrainConfig,
    population: PopulationBasedTraining,
    folder: str | Path,
    *,
    seed: int,
    on_epoch: Callable[[int, EpochResult], None] | None = None,
    grace: float = 600.0,
    poll: float = 0.5,
) -> PopulationResult:
    """Train ``population`` of ``build()`` networks on ``data`` until every member has
    trained ``config.epochs``; any number of workers may call this on the same folder at
    once (each trains the members it claims), and a call on a folder of an unfinished
    population goes on with it. ``on_epoch(member, epoch)`` after each member's epoch.

    Raises:
        ConfigError: the folder holds another population, or the settings cannot be
            trained as a population (a sharded or multi-process run, bad ranges).
    """
    if world()[1] > 1:
        raise ConfigError(
            "a population trains one member per process: start more workers on the same "
            "folder instead of torchrun ranks"
        )
    if config.parallel != "ddp":
        raise ConfigError(
            f"a population's members train whole: set parallel='ddp' ({config.parallel!r})"
        )
    population.check(config)
    ledger = Ledger(Path(folder))
    definition = _definition(config, population, seed, data)
    me = f"{worker_id()}#{time.monotonic_ns()}"
    with ledger.locked() as state:
        _start(state, definition, population, ledger)
    while True:
        with ledger.locked() as state:
            action = _next(state, population, config.epochs, grace)
            if action[0] == "decide":
                _decide(state, action[1], population, ledger)
                continue
            if action[0] == "train":
                claim(state, action[1], me)
                settings = dict(state["members"][action[1]]["settings"])
        if action[0] == "done":
            break
        if action[0] == "wait":
            time.sleep(poll)
            continue
        _train_member(build, data, config, population, ledger, action[1], action[2], settings,
                      seed=seed, me=me, on_epoch=on_epoch)  # fmt: skip
    return _result(ledger)


def replay(
    build: Callable[[], nn.Module],
    data: Dataset,
    config: TrainConfig,
    schedule: Sequence[Mapping[str, Any]],
    *,
    seed: int,
    checkpoint: str | Path | None = None,
    on_epoch: Callable[[EpochResult], None] | None = None,
) -> tuple[nn.Module, list[EpochResult]]:
    """Train ``build()`` from scratch with ``schedule`` (a population member's): the
    settings of each segment for its epochs. With the population's data and seed, the
    same network as that member's."""
    model = build()
    keys = sorted({k for segment in schedule for k in segment["settings"]})
    history: list[EpochResult] = []
    with _Scratch(checkpoint) as path:
        for segment in schedule:
            if segment["to"] <= segment["from"]:
                continue
            cfg = dataclasses.replace(config, **segment["settings"])
            model = build()  # fresh each segment, as a member is: the checkpoint wins
            result = train(model, data, cfg, seed=seed, checkpoint=path, until=segment["to"],
                           adaptive=keys, on_epoch=on_epoch)  # fmt: skip
            history = list(result.history)
    return model, history


class _Scratch:
    """``checkpoint`` as given, else a file in a temporary folder removed afterwards."""

    def __init__(self, checkpoint: str | Path | None) -> None:
        self.checkpoint = Path(checkpoint) if checkpoint else None
        self.folder: Path | None = None

    def __enter__(self) -> Path:
        if self.checkpoint is not None:
            return self.checkpoint
        import tempfile

        self.folder = Path(tempfile.mkdtemp(prefix="autosearch-replay-"))
        return self.folder / "train.pt"

    def __exit__(self, *exc: object) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _definition(
    config: TrainConfig, population: PopulationBasedTraining, seed: int, data: Dataset
) -> dict[str, Any]:
    shared = {k: v for k, v in dataclasses.asdict(config).items() if k not in population.mutations}
    return {
        "population": population.definition(),
        "train": shared,
        "seed": seed,
        "data": data.name,
        "images": [len(data.train), len(data.val)],
    }


def _start(
    state: State, definition: dict[str, Any], population: PopulationBasedTraining, ledger: Ledger
) -> None:
    """A new population's record, or refuse a folder that holds another one."""
    if state:
        if state["definition"] != definition:
            differ = sorted(k for k in definition if state["definition"].get(k) != definition[k])
            raise ConfigError(
                f"{ledger.folder} holds another population (its {', '.join(differ)} differ): "
                "use a new folder, or the same settings to go on with it"
            )
        return
    state.update(
        version=1,
        definition=definition,
        claims={},
        rounds=[],
        members=[
            {
                "id": i,
                "settings": population.initial(i),
                "epoch": 0,
                "scores": {},
                "schedule": [{"from": 0, "to": 0, "settings": population.initial(i)}],
                "lineage": [],
            }
            for i in range(population.size)
        ],
    )


def _next(
    state: State, population: PopulationBasedTraining, epochs: int, grace: float
) -> tuple[Any, ...]:
    """What a worker does now: ("train", member, until), ("decide", epoch), ("wait",)
    or ("done",)."""
    members = state["members"]
    low = min(m["epoch"] for m in members)
    if low >= epochs:
        return ("done",)
    decided = {r["epoch"] for r in state["rounds"]}
    ready = low >= max(population.burn_in, 1) and low not in decided
    if ready and all(m["epoch"] == low for m in members):
        return ("decide", low)  # every member at the boundary: the round comes first
    boundary = min((low // population.interval + 1) * population.interval, epochs)
    behind = [m["id"] for m in members if m["epoch"] < boundary]
    free = [i for i in behind if not held(state, i, grace)]
    if free:
        return ("train", free[0], boundary)
    if behind:
        return ("wait",)
    raise AssertionError(f"no member behind epoch {boundary}, and the round at {low} decided")


def _decide(state: State, epoch: int, population: PopulationBasedTraining, ledger: Ledger) -> None:
    """The round at ``epoch``: the bottom quantile copy the top and explore. Files are
    copied before the record says so (the record is written when the lock's block ends)."""
    members = state["members"]
    scores = {m["id"]: _rank_score(m, epoch) for m in members}
    ranked = sorted(members, key=lambda m: (-scores[m["id"]], m["id"]))
    k = max(1, int(len(members) * population.quantile))
    top, bottom = ranked[:k], sorted(ranked[-k:], key=lambda m: m["id"])
    rng = np.random.default_rng([population.seed, 1, epoch])
    exploits = []
    for recipient in bottom:
        donor = top[int(rng.integers(len(top)))]
        after = explore(donor["settings"], population, rng)
        _copy(ledger.checkpoint(donor["id"]), ledger.checkpoint(recipient["id"]))
        exploits.append({"member": recipient["id"], "from": donor["id"],
                         "before": recipient["settings"], "after": after})  # fmt: skip
        recipient.update(
            settings=after,
            schedule=[
                *copy.deepcopy(donor["schedule"]),
                {"from": epoch, "to": epoch, "settings": after},
            ],
            lineage=[*recipient["lineage"], {"epoch": epoch, "from": donor["id"]}],
        )
    state["rounds"].append(
        {
            "epoch": epoch,
            "ranking": [m["id"] for m in ranked],
            "scores": [scores[m["id"]] for m in ranked],
            "exploits": exploits,
        }
    )
    logger.info(
        "population round at epoch %d: %s",
        epoch,
        ", ".join(f"{e['member']} <- {e['from']}" for e in exploits),
    )


def _rank_score(member: Mapping[str, Any], epoch: int) -> float:
    """What a round ranks ``member`` by: its accuracy with batch-norm statistics
    recomputed where it was measured (``precise_bn``), else as trained."""
    precise = member.get("precise_bn", {})
    return float(precise.get(str(epoch), member["scores"][str(epoch)]))


def _copy(source: Path, target: Path) -> None:
    """``source``'s checkpoint as ``target``'s, whole (a temporary file renamed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.copy")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def _train_member(
    build: Callable[[], nn.Module],
    data: Dataset,
    config: TrainConfig,
    population: PopulationBasedTraining,
    ledger: Ledger,
    member: int,
    until: int,
    settings: dict[str, Any],
    *,
    seed: int,
    me: str,
    on_epoch: Callable[[int, EpochResult], None] | None,
) -> None:
    def beat(epoch: EpochResult) -> None:
        with ledger.locked() as state:
            if state["claims"].get(str(member), {}).get("worker") == me:
                state["claims"][str(member)]["beat"] = time.time()
        if on_epoch is not None:
            on_epoch(member, epoch)

    cfg = dataclasses.replace(config, **settings)
    failed, ranked = None, None
    try:
        path, adaptive = ledger.checkpoint(member), sorted(population.mutations)
        model = build()
        result = train(model, data, cfg, seed=seed, checkpoint=path, until=until,
                       adaptive=adaptive, on_epoch=beat)  # fmt: skip
        score = result.history[-1].val_accuracy
        if population.precise_bn and max(population.burn_in, 1) <= until < config.epochs:
            scored = precise_bn(model, data.train, data, images=population.precise_bn)
            if scored is not model:  # it has batch norm: the round ranks it by this
                ranked = evaluate(scored, data.val, data)[0]
    except TrialFailed as exc:  # diverged: the worst score, so the next round replaces it
        failed, score = str(exc), 0.0
        logger.warning("population member %d failed before epoch %d: %s", member, until, exc)
    except BaseException:  # stopped (Ctrl-C, a platform error): the member is free again
        with ledger.locked() as state:
            if state["claims"].get(str(member), {}).get("worker") == me:
                del state["claims"][str(member)]
        raise
    with ledger.locked() as state:
        if state["claims"].get(str(member), {}).get("worker") != me:
            logger.warning(
                "member %d was taken over by another worker: its epochs are theirs", member
            )
            return
        record = state["members"][member]
        record["epoch"] = until
        record["scores"][str(until)] = score
        if ranked is not None:
            record.setdefault("precise_bn", {})[str(until)] = ranked
        record["schedule"][-1]["to"] = until
        if failed is not None:
            record.setdefault("failures", []).append({"epoch": until, "reason": failed})
        del state["claims"][str(member)]


def _result(ledger: Ledger) -> PopulationResult:
    state = ledger.read()
    members = state["members"]
    last = str(max(m["epoch"] for m in members))
    best = min(members, key=lambda m: (-m["scores"][last], m["id"]))
    return PopulationResult(
        folder=ledger.folder,
        winner=best["id"],
        val_accuracy=best["scores"][last],
        schedule=best["schedule"],
        members=members,
        rounds=state["rounds"],
    )
