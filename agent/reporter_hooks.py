"""Steps timed from a training framework's hooks (PyTorch Lightning's callbacks, Hugging
Face `Trainer`'s), for loops the user does not write. Standard library only: the
framework-specific callbacks in `examples/` wrap this.

A framework calls a hook when a step begins and when it ends; between the end of one
step and the start of the next it fetches the next batch (waiting on `data`) and, now
and then, writes a checkpoint (waiting on `checkpoint`: the interval in which the
framework said it saved one). A step counts from the end of the one before (or its own
start, for the first), so that waiting is part of the step it delayed:

    timer = HookTimer(StepReporter(job, rank, world))
    timer.begin()        # the framework's batch/step start hook
    timer.end(samples)   # its batch/step end hook
    timer.saved()        # its checkpoint hook
    timer.finish()       # training ended normally

What the hooks cannot see (collectives inside backward) is compute to them; a loop that
times its all-reduce itself should use `StepReporter.waiting("comm")` or TorchStepTimer.
"""

from __future__ import annotations

import time

from agent.reporter import StepReporter

# A gap longer than this between steps (an evaluation pass, a pause) is no step's waiting.
MAX_GAP_S = 600.0


class HookTimer:
    def __init__(self, reporter: StepReporter) -> None:
        self.reporter = reporter
        self._ended: float | None = None  # when the previous step ended
        self._began: float | None = None
        self._gap_kind = "data"

    def begin(self) -> None:
        self._began = time.perf_counter()

    def saved(self) -> None:
        """A checkpoint was written since the last step ended."""
        self._gap_kind = "checkpoint"

    def end(self, samples: int = 0, tokens: int = 0) -> None:
        now = time.perf_counter()
        began = self._began if self._began is not None else now
        gap = began - self._ended if self._ended is not None else 0.0
        if not 0.0 <= gap <= MAX_GAP_S:
            gap = 0.0
        inside = max(0.0, now - began)
        self.reporter.report(inside + gap, inside, samples, tokens,
                             {self._gap_kind: gap} if gap > 0 else None)
        self._ended, self._began, self._gap_kind = now, None, "data"

    def pause(self) -> None:
        """The loop paused (an evaluation, the end of an epoch): the next gap is no
        step's waiting."""
        self._ended = None

    def finish(self) -> None:
        self.reporter.finish()
