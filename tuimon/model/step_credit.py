"""How much training time a node's step sums may count for: each (job, rank) from one
source only, and never more than the time that passed.

Used by the relay's SLO ledger and by the viewer's own count (the efficiency view), so a
target that lies cannot write hours into a budget (docs/security.md, "trust"):

- a (job, rank) belongs to the first source (node) that reports it, until it has been
  silent for `IDLE_S`; the same rank from another source is refused and counted as a
  duplicate, so a node's seconds are counted once;
- a rank must be below its job's world size;
- a rank is credited at most the time that passed on the counting side's clock: its
  seconds come out of an allowance that grows one second per second, starting at
  `FIRST_S` for a rank never seen and keeping up to `CAP_S` unused (which absorbs
  samples that arrive in bunches after a network stall, and long steps);
- a source (one node) is credited at most `MAX_RANKS_PER_SOURCE` ranks.

The agent applies the same kind of allowance to each datagram (agent.steps); this is the
second line, for targets that are not our agent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuimon_core.protocol.fields import (
    MAX_COUNT,
    MAX_JOBS,
    MAX_RANKS,
    STEP_RANK_FIELDS,
    WAITS,
)
from tuimon_core.wait_kinds import add_waits, rank_kind, split_wait

CAP_S = 600.0
FIRST_S = 15.0
IDLE_S = 600.0
MAX_RANKS_PER_SOURCE = 1024


@dataclass(slots=True)
class RankCredit:
    rank: int
    steps: int
    wall: float  # credited rank-seconds
    compute: float
    samples: int
    waits: dict[str, float] = field(default_factory=dict)  # kind -> rank-seconds


@dataclass(slots=True)
class JobCredit:
    """One job's credited sums from one sample (or several merged)."""

    job: str
    world: int
    wall: float = 0.0  # rank-seconds
    compute: float = 0.0
    samples: int = 0
    ranks: list[RankCredit] = field(default_factory=list)
    waits: dict[str, float] = field(default_factory=dict)  # kind -> rank-seconds

    @property
    def total_s(self) -> float:
        """Run time this stands for: rank-seconds over the world size."""
        return self.wall / self.world if self.world else 0.0

    @property
    def effective_s(self) -> float:
        return self.compute / self.world if self.world else 0.0

    @property
    def waits_s(self) -> dict[str, float]:
        """Run time waited, by kind (rank-seconds over the world size)."""
        return {k: v / self.world for k, v in self.waits.items()} if self.world else {}


@dataclass(slots=True)
class _Owned:
    source: str
    allowance: float
    at: float
    last: float


class StepCredit:
    """Per (job, rank): who may report it and how much time it has left to claim."""

    def __init__(self, cap_s: float = CAP_S, idle_s: float = IDLE_S,
                 first_s: float = FIRST_S) -> None:
        self.cap_s = cap_s
        self.idle_s = idle_s
        self.first_s = first_s
        self._per_source: dict[str, int] = {}
        self._ranks: dict[tuple[str, int], _Owned] = {}
        self._world: dict[str, int] = {}
        self.duplicates = 0  # rank reports refused: another source owns that rank
        self.invalid = 0  # rank reports refused: rank not below the world size
        self.clipped = 0  # rank reports credited less than they claimed
        self._swept = 0.0

    def credit(self, source: str, steps: dict[str, Any] | None,
               now: float) -> list[JobCredit]:
        """What one source's step sums may count for at `now` (seconds, the counting
        side's clock)."""
        if not steps:
            return []
        if now - self._swept >= 60.0:
            self._sweep(now)
        out = []
        for job in steps.get("jobs") or []:
            name = job.get("id")
            world = int(job.get("world") or 0)
            if not isinstance(name, str) or world <= 0:
                continue
            # A job's world only grows: a source claiming world 1 cannot make one rank's
            # seconds count as the whole job's.
            world = self._world[name] = max(world, self._world.get(name, 0))
            credited = JobCredit(name, world)
            for r in job.get("ranks") or []:
                rank = r.get("rank")
                if not isinstance(rank, int) or not 0 <= rank < world:
                    self.invalid += 1
                    continue
                owned = self._ranks.get((name, rank))
                if owned is None or now - owned.last > self.idle_s:
                    if owned is not None:
                        self._per_source[owned.source] -= 1
                    if self._per_source.get(source, 0) >= MAX_RANKS_PER_SOURCE:
                        self.invalid += 1
                        continue
                    self._per_source[source] = self._per_source.get(source, 0) + 1
                    owned = self._ranks[(name, rank)] = _Owned(source, self.first_s, now, now)
                elif owned.source != source:
                    self.duplicates += 1
                    continue
                wall = max(0.0, float(r.get("wall") or 0.0))
                compute = min(wall, max(0.0, float(r.get("compute") or 0.0)))
                claimed_wait, claimed = wall - compute, wall
                owned.allowance = min(self.cap_s, owned.allowance + max(0.0, now - owned.at))
                owned.at = owned.last = max(owned.at, now)
                if wall > owned.allowance:
                    self.clipped += 1
                    compute = compute * owned.allowance / wall
                    wall = owned.allowance
                owned.allowance -= wall
                samples = max(0, int(r.get("samples") or 0))
                if wall < claimed:  # cut by the allowance: its samples in proportion, so
                    samples = int(samples * wall / claimed)  # its throughput is not raised
                # The waiting credited, in the shares the rank reported it.
                waits = split_wait(r.get("waits"), wall - compute, claimed_wait, rank_kind)
                credited.ranks.append(RankCredit(rank, max(0, int(r.get("steps") or 0)),
                                                 wall, compute, samples, waits))
                credited.wall += wall
                credited.compute += compute
                credited.samples += samples
                add_waits(credited.waits, waits)
            if credited.ranks:
                out.append(credited)
        return out

    def _sweep(self, now: float) -> None:
        self._swept = now
        for key in [k for k, o in self._ranks.items() if now - o.last > self.idle_s]:
            self._per_source[self._ranks.pop(key).source] -= 1
        alive = {job for job, _ in self._ranks}
        for job in [j for j in self._world if j not in alive]:
            del self._world[job]

    def owner(self, job: str, rank: int) -> str | None:
        owned = self._ranks.get((job, rank))
        return owned.source if owned else None


# The summed fields and their upper bounds (an Int's or a Num's `hi`).
_SUMMED: tuple[tuple[str, float], ...] = tuple(
    (f.key, getattr(f.type, "hi")) for f in STEP_RANK_FIELDS  # noqa: B009
    if f.key in ("steps", "wall", "compute", "samples", "tokens"))


WAIT_MOST: float = getattr(WAITS.value, "hi")  # noqa: B009


def merge_steps(older: dict[str, Any] | None,
                newer: dict[str, Any] | None) -> dict[str, Any] | None:
    """Add two samples' step sums, so whoever sees only the newer sample misses nothing
    (a relay's slow viewer; a viewer whose screen ticks slower than the agents sample)."""
    if not older:
        return newer
    if not newer:
        return older
    jobs: dict[str, dict[str, Any]] = {}
    for section in (older, newer):
        for job in section.get("jobs") or []:
            into = jobs.setdefault(job["id"], {"id": job["id"], "world": 0, "ranks": {}})
            into["world"] = max(into["world"], int(job.get("world") or 0))
            if job.get("lost"):
                into["lost"] = min(MAX_COUNT, into.get("lost", 0) + job["lost"])
            for latest in ("windows", "total", "drop"):  # the newer one says it all
                if job.get(latest) is not None:
                    into[latest] = job[latest]
                elif section is newer:
                    into.pop(latest, None)
            for r in job.get("ranks") or []:
                acc = into["ranks"].setdefault(r["rank"], {"rank": r["rank"]})
                for key, most in _SUMMED:
                    if r.get(key) is not None:
                        # Within the field's bound: the merged sums are sent on, and a
                        # reader refuses what its type does not allow.
                        acc[key] = min(most, acc.get(key, 0) + r[key])
                if r.get("waits"):
                    waits = acc.setdefault("waits", {})
                    add_waits(waits, r["waits"], rank_kind)
                    for kind, seconds in waits.items():  # within the field's bound, too
                        waits[kind] = min(WAIT_MOST, seconds)
    out = dict(newer)
    # Within the family's bounds too: the merged sums are sent on by a relay.
    out["jobs"] = [{**j, "ranks": list(j["ranks"].values())[:MAX_RANKS]}
                   for j in list(jobs.values())[:MAX_JOBS]]
    return out
