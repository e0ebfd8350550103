"""The PyTorch helper: importable without torch, CUDA events at the hardware boundary."""

from __future__ import annotations

import socket
from pathlib import Path

from agent.reporter import StepReporter
from agent.reporter_torch import TorchStepTimer
from agent.steps import decode_step


class FakeEvent:
    """Stands in for torch.cuda.Event: the GPU's clock, and whether it got there yet."""

    clock = 0.0
    done = True

    def __init__(self, enable_timing: bool = False) -> None:
        self.t: float | None = None

    def record(self) -> None:
        self.t = FakeEvent.clock

    def query(self) -> bool:
        return FakeEvent.done

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) * 1000.0  # type: ignore[operator]


class FakeCuda:
    Event = FakeEvent


def _server(tmp_path: Path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "s.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.setblocking(False)
    return s, path


def test_without_torch_it_times_with_the_wall_clock(tmp_path: Path) -> None:
    server, path = _server(tmp_path)
    timer = TorchStepTimer(StepReporter("j", 0, 1, socket_path=path), use_cuda=False)
    assert timer.mode == "wall-clock"
    with timer.step(samples=4), timer.waiting():
        pass
    step = decode_step(server.recv(4096))
    assert step["samples"] == 4 and step["compute"] <= step["wall"]


def test_cuda_events_report_gpu_time_once_the_events_complete(tmp_path: Path) -> None:
    server, path = _server(tmp_path)
    timer = TorchStepTimer(StepReporter("j", 0, 1, socket_path=path), cuda=FakeCuda())
    assert timer.mode == "cuda-events"
    FakeEvent.done = False  # the GPU is still behind the Python code
    FakeEvent.clock = 10.0
    with timer.step(samples=8):
        FakeEvent.clock = 10.6
        with timer.waiting():
            FakeEvent.clock = 10.9
        FakeEvent.clock = 11.0
    try:
        server.recv(4096)
        raise AssertionError("reported before the GPU finished")
    except BlockingIOError:
        pass
    FakeEvent.done = True
    timer.flush()
    step = decode_step(server.recv(4096))
    assert abs(step["wall"] - 1.0) < 1e-9 and abs(step["compute"] - 0.7) < 1e-9
    assert step["samples"] == 8
