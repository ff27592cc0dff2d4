"""A study in TensorBoard, written with ``torch.utils.tensorboard`` (no TensorFlow):
``FOLDER/STUDY/trial-NNNNN`` per trial (its scalars per epoch, then its hyperparameters
beside its final figures), ``supernet`` (the supernet's per-epoch line) and ``front``
(the Pareto front, accuracy over FLOPs). Called in the tracking thread."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

__all__ = ["TensorBoardLogs", "trial_folder"]


def trial_folder(number: int) -> str:
    return f"trial-{number:05d}"


class TensorBoardLogs:
    """Event files of study ``study`` under ``folder``."""

    def __init__(self, folder: str, study: str) -> None:
        self.root = Path(folder) / (re.sub(r"[^\w.-]+", "_", study).strip(".") or "study")
        self._writers: dict[str, SummaryWriter] = {}

    def _writer(
        self, key: str, folder: str | None = None, purge_step: int | None = None
    ) -> SummaryWriter:
        """The writer of ``key``, opened on ``folder`` (default: the key) if it is not open."""
        from torch.utils.tensorboard import SummaryWriter

        if key not in self._writers:
            self._writers[key] = SummaryWriter(
                str(self.root / (folder or key)), purge_step=purge_step, flush_secs=10
            )
        return self._writers[key]

    def trial_started(self, key: str, number: int, resumed_at: int) -> None:
        """A trial's writer; a resumed trial's events from ``resumed_at`` on (written by
        the attempt that died) are dropped by TensorBoard (``purge_step``)."""
        self.close(key)
        self._writer(key, trial_folder(number), purge_step=resumed_at or None)

    def scalars(self, key: str, values: Mapping[str, float], step: int) -> None:
        writer = self._writer(key)
        for name, value in values.items():
            writer.add_scalar(name, value, step)
        writer.flush()

    def trial_ended(
        self, key: str, hparams: Mapping[str, Any], metrics: Mapping[str, float]
    ) -> None:
        """Its hyperparameters with its final figures (TensorBoard's HPARAMS tab), and
        its writer closed."""
        writer = self._writers.get(key)
        if writer is None:
            return
        if metrics:
            shown = {
                k: v if isinstance(v, (int, float, str, bool)) else str(v)
                for k, v in hparams.items()
            }
            writer.add_hparams(shown, {f"hparam/{k}": v for k, v in metrics.items()}, run_name=".")
        self.close(key)

    def front(self, points: Sequence[tuple[float, float]]) -> None:
        """The front as it stands: ``front/accuracy`` at step = FLOPs, one point each
        (the folder written again whole)."""
        folder = self.root / "front"
        self.close("front")
        shutil.rmtree(folder, ignore_errors=True)
        writer = self._writer("front")
        for flops, accuracy in sorted(points):
            writer.add_scalar("front/accuracy", accuracy, round(flops))
        self.close("front")

    def close(self, key: str | None = None) -> None:
        for name in [key] if key is not None else list(self._writers):
            writer = self._writers.pop(name, None)
            if writer is not None:
                writer.close()
