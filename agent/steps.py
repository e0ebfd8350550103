"""Receiving step telemetry: bounded, validated datagrams, aggregated per job and rank.

Ranks on this node send one datagram per step (agent.reporter). The agent keeps, per
(job, rank), what arrived since the last sample (steps, wall, compute, samples, tokens)
and the running totals that /metrics exports, so PromQL can compute the same SLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import msgpack

from agent.reporter import MAX_DATAGRAM

log = logging.getLogger(__name__)
MAX_RANKS = 4096  # per node: far above any real job, bounds memory against a flood


class StepError(ValueError):
    """A datagram that is not a valid step report."""


def decode_step(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_DATAGRAM:
        raise StepError(f"datagram of {len(data)} bytes exceeds {MAX_DATAGRAM}")
    try:
        m = msgpack.unpackb(data, raw=False, max_str_len=512, max_array_len=16,
                            max_map_len=32, max_bin_len=0, max_ext_len=0)
    except Exception as exc:
        raise StepError(f"not msgpack: {exc}") from None
    if not isinstance(m, dict) or m.get("t") != "step" or m.get("v") != 1:
        raise StepError("not a version 1 step report")
    job, rank, world = m.get("job"), m.get("rank"), m.get("world")
    if not isinstance(job, str) or not job or len(job) > 200:
        raise StepError("job: expected a name of 1 to 200 characters")
    if type(rank) is not int or type(world) is not int or not 0 <= rank < world <= 1 << 20:
        raise StepError(f"rank/world: expected 0 <= rank < world, got {rank!r}/{world!r}")
    out = {"job": job, "rank": rank, "world": world}
    for key in ("wall", "compute"):
        v = m.get(key)
        if type(v) not in (int, float) or not math.isfinite(v) or not 0 <= v <= 86400:
            raise StepError(f"{key}: expected seconds in [0, 86400], got {v!r}")
        out[key] = float(v)
    if out["compute"] > out["wall"] * 1.001 + 1e-6:
        raise StepError("compute time longer than the step")
    for key in ("samples", "tokens"):
        v = m.get(key, 0)
        if type(v) is not int or not 0 <= v <= 1 << 40:
            raise StepError(f"{key}: expected a count, got {v!r}")
        out[key] = v
    return out


@dataclass
class RankTotals:
    world: int
    steps: int = 0
    wall: float = 0.0
    compute: float = 0.0
    samples: int = 0
    tokens: int = 0


@dataclass
class StepAggregator:
    """Per (job, rank): this interval's sums, and totals since the agent started."""

    interval: dict[tuple[str, int], RankTotals] = field(default_factory=dict)
    totals: dict[tuple[str, int], RankTotals] = field(default_factory=dict)
    received: int = 0
    rejected: int = 0
    last_error: str | None = None

    def add(self, data: bytes) -> None:
        try:
            step = decode_step(data)
        except StepError as exc:
            self.rejected += 1
            if self.last_error != str(exc):
                log.warning("step report rejected: %s", exc)
            self.last_error = str(exc)
            return
        key = (step["job"], step["rank"])
        if key not in self.totals and len(self.totals) >= MAX_RANKS:
            self.rejected += 1
            self.last_error = f"more than {MAX_RANKS} ranks on this node"
            return
        self.received += 1
        for table in (self.interval, self.totals):
            t = table.get(key)
            if t is None:
                t = table[key] = RankTotals(step["world"])
            t.world = step["world"]
            t.steps += 1
            t.wall += step["wall"]
            t.compute += step["compute"]
            t.samples += step["samples"]
            t.tokens += step["tokens"]

    def take(self) -> dict[str, Any] | None:
        """This interval's figures for the sample (nil when no rank reported)."""
        if not self.interval and not self.rejected:
            return None
        jobs: dict[str, dict[str, Any]] = {}
        for (job, rank), t in sorted(self.interval.items()):
            entry = jobs.setdefault(job, {"id": job, "world": t.world, "ranks": []})
            entry["ranks"].append({"rank": rank, "steps": t.steps, "wall": t.wall,
                                   "compute": t.compute, "samples": t.samples,
                                   "tokens": t.tokens})
        self.interval = {}
        return {"jobs": list(jobs.values()), "received": self.received,
                "rejected": self.rejected}


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, aggregator: StepAggregator) -> None:
        self.aggregator = aggregator

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.aggregator.add(data)


async def open_step_socket(path: str, aggregator: StepAggregator) -> asyncio.DatagramTransport:
    """Bind the Unix datagram socket ranks send to (world-writable: jobs run as users)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: _Protocol(aggregator), local_addr=path, family=socket.AF_UNIX)
    os.chmod(path, 0o666)
    return transport  # type: ignore[return-value]
