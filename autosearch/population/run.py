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

A member's checkpoint is used only where it is the state its record describes: the
record keeps a digest of the member's history at its epoch (``state``), and a checkpoint
whose history differs (lost, damaged, or trained from scratch in its place) is never
adopted. A member whose checkpoint is not its record's is rebuilt from its schedule,
and says so; a round's donor whose checkpoint is not its record's gives way to another
top member, or is rebuilt first. A member that fails (diverges) scores 0, is never a
donor and always copies one; a round where every member has failed ends the
population with that failure.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch.nn as nn

from autosearch._files import state_digest
from autosearch.data import Dataset
from autosearch.errors import ConfigError, TrialFailed
from autosearch.population.ledger import Ledger, State, claim, held
from autosearch.population.rules import PopulationBasedTraining, explore
from autosearch.training import _checkpoint
from autosearch.training.precise_bn import precise_bn
from autosearch.training.runtime import world
from autosearch.training.train import ADAPTIVE, EpochResult, TrainConfig, evaluate, train
from autosearch.workers._heartbeat import worker_id

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

    def state(self) -> dict[str, Any]:
        """The winner's training checkpoint (weights, history), checked whole."""
        return _checkpoint.read(Ledger(self.folder).checkpoint(self.winner))

    def load(self, model: nn.Module) -> nn.Module:
        """``model`` with the winner's trained weights."""
        model.load_state_dict(self.state()["model"])
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
            action = _next(state, population, config.epochs, grace, ledger)
            if action[0] == "decide":
                _decide(state, action[1], population, ledger)
                continue
            if action[0] in ("train", "rebuild"):
                claim(state, action[1], me)
                settings = dict(state["members"][action[1]]["settings"])
        if action[0] == "done":
            break
        if action[0] == "wait":
            time.sleep(poll)
            continue
        job = _Job(build, data, config, population, ledger, seed=seed, me=me, on_epoch=on_epoch)
        if action[0] == "rebuild":
            job.rebuild(action[1])
        else:
            job.train(action[1], action[2], settings)
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
    keys = sorted({k for segment in schedule for k in segment["settings"]})
    unknown = [k for k in keys if k not in ADAPTIVE]
    if unknown:
        raise ConfigError(
            f"the schedule sets {', '.join(map(repr, unknown))}: only "
            f"{', '.join(ADAPTIVE)} change while a run trains (a population's schedule.json)"
        )
    model = build()
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
    state: State, population: PopulationBasedTraining, epochs: int, grace: float, ledger: Ledger
) -> tuple[Any, ...]:
    """What a worker does now: ("train", member, until), ("decide", round),
    ("rebuild", member) (a checkpoint that a round or the result needs is not its
    member's record's), ("wait",) or ("done",)."""
    members = state["members"]
    low = min(m["epoch"] for m in members)
    if low >= epochs:
        return _unless_lost(state, _winner(members, low), grace, ledger, then=("done",))
    decided = {r["epoch"] for r in state["rounds"]}
    ready = low >= max(population.burn_in, 1) and low not in decided
    if ready and all(m["epoch"] == low for m in members):
        round_ = _plan(members, low, population, ledger)  # every member at the boundary
        if not round_.donors:  # no top member's checkpoint is its record's: rebuild one
            return _unless_lost(state, round_.top[0], grace, ledger, then=("decide", round_))
        return ("decide", round_)
    boundary = min((low // population.interval + 1) * population.interval, epochs)
    behind = [m["id"] for m in members if m["epoch"] < boundary]
    free = [i for i in behind if not held(state, i, grace)]
    if free:
        return ("train", free[0], boundary)
    if behind:
        return ("wait",)
    raise AssertionError(f"no member behind epoch {boundary}, and the round at {low} decided")


def _unless_lost(
    state: State, member: Mapping[str, Any], grace: float, ledger: Ledger, *, then: tuple[Any, ...]
) -> tuple[Any, ...]:
    """``then`` where ``member``'s checkpoint is its record's; else ("rebuild", member),
    or ("wait",) while another worker rebuilds it."""
    if _lost(ledger, member) is None:
        return then
    return ("wait",) if held(state, member["id"], grace) else ("rebuild", member["id"])


@dataclass(frozen=True)
class _Round:
    """A round's choices before they are made: the members ranked, the top (members
    that did not fail), the donors among them (checkpoints that are their records'),
    the recipients (the bottom, and every member that failed), the top left out."""

    epoch: int
    ranked: list[dict[str, Any]]
    scores: dict[int, float]
    top: list[dict[str, Any]]
    donors: list[dict[str, Any]]
    recipients: list[dict[str, Any]]
    lost: dict[int, str]


def _plan(
    members: list[dict[str, Any]], epoch: int, population: PopulationBasedTraining, ledger: Ledger
) -> _Round:
    failed = {m["id"] for m in members if _failed_at(m, epoch)}
    if len(failed) == len(members):
        raise TrialFailed(
            f"every member of the population failed by epoch {epoch} "
            f"(member 0: {_failure(members[0], epoch)}): narrow the ranges of its mutations"
        )
    scores = {m["id"]: _rank_score(m, epoch) for m in members}
    ranked = sorted(members, key=lambda m: (-scores[m["id"]], m["id"]))
    k = max(1, int(len(members) * population.quantile))
    top = [m for m in ranked if m["id"] not in failed][:k]
    chosen = {m["id"] for m in top}
    bottom = {m["id"] for m in ranked[-k:]} | failed
    recipients = [m for m in members if m["id"] in bottom - chosen]
    lost = {m["id"]: reason for m in top if (reason := _lost(ledger, m)) is not None}
    donors = [m for m in top if m["id"] not in lost]
    return _Round(epoch, ranked, scores, top, donors, recipients, lost)


def _decide(
    state: State, planned: _Round, population: PopulationBasedTraining, ledger: Ledger
) -> None:
    """A round: the recipients copy a donor and explore. Files are copied before the
    record says so (the record is written when the lock's block ends)."""
    epoch = planned.epoch
    members = state["members"]  # this block's own copies, which the block writes back
    for member, reason in sorted(planned.lost.items()):
        logger.warning("population member %d is not a donor at epoch %d: %s", member, epoch, reason)
    rng = np.random.default_rng([population.seed, 1, epoch])
    exploits = []
    for planned_recipient in planned.recipients:
        donor = members[planned.donors[int(rng.integers(len(planned.donors)))]["id"]]
        recipient = members[planned_recipient["id"]]
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
        _set_state(recipient, donor.get("state"))
    state["rounds"].append(
        {
            "epoch": epoch,
            "ranking": [m["id"] for m in planned.ranked],
            "scores": [planned.scores[m["id"]] for m in planned.ranked],
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


def _failed_at(member: Mapping[str, Any], epoch: int) -> bool:
    return any(f["epoch"] == epoch for f in member.get("failures", []))


def _failure(member: Mapping[str, Any], epoch: int) -> str:
    return next((f["reason"] for f in member.get("failures", []) if f["epoch"] == epoch), "")


def _winner(members: list[dict[str, Any]], epoch: int) -> dict[str, Any]:
    """The best member at ``epoch`` (the last) among those that did not fail there."""
    whole = [m for m in members if not _failed_at(m, epoch)]
    if not whole:
        raise TrialFailed(
            f"every member of the population failed by epoch {epoch} "
            f"(member 0: {_failure(members[0], epoch)}): narrow the ranges of its mutations"
        )
    return min(whole, key=lambda m: (-m["scores"][str(epoch)], m["id"]))


def _history_digest(history: Sequence[Any], epoch: int) -> str:
    """What identifies a member's state at ``epoch``: its history to there (losses and
    accuracies by epoch; not the seconds, which no two runs share)."""
    rows = [e if isinstance(e, Mapping) else vars(e) for e in history[:epoch]]
    return state_digest([[r["epoch"], r["train_loss"], r["val_accuracy"], r["val_loss"]]
                         for r in rows])  # fmt: skip


def _set_state(member: dict[str, Any], digest: str | None) -> None:
    if digest is None:
        member.pop("state", None)
    else:
        member["state"] = digest


def _lost(ledger: Ledger, member: Mapping[str, Any], until: int | None = None) -> str | None:
    """Why ``member``'s checkpoint is not the state its record describes (None where it
    is): missing, unreadable, at another epoch, or of another history. ``until``: the
    member is being trained towards it, so a checkpoint between its epoch and there is
    its own (a worker stopped mid-interval)."""
    epoch, path = member["epoch"], ledger.checkpoint(member["id"])
    if not path.is_file():
        return None if epoch == 0 else "its checkpoint is missing"
    try:
        saved = _checkpoint.read(path)
        at, history = int(saved["epoch"]), saved["history"]
    except Exception as exc:
        return f"its checkpoint cannot be read ({_checkpoint.describe(exc)})"
    if at < epoch or at > (epoch if until is None else until):
        return f"its checkpoint is of epoch {at}, its record of epoch {epoch}"
    expected = member.get("state")
    if expected is not None and _history_digest(history, epoch) != expected:
        return "its checkpoint's history is not its record's (trained again in its place?)"
    return None


def _copy(source: Path, target: Path) -> None:
    """``source``'s checkpoint as ``target``'s, whole (a temporary file renamed). Only
    a round copies, under the record's lock: a copy file left there is a killed
    round's, and goes."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f"{target.name}.*.copy"):
        stale.unlink(missing_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.copy")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)


@dataclass
class _Job:
    """What one worker does to one member it has claimed: train it to a boundary, or
    rebuild its state from its schedule."""

    build: Callable[[], nn.Module]
    data: Dataset
    config: TrainConfig
    population: PopulationBasedTraining
    ledger: Ledger
    seed: int
    me: str
    on_epoch: Callable[[int, EpochResult], None] | None

    def _beat(self, member: int) -> Callable[[EpochResult], None]:
        def beat(epoch: EpochResult) -> None:
            with self.ledger.locked() as state:
                if self._mine(state, member):
                    state["claims"][str(member)]["beat"] = time.time()
            if self.on_epoch is not None:
                self.on_epoch(member, epoch)

        return beat

    def _mine(self, state: State, member: int) -> bool:
        return bool(state["claims"].get(str(member), {}).get("worker") == self.me)

    @contextlib.contextmanager
    def _freed_when_stopped(self, member: int) -> Iterator[None]:
        """Stopped (Ctrl-C, a platform error): the member is free again."""
        try:
            yield
        except BaseException:
            with self.ledger.locked() as state:
                if self._mine(state, member):
                    del state["claims"][str(member)]
            raise

    def rebuild(self, member: int) -> None:
        """Rebuild ``member``'s state (a round or the result needs it), then free it."""
        with self._freed_when_stopped(member):
            record = self.ledger.read()["members"][member]
            reason = _lost(self.ledger, record)
            digest = self._rebuild(record, reason) if reason is not None else record.get("state")
        with self.ledger.locked() as state:
            if self._mine(state, member):
                _set_state(state["members"][member], digest)
                del state["claims"][str(member)]

    def _rebuild(self, record: Mapping[str, Any], reason: str) -> str | None:
        """Set ``record``'s checkpoint aside and train its member again from scratch
        along its schedule to its epoch; the digest of the state it reached."""
        member, epoch = record["id"], record["epoch"]
        path = self.ledger.checkpoint(member)
        if path.exists():
            path.replace(path.with_name(f"{path.name}.lost"))
        if epoch == 0:
            logger.warning("population member %d: %s; trained from its start", member, reason)
            return None
        schedule = [s for s in record["schedule"] if s["to"] > s["from"]]
        _, history = replay(self.build, self.data, self.config, schedule, seed=self.seed,
                            checkpoint=path, on_epoch=self._beat(member))  # fmt: skip
        digest = _history_digest(history, epoch)
        recorded, now = record["scores"].get(str(epoch)), history[epoch - 1].val_accuracy
        differs = (
            f"; it reached {now:.4f} where its record says {recorded:.4f} (this machine's "
            "kernels differ from the first run's)"
            if record.get("state") not in (None, digest) and recorded is not None
            else ""
        )
        logger.warning(
            "population member %d: %s; rebuilt from its schedule to epoch %d%s",
            member,
            reason,
            epoch,
            differs,
        )
        return digest

    def train(self, member: int, until: int, settings: dict[str, Any]) -> None:
        """Train ``member`` from its record's state to epoch ``until`` and record it."""
        cfg = dataclasses.replace(self.config, **settings)
        failed, ranked = None, None
        with self._freed_when_stopped(member):
            record = self.ledger.read()["members"][member]
            reason = _lost(self.ledger, record, until)
            if reason is not None:
                digest = self._rebuild(record, reason)
                with self.ledger.locked() as state:
                    if self._mine(state, member):  # a second stop here rebuilds no more
                        _set_state(state["members"][member], digest)
            try:
                path, adaptive = self.ledger.checkpoint(member), sorted(self.population.mutations)
                model = self.build()
                result = train(
                    model,
                    self.data,
                    cfg,
                    seed=self.seed,
                    checkpoint=path,
                    until=until,
                    adaptive=adaptive,
                    on_epoch=self._beat(member),
                )
                score = result.history[-1].val_accuracy
                ranked = self._precise(model, until)
            except TrialFailed as exc:  # diverged: scores 0, copies a donor at the next round
                failed, score = str(exc), 0.0
                logger.warning(
                    "population member %d failed before epoch %d: %s", member, until, exc
                )
        with self.ledger.locked() as state:
            if not self._mine(state, member):
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
            _set_state(record, None if failed else _history_digest(result.history, until))
            del state["claims"][str(member)]

    def _precise(self, model: nn.Module, until: int) -> float | None:
        """The accuracy a round ranks by, with batch-norm statistics recomputed (None
        where there is no round at ``until``, or no batch norm)."""
        population, data = self.population, self.data
        if (
            not population.precise_bn
            or not max(population.burn_in, 1) <= until < self.config.epochs
        ):
            return None
        scored = precise_bn(model, data.train, data, images=population.precise_bn)
        return evaluate(scored, data.val, data)[0] if scored is not model else None


def _result(ledger: Ledger) -> PopulationResult:
    state = ledger.read()
    members = state["members"]
    last = max(m["epoch"] for m in members)
    best = _winner(members, last)
    return PopulationResult(
        folder=ledger.folder,
        winner=best["id"],
        val_accuracy=best["scores"][str(last)],
        schedule=best["schedule"],
        members=members,
        rounds=state["rounds"],
    )
