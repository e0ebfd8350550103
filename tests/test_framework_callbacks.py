"""Step telemetry from training frameworks: the hook timer every callback uses, and the
documented examples (a plain PyTorch loop, a Lightning callback, a Hugging Face
`TrainerCallback`) run on the CPU through a real step socket. The examples need torch,
lightning and transformers, which `make test` does not install (gigabytes): there they
skip, saying so; `make test-ml` installs them and runs these tests."""

from __future__ import annotations

import importlib.util
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from agent.reporter import StepReporter
from agent.reporter_hooks import HookTimer


class Socket:
    """The agent's end of the step socket: every datagram, decoded."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)

    def received(self) -> list[dict]:
        out = []
        while True:
            try:
                out.append(msgpack.unpackb(self.sock.recv(4096)))
            except BlockingIOError:
                return out


@pytest.fixture
def steps_socket(tmp_path: Path) -> Iterator[Socket]:
    s = Socket(tmp_path / "steps.sock")
    yield s
    s.sock.close()


def _needs(*modules: str) -> pytest.MarkDecorator:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed "
                              "(`make test-ml` installs it and runs this test)")


def test_the_hook_timer_counts_the_gap_before_a_step_as_its_waiting(
        steps_socket: Socket) -> None:
    timer = HookTimer(StepReporter("job", 0, 1, socket_path=steps_socket.path))
    for kind in ("first", "data", "checkpoint", "paused"):
        if kind == "checkpoint":
            timer.saved()
        if kind == "paused":
            timer.pause()
        time.sleep(0.05)  # the gap: fetching a batch, or writing a checkpoint
        timer.begin()
        time.sleep(0.02)  # the step itself
        timer.end(samples=4)
    timer.finish()
    first, data, checkpoint, paused, end = steps_socket.received()
    assert first["wall"] == pytest.approx(first["compute"]) and "waits" not in first
    assert data["waits"].keys() == {"data"} and 0.045 <= data["waits"]["data"] < 1.0
    assert data["wall"] == pytest.approx(data["compute"] + data["waits"]["data"])
    assert checkpoint["waits"].keys() == {"checkpoint"}
    assert "waits" not in paused  # an evaluation pass is no step's waiting
    assert end["t"] == "end" and end["job"] == "job"


@_needs("torch")
def test_the_plain_pytorch_example_reports_each_kind(steps_socket: Socket) -> None:
    from examples.plain_pytorch import main

    assert main(["--job", "plain", "--steps", "6", "--checkpoint-every", "3", "--socket",
                 steps_socket.path]) == 0
    got = steps_socket.received()
    steps = [m for m in got if m["t"] == "step"]
    assert len(steps) == 6 and got[-1]["t"] == "end"
    kinds = set().union(*(m.get("waits", {}) for m in steps))
    assert {"data", "checkpoint"} <= kinds
    assert all(m["samples"] == 32 and m["compute"] <= m["wall"] for m in steps)


@_needs("torch", "lightning")
def test_the_lightning_callback_reports_batches_and_checkpoints(
        steps_socket: Socket, tmp_path: Path) -> None:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from examples.lightning_callback import TuimonCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(48, 8), torch.randn(48, 1)), batch_size=8)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path),
                         callbacks=[TuimonCallback("lit", steps_socket.path),
                                    pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path),
                                                                 every_n_train_steps=3)])
    trainer.fit(Tiny(), data)
    got = steps_socket.received()
    steps = [m for m in got if m["t"] == "step"]
    assert len(steps) == 6 and got[-1]["t"] == "end"
    assert all(m["samples"] == 8 and m["rank"] == 0 and m["world"] == 1 for m in steps)
    kinds = set().union(*(m.get("waits", {}) for m in steps))
    assert {"data", "checkpoint"} <= kinds, steps


@_needs("torch", "transformers")
def test_the_hugging_face_callback_reports_steps_and_saves(
        steps_socket: Socket, tmp_path: Path) -> None:
    import torch
    from transformers import Trainer, TrainingArguments

    from examples.hf_trainer_callback import TuimonTrainerCallback

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}

    rows = [{"x": torch.randn(8), "labels": torch.randn(1)} for _ in range(48)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=6,
                             per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             save_steps=3, save_strategy="steps", report_to=[],
                             use_cpu=True, logging_steps=100, disable_tqdm=True)
    trainer = Trainer(model=Tiny(), args=args, train_dataset=rows,
                      callbacks=[TuimonTrainerCallback("hf", steps_socket.path)])
    trainer.train()
    got = steps_socket.received()
    steps = [m for m in got if m["t"] == "step"]
    assert len(steps) == 6 and got[-1]["t"] == "end"
    assert all(m["samples"] == 8 for m in steps)  # 4 a device x 2 accumulated
    kinds = set().union(*(m.get("waits", {}) for m in steps))
    assert {"data", "checkpoint"} <= kinds, steps
