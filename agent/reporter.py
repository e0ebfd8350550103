"""Step telemetry from a training script to the node's agent: `StepReporter`.

Only the standard library, msgpack and tuimon_core's list of wait kinds: a training
script imports this and nothing else of tuimon. Each finished step is one datagram on a
local Unix socket. Sending never blocks and never raises into the training loop: a
missing agent, a full socket buffer or any error is counted in `dropped` and the step
goes on. A step costs a few microseconds.

    from agent.reporter import StepReporter

    reporter = StepReporter(job="llama-70b", rank=rank, world_size=world)
    for batch in loader:
        with reporter.step(samples=len(batch)):
            with reporter.waiting("data"):     # the input pipeline
                batch = batch.to(device)
            loss = model(batch).backward()
            with reporter.waiting("comm"):     # collectives
                optimizer_step_with_allreduce()

    reporter.finish()                          # the run is complete

compute time = step time - time inside `waiting()`. The kind says what was waited on
(`comm`, `data`, `checkpoint`; `other`, the default): the budget a job loses is put down
to it. A kind this version does not know counts as `other`. A job whose ranks all fall
silent loses that time as `stopped` until they report again; `finish()` says the silence
that follows is the run's end.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator

import msgpack

from tuimon_core.wait_kinds import OTHER, RANK_WORDS, rank_kind

ENV_SOCKET = "TUIMON_STEPS_SOCKET"
MAX_DATAGRAM = 2048


def default_socket_path() -> str:
    """`$TUIMON_STEPS_SOCKET`, else /run/tuimon/steps.sock if that folder exists, else a
    per-user runtime folder, else /tmp."""
    explicit = os.environ.get(ENV_SOCKET)
    if explicit:
        return explicit
    if os.path.isdir("/run/tuimon"):
        return "/run/tuimon/steps.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "tuimon-steps.sock")
    return "/tmp/tuimon-steps.sock"


class StepReporter:
    """Reports each training step's wall time, compute time and samples (or tokens)."""

    def __init__(self, job: str, rank: int, world_size: int, *,
                 socket_path: str | None = None, local_rank: int | None = None) -> None:
        self.job = str(job)[:200]
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.local_rank = local_rank
        self.path = socket_path or default_socket_path()
        self.sent = 0
        self.dropped = 0
        self._seq = 0
        self._wait = 0.0
        self._waits: dict[str, float] = {}
        self._sock: socket.socket | None = None
        try:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        except OSError:
            self._sock = None  # no Unix sockets here: every step is dropped, quietly

    @contextlib.contextmanager
    def step(self, samples: int = 0, tokens: int = 0) -> Iterator[StepReporter]:
        """Time one step; its samples and tokens are counted when it ends."""
        self._wait = 0.0
        self._waits = {}
        t0 = time.perf_counter()
        try:
            yield self
        finally:
            wall = time.perf_counter() - t0
            self._send(wall, max(0.0, wall - self._wait), samples, tokens, self._waits)

    @contextlib.contextmanager
    def waiting(self, kind: str = "other") -> Iterator[None]:
        """Time spent waiting inside the current step, and on what: `comm`
        (collectives), `data` (the input pipeline), `checkpoint`, `other`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            waited = time.perf_counter() - t0
            self._wait += waited
            if kind not in RANK_WORDS:  # inline rank_kind: this runs every step
                kind = OTHER
            waits = self._waits
            waits[kind] = waits.get(kind, 0.0) + waited

    def report(self, wall: float, compute: float, samples: int = 0, tokens: int = 0,
               waits: dict[str, float] | None = None) -> None:
        """Send one step's figures (for callers that time steps themselves); `waits`:
        seconds waited by kind, at most wall - compute (the rest counts as `other`)."""
        named: dict[str, float] = {}
        try:
            for k, v in (waits or {}).items():
                if v > 0:
                    named[rank_kind(k)] = named.get(rank_kind(k), 0.0) + float(v)
        except Exception:  # never into the training loop
            self.dropped += 1
            return
        self._send(wall, compute, samples, tokens, named)

    def _send(self, wall: float, compute: float, samples: int, tokens: int,
              waits: dict[str, float]) -> None:
        try:
            self._seq += 1
            report = {
                "v": 1, "t": "step", "job": self.job, "rank": self.rank,
                "world": self.world_size, "local_rank": self.local_rank, "seq": self._seq,
                "ts": time.time(), "wall": float(wall), "compute": float(compute),
                "samples": int(samples), "tokens": int(tokens), "pid": os.getpid(),
            }
            if waits:
                report["waits"] = waits
            data = msgpack.packb(report)
            if self._sock is None:
                raise OSError("no socket")
            self._sock.sendto(data, self.path)
            self.sent += 1
        except Exception:  # never into the training loop: a missing agent is normal
            self.dropped += 1

    def finish(self) -> None:
        """Say the run is complete (call once, after the last step): the silence that
        follows is not lost time. A crash never gets here, so its silence counts."""
        try:
            self._seq += 1
            data = msgpack.packb({"v": 1, "t": "end", "job": self.job, "rank": self.rank,
                                  "world": self.world_size, "seq": self._seq,
                                  "ts": time.time(), "pid": os.getpid()})
            if self._sock is None:
                raise OSError("no socket")
            self._sock.sendto(data, self.path)
            self.sent += 1
        except Exception:  # never into the training loop
            self.dropped += 1

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
