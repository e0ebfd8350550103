"""Step timing for PyTorch training loops: CUDA events when torch and a GPU are there,
the wall clock otherwise. Importable without torch.

CUDA work is asynchronous: a step's Python code returns before its kernels finish, so the
wall clock around it measures launch time, not GPU time. This helper records CUDA events
around the step and around each wait, and reports a step once its events have completed
(polled with `query()`, never synchronised): reports lag a step or two, and the training
loop is never stalled.

    reporter = StepReporter("llm-pretrain", rank, world_size)
    timer = TorchStepTimer(reporter)
    for batch in loader:
        with timer.step(samples=len(batch)):
            loss = model(batch); loss.backward()
            with timer.waiting("comm"):
                all_reduce_gradients()
            optimizer.step()
"""

from __future__ import annotations

import contextlib
import importlib
from collections import deque
from collections.abc import Iterator
from typing import Any

from agent.reporter import StepReporter

MAX_PENDING = 64  # steps whose events have not completed yet; older ones are dropped


def _cuda() -> Any | None:
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return None
    try:
        return torch.cuda if torch.cuda.is_available() else None
    except Exception:
        return None


class TorchStepTimer:
    def __init__(self, reporter: StepReporter, cuda: Any | None = None,
                 use_cuda: bool = True) -> None:
        self.reporter = reporter
        self.cuda = (cuda if cuda is not None else _cuda()) if use_cuda else None
        self._pending: deque[tuple[Any, Any, list[tuple[Any, Any, str]], int, int]] = deque()
        self._waits: list[tuple[Any, Any, str]] = []
        self._wall_wait = 0.0

    @property
    def mode(self) -> str:
        return "cuda-events" if self.cuda is not None else "wall-clock"

    @contextlib.contextmanager
    def step(self, samples: int = 0, tokens: int = 0) -> Iterator[TorchStepTimer]:
        if self.cuda is None:
            with self.reporter.step(samples, tokens):
                yield self
            return
        start = self.cuda.Event(enable_timing=True)
        end = self.cuda.Event(enable_timing=True)
        self._waits = []
        start.record()
        try:
            yield self
        finally:
            end.record()
            self._pending.append((start, end, self._waits, samples, tokens))
            while len(self._pending) > MAX_PENDING:
                self._pending.popleft()
                self.reporter.dropped += 1
            self.flush()

    @contextlib.contextmanager
    def waiting(self, kind: str = "other") -> Iterator[None]:
        """As StepReporter.waiting: `comm`, `data`, `checkpoint` or `other`."""
        if self.cuda is None:
            with self.reporter.waiting(kind):
                yield
            return
        a = self.cuda.Event(enable_timing=True)
        b = self.cuda.Event(enable_timing=True)
        a.record()
        try:
            yield
        finally:
            b.record()
            self._waits.append((a, b, kind))

    def finish(self) -> None:
        """The run is complete: report the steps still pending (waiting for their events
        once: the loop is over) and say so (StepReporter.finish)."""
        try:
            if self._pending:
                self._pending[-1][1].synchronize()
        except Exception:  # never into the training script
            self.reporter.dropped += 1
        self.flush()
        self.reporter.finish()

    def flush(self) -> None:
        """Report every step whose events have completed, oldest first, without waiting."""
        try:
            while self._pending and self._pending[0][1].query():
                start, end, waits, samples, tokens = self._pending.popleft()
                wall = start.elapsed_time(end) / 1000.0  # milliseconds to seconds
                by_kind: dict[str, float] = {}
                for a, b, kind in waits:
                    by_kind[kind] = by_kind.get(kind, 0.0) + a.elapsed_time(b) / 1000.0
                waited = sum(by_kind.values())
                self.reporter.report(wall, max(0.0, wall - waited), samples, tokens, by_kind)
        except Exception:  # never into the training loop
            self._pending.clear()
            self.reporter.dropped += 1
