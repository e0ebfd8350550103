"""Simulated training ranks: one rank per GPU reporting steps as real datagrams.

A synchronous data-parallel job: every rank computes, then all wait for the all-reduce.
The step takes as long as the slowest rank's compute plus the all-reduce, so a slow
node (straggler) or a congested leaf switch costs every rank, and the efficiency the
viewer computes drops, as it did in the incident that started this project.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import msgpack

BASE_COMPUTE_S = 1.40
BASE_ALLREDUCE_S = 0.12
SAMPLES_PER_STEP = 32  # per rank


@dataclass
class RankPlan:
    node_index: int
    gpu: int
    rank: int
    slow: Callable[[], float]  # compute multiplier now (> 1: a straggler)


@dataclass
class FabricState:
    """How the fabric and storage slow the all-reduce and the step right now."""

    allreduce_factor: Callable[[], float] = lambda: 1.0
    io_stall_s: Callable[[], float] = lambda: 0.0


class SimJob:
    def __init__(self, name: str, ranks: list[RankPlan], fabric: FabricState,
                 seed: int) -> None:
        self.name = name
        self.ranks = ranks
        self.world = len(ranks)
        self.fabric = fabric
        self.rng = random.Random(seed)
        self._carry = 0.0
        self.seq = 0

    def step_parts(self) -> tuple[float, list[float], float]:
        """(wall of one step, compute of each rank, the step's checkpoint stall). The
        rest of a rank's step is the all-reduce, including the time it waits in it for
        the slowest rank: what a real job's reporter times as `comm`."""
        compute = [BASE_COMPUTE_S * r.slow() * (0.98 + 0.04 * self.rng.random())
                   for r in self.ranks]
        allreduce = BASE_ALLREDUCE_S * self.fabric.allreduce_factor()
        stall = self.fabric.io_stall_s()
        return max(compute) + allreduce + stall, compute, stall

    def datagrams(self, seconds: float, ts: float) -> dict[int, list[bytes]]:
        """The step reports `seconds` of training produce, by node index."""
        out: dict[int, list[bytes]] = {}
        wall, compute, stall = self.step_parts()
        self._carry += seconds / wall
        steps = int(self._carry)
        self._carry -= steps
        if steps > 2:
            # Faster than real time (--speed): one datagram a rank stands for all the
            # steps of this call, so that a simulated hour does not cost a real one.
            wall, compute, batch = wall * steps, [c * steps for c in compute], steps
            stall *= steps
            steps = 1
        else:
            batch = 1
        for _ in range(steps):
            self.seq += 1
            for plan, c in zip(self.ranks, compute):
                out.setdefault(plan.node_index, []).append(msgpack.packb({
                    "v": 1, "t": "step", "job": self.name, "rank": plan.rank,
                    "world": self.world, "local_rank": plan.gpu, "seq": self.seq, "ts": ts,
                    "wall": wall, "compute": c, "samples": SAMPLES_PER_STEP * batch,
                    "tokens": 0,
                    "waits": {"comm": wall - c - stall, "checkpoint": stall} if stall
                    else {"comm": wall - c}}))
        return out
