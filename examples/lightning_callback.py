"""PyTorch Lightning: step telemetry for tuimon from a callback.

    from examples.lightning_callback import TuimonCallback

    trainer = lightning.Trainer(callbacks=[TuimonCallback("llama-70b")], ...)
    trainer.fit(model, datamodule)

Each training batch is a step; the time between batches is the input pipeline's
(`data`), or `checkpoint` where Lightning wrote one in it (agent.reporter_hooks). The
rank and world size come from the trainer. A run that ends normally says so
(`finish()`), so its silence afterwards costs no budget; a crash does not, so it does.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from agent.reporter import StepReporter
from agent.reporter_hooks import HookTimer


class TuimonCallback(pl.Callback):
    def __init__(self, job: str, socket_path: str | None = None) -> None:
        self.job = job
        self.socket_path = socket_path
        self.timer: HookTimer | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        reporter = StepReporter(self.job, trainer.global_rank, trainer.world_size,
                                socket_path=self.socket_path,
                                local_rank=trainer.local_rank)
        self.timer = HookTimer(reporter)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.timer is not None:
            self.timer.begin()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.timer is not None:
            self.timer.end(samples=_batch_size(batch))

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if self.timer is not None:
            self.timer.saved()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.timer is not None:
            self.timer.pause()  # evaluation is no training step's waiting

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.timer is not None:
            self.timer.finish()
            self.timer.reporter.close()


def _batch_size(batch: Any) -> int:
    """The samples in a batch: the first dimension of its first tensor."""
    while isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    if isinstance(batch, dict) and batch:
        batch = next(iter(batch.values()))
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else 0
