"""Train an exported architecture from scratch, in full, with the shared training stack.

``autosearch train EXPORT_DIR --data ... --epochs ...`` builds the network from the
folder's ``model.py`` (fresh weights), trains it with :func:`autosearch.training.train.train`
(checkpoints every epoch, so an interrupted run resumes; DDP under torchrun), and
writes into ``EXPORT_DIR/full/``:

* ``model.safetensors`` — the trained weights, which ``model.load(path)`` reads;
* ``metrics.json`` — validation and test accuracy, the per-epoch history, the
  training settings, precision, world size and seconds;
* ``checkpoint.pt`` — the last epoch's state (kept for resuming).

Images are normalised with the export's own ``MEAN`` / ``STD``, so the trained weights
drop into ``model.py`` unchanged.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from autosearch._files import read_json, save_tensors
from autosearch.data import Dataset
from autosearch.errors import ExportError
from autosearch.training.runtime import Runtime, resolve
from autosearch.training.train import EpochResult, TrainConfig, TrainResult, evaluate, train

__all__ = ["Trainer", "load_export", "recipe", "train_export"]

# (build, data, config, seed, the output folder) -> (the trained model, its result, what
# else metrics.json records): how an export is trained where not by one plain run.
Trainer = Callable[
    [Callable[[], torch.nn.Module], Dataset, TrainConfig, int, Path],
    tuple[torch.nn.Module, TrainResult, dict[str, Any]],
]


def load_export(folder: str | Path) -> ModuleType:
    """The ``model.py`` of an export folder, imported as a module."""
    path = Path(folder) / "model.py"
    if not Path(folder).is_dir():
        raise ExportError(f"export folder {folder} does not exist; check the path")
    if not path.is_file():
        raise ExportError(
            f"{folder} is not an export folder: it has no model.py (write one with "
            "`autosearch export`)"
        )
    spec = importlib.util.spec_from_file_location(f"_autosearch_export_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[spec.name]
        raise ExportError(
            f"{path} failed to load: {type(exc).__name__}: {exc}; export the trial again "
            "(autosearch export) if the file was edited"
        ) from None
    return module


def recipe(folder: str | Path) -> tuple[str | None, int, TrainConfig]:
    """How the export's trial was trained, as its arch.json records it: the data spec
    (None where unknown or given as arrays), the seed, and the TrainConfig (the
    candidate's own hyperparameters included). Older exports record none of it: then
    digits-sized defaults."""
    card_path = Path(folder) / "arch.json"
    if not Path(folder).is_dir():
        raise ExportError(f"export folder {folder} does not exist; check the path")
    if not os.path.lexists(card_path):  # absent (an older export): the defaults
        return None, 0, TrainConfig()
    try:  # present, it is read or refused: a FIFO, a device or a folder is not absent
        card = read_json(card_path, limit=16 << 20)
        training = (card.get("training") if isinstance(card, dict) else None) or {}
        config = TrainConfig(**training["train"]) if "train" in training else TrainConfig()
        data, seed = training.get("data"), int(training.get("seed", 0))
    except (OSError, ValueError, TypeError, AttributeError) as exc:  # NotReadable is one
        raise ExportError(f"{card_path} cannot be read ({exc}); export the trial again") from None
    return (None if not data or str(data).startswith("arrays:") else data), seed, config


def _check_fits(
    exported: ModuleType, data: Dataset, folder: str | Path, trained_on: str | None
) -> None:
    """Refuse an export that cannot be trained afresh on ``data``, saying why."""
    hint = f"; it was trained on {trained_on!r}: pass --data {trained_on}" if trained_on else ""
    if getattr(exported, "PROGRAM", None):
        raise ExportError(
            f"{folder} holds a channel-pruned variant ({exported.PROGRAM}): its structure "
            "has no source to build afresh. Export the base (--variant base) to train in full"
        )
    shape = tuple(exported.INPUT_SHAPE)
    if tuple(data.input_shape) != shape:
        raise ExportError(
            f"the export takes images of shape {shape} (channels, height, width), but the "
            f"data has {data.input_shape}{hint or '; train it on data of that shape'}"
        )
    try:
        classes = int(exported.build()(torch.zeros(1, *shape)).shape[1])
    except Exception as exc:
        raise ExportError(
            f"{folder}/model.py cannot build its network: {type(exc).__name__}: {exc}"
        ) from None
    if classes != data.num_classes:
        raise ExportError(
            f"the export has {classes} outputs but the data has {data.num_classes} classes{hint}"
        )


def train_export(
    folder: str | Path,
    data: Dataset,
    config: TrainConfig,
    *,
    seed: int = 0,
    runtime: Runtime | None = None,
    on_epoch: Callable[[EpochResult], None] | None = None,
    trained_on: str | None = None,
    trainer: Trainer | None = None,
) -> dict[str, Any]:
    """Train the export in ``folder`` from scratch on ``data``; see the module docstring.
    ``trained_on``: the data spec the export's trial used, named when ``data`` does not
    fit. ``trainer``: how, where not by one plain run (a population, a replayed
    schedule: :mod:`autosearch.population`). Returns the metrics written to
    ``metrics.json``."""
    exported = load_export(folder)
    _check_fits(exported, data, folder, trained_on)
    data = dataclasses.replace(data, mean=tuple(exported.MEAN), std=tuple(exported.STD))
    out = _writable(Path(folder) / "full")  # refused before training, not after it
    runtime = runtime or resolve(device=config.device, precision=config.precision)

    def build() -> torch.nn.Module:
        torch.manual_seed(seed)
        return exported.build()  # seeded initial weights

    def plain(build: Callable[[], torch.nn.Module], *_: Any) -> tuple[Any, TrainResult, dict]:
        model = build()
        checkpoint = out / "checkpoint.pt"
        return model, train(model, data, config, seed=seed, on_epoch=on_epoch,
                            checkpoint=checkpoint, runtime=runtime), {}  # fmt: skip

    model, result, extra = (trainer or plain)(build, data, config, seed, out)
    metrics: dict[str, Any] = {}
    if runtime.rank == 0:
        val_accuracy, val_loss = evaluate(model, data.val, data)
        test_accuracy, _ = evaluate(model, data.test, data)
        metrics = {
            "data": data.name,
            "val_accuracy": val_accuracy,
            "val_loss": val_loss,
            "test_accuracy": test_accuracy,
            "epochs": len(result.history),
            "seconds": result.seconds,
            "precision": result.precision,
            "world_size": result.world_size,
            "held_bytes": result.held,  # rank 0's parameters and optimizer state
            "seed": seed,
            "train_config": dataclasses.asdict(config),
            "history": [vars(e) for e in result.history],
            **extra,
        }
        try:
            save_tensors(model.state_dict(), out / "model.safetensors")
            (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        except Exception as exc:  # OSError, or safetensors' own error for the same
            raise ExportError(f"cannot write the trained weights into {out}: {exc}") from None
    return metrics


def _writable(out: Path) -> Path:
    """``out``, made, once this process is known to be able to write into it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as exc:
        raise ExportError(
            f"cannot write the trained weights into {out} ({exc.strerror or exc}); copy the "
            "export folder somewhere writable and train it there"
        ) from None
    return out
