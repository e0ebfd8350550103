"""Who may count for a job, and how much: the trust rule for step telemetry, enforced
here for the relay's SLO ledger and for the viewer's own count alike (docs/security.md,
"trust"). A job's figures come only from its ranks' own reports:

- a (job, rank) belongs to the first source (node) that reports it, until it has been
  silent for `IDLE_S`; the same rank from another source is refused and counted as a
  duplicate, so a node's seconds are counted once;
- a rank must be below its job's world size. A job's world is what its first credited
  report said; only a source that already holds ranks of the job (its launcher's word,
  through ranks it runs) may raise it later, so a node that runs none of the job cannot
  open free ranks in it; a claim that credits no rank changes nothing;
- the run time is rank-seconds over the ranks that report (`run_ranks`: the world, or
  the most ranks the job has had where that is fewer), never over a world nobody fills:
  a claimed world of 2^31 cannot freeze a job's budget;
- a rank is credited at most the time that passed on the counting side's clock: its
  seconds come out of an allowance that grows one second per second, starting at
  `FIRST_S` for a rank never seen and keeping up to `CAP_S` unused (which absorbs
  samples that arrive in bunches after a network stall, and long steps). Time recovered
  from a node's cumulative totals for what its reports did not bring (samples lost on
  the way, an agent unreachable, a relay away) is at most the time missed for each rank
  the node held before it, less what its reports were credited meanwhile (`missed`);
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
# How long a job's world and the most ranks it has had are kept after its last rank was
# forgotten: its nodes unreachable for longer than IDLE_S (their time recovered from their
# totals later) do not make it a new job of the first node back.
JOB_KEEP_S = 3600.0
MAX_GONE_JOBS = 4096  # jobs kept so, at most: a peer rotating job names holds no more


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
    world: int  # the job's world size, as the trust rule keeps it
    wall: float = 0.0  # rank-seconds
    compute: float = 0.0
    samples: int = 0
    ranks: list[RankCredit] = field(default_factory=list)
    waits: dict[str, float] = field(default_factory=dict)  # kind -> rank-seconds
    # The ranks its rank-seconds are divided by for run time: the world, or the ranks
    # that report where fewer do (0: the world).
    run_ranks: int = 0

    @property
    def divisor(self) -> int:
        return self.run_ranks or self.world

    @property
    def total_s(self) -> float:
        """Run time this stands for: rank-seconds over the ranks that make up the run."""
        return self.wall / self.divisor if self.divisor else 0.0

    @property
    def effective_s(self) -> float:
        return self.compute / self.divisor if self.divisor else 0.0

    @property
    def waits_s(self) -> dict[str, float]:
        """Run time waited, by kind (rank-seconds over the run's ranks)."""
        d = self.divisor
        return {k: v / d for k, v in self.waits.items()} if d else {}


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
        # (source, job) -> the ranks of the job that source holds
        self._held: dict[tuple[str, str], set[int]] = {}
        self._job_ranks: dict[str, int] = {}  # job -> ranks held by anyone
        self._world: dict[str, int] = {}
        self._peak: dict[str, int] = {}  # job -> the most ranks held at once
        self._gone: dict[str, float] = {}  # job -> when its last rank was forgotten
        # job -> source -> rank-seconds credited since this counter started
        self._counted: dict[str, dict[str, float]] = {}
        self.duplicates = 0  # rank reports refused: another source owns that rank
        self.invalid = 0  # rank reports refused: rank not below the world size
        self.clipped = 0  # rank reports credited less than they claimed
        self.raises_refused = 0  # world raises refused: the source holds no rank of the job
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
            claimed = int(job.get("world") or 0)
            if not isinstance(name, str) or claimed <= 0:
                continue
            world = self._world_for(source, name, claimed)
            credited = JobCredit(name, world)
            for r in job.get("ranks") or []:
                rank = r.get("rank")
                if not isinstance(rank, int) or not 0 <= rank < world:
                    self.invalid += 1
                    continue
                owned = self._own(source, name, rank, now)
                if owned is None:
                    continue
                wall = max(0.0, float(r.get("wall") or 0.0))
                compute = min(wall, max(0.0, float(r.get("compute") or 0.0)))
                claimed_wait, claimed_wall = wall - compute, wall
                self._top_up(owned, now)
                if wall > owned.allowance:
                    self.clipped += 1
                    compute = compute * owned.allowance / wall
                    wall = owned.allowance
                owned.allowance -= wall
                samples = max(0, int(r.get("samples") or 0))
                if wall < claimed_wall:  # cut by the allowance: its samples in
                    samples = int(samples * wall / claimed_wall)  # proportion, so its
                    # throughput is not raised
                # The waiting credited, in the shares the rank reported it.
                waits = split_wait(r.get("waits"), wall - compute, claimed_wait, rank_kind)
                credited.ranks.append(RankCredit(rank, max(0, int(r.get("steps") or 0)),
                                                 wall, compute, samples, waits))
                credited.wall += wall
                credited.compute += compute
                credited.samples += samples
                add_waits(credited.waits, waits)
            if credited.ranks:
                # A world is kept only once a report of it credits a rank: a claim alone
                # (an empty rank list) changes nothing.
                self._world[name] = world
                counted = self._counted.setdefault(name, {})
                counted[source] = counted.get(source, 0.0) + credited.wall
                credited.run_ranks = self.run_ranks(name)
                out.append(credited)
        return out

    def _world_for(self, source: str, job: str, claimed: int) -> int:
        """The world a source's report of `job` is judged by: the job's, raised to the
        claim only for a source that holds ranks of it (or for a job nobody holds)."""
        known = self._world.get(job)
        if known is None or not self._job_ranks.get(job):
            return claimed
        if claimed > known:
            if self._held.get((source, job)):
                return claimed
            self.raises_refused += 1
        return known

    def _own(self, source: str, job: str, rank: int, now: float) -> _Owned | None:
        """The rank's record if `source` may report it (taking it when free), else None
        (counted)."""
        key = (job, rank)
        owned = self._ranks.get(key)
        if owned is not None and now - owned.last <= self.idle_s:
            if owned.source == source:
                return owned
            self.duplicates += 1
            return None
        if owned is not None:
            self._release(key, owned, now)
        if self._per_source.get(source, 0) >= MAX_RANKS_PER_SOURCE:
            self.invalid += 1
            return None
        self._per_source[source] = self._per_source.get(source, 0) + 1
        self._held.setdefault((source, job), set()).add(rank)
        held = self._job_ranks[job] = self._job_ranks.get(job, 0) + 1
        self._peak[job] = max(held, self._peak.get(job, 0))
        self._gone.pop(job, None)
        owned = self._ranks[key] = _Owned(source, self.first_s, now, now)
        return owned

    def _release(self, key: tuple[str, int], owned: _Owned, now: float) -> None:
        job, rank = key
        del self._ranks[key]
        self._per_source[owned.source] -= 1
        held = self._held.get((owned.source, job))
        if held is not None:
            held.discard(rank)
            if not held:
                del self._held[(owned.source, job)]
        self._job_ranks[job] -= 1
        if not self._job_ranks[job]:
            del self._job_ranks[job]
            self._gone[job] = now

    def _top_up(self, owned: _Owned, now: float) -> None:
        owned.allowance = min(self.cap_s, owned.allowance + max(0.0, now - owned.at))
        owned.at = owned.last = max(owned.at, now)

    def run_ranks(self, job: str) -> int:
        """The ranks a job's rank-seconds are divided by: its world, or the most ranks it
        has had where fewer (so a world nobody fills cannot shrink its run time)."""
        return min(self._world.get(job, 0), self._peak.get(job, 0))

    def held(self, source: str, job: str) -> int:
        """How many ranks of `job` `source` holds now."""
        return len(self._held.get((source, job), ()))

    def counted(self, source: str, job: str) -> float:
        """Rank-seconds of `job` credited to `source` since this counter started."""
        return self._counted.get(job, {}).get(source, 0.0)

    def missed(self, source: str, job: str, rank_seconds: float, away: float,
               ranks_before: int | None, counted_before: float, now: float) -> float:
        """Rank-seconds of `job` that `source` may be credited beyond its reports, for
        time its reports did not reach this counter (samples lost on the way, an agent
        unreachable, this relay away): at most `away` seconds for each rank it held
        `away` ago (`ranks_before`; None where that was not kept: the ranks it holds
        now), less what its reports were credited since (`counted_before`: `counted`
        then). What is granted is spent from its ranks' allowances too, so the same
        time cannot be claimed again by a report."""
        ranks = self.held(source, job) if ranks_before is None else ranks_before
        room = ranks * max(0.0, away) - max(0.0, self.counted(source, job) - counted_before)
        granted = max(0.0, min(rank_seconds, room))
        if granted > 0:
            counted = self._counted.setdefault(job, {})
            counted[source] = counted.get(source, 0.0) + granted
            left = granted
            for rank in sorted(self._held.get((source, job), ())):
                owned = self._ranks[(job, rank)]
                self._top_up(owned, now)
                take = min(owned.allowance, left)
                owned.allowance -= take
                left -= take
                if left <= 0:
                    break
        return granted

    def grant(self, job: str, now: float) -> JobGrant:
        """What `job`'s sources may be credited beyond their reports, at `now`."""
        return JobGrant(self, job, now)

    def _sweep(self, now: float) -> None:
        self._swept = now
        for key in [k for k, o in self._ranks.items() if now - o.last > self.idle_s]:
            self._release(key, self._ranks[key], now)
        gone = sorted(self._gone, key=self._gone.__getitem__)
        over = gone[:max(0, len(gone) - MAX_GONE_JOBS)]  # the oldest, past the bound
        for job in over + [j for j in gone[len(over):] if now - self._gone[j] > JOB_KEEP_S]:
            del self._gone[job]
            self._world.pop(job, None)
            self._peak.pop(job, None)
            self._counted.pop(job, None)

    def owner(self, job: str, rank: int) -> str | None:
        owned = self._ranks.get((job, rank))
        return owned.source if owned else None


@dataclass(frozen=True, slots=True)
class JobGrant:
    """StepCredit's grants for one job at one moment (tuimon.relay.ledger.Grant)."""

    credit: StepCredit
    job: str
    now: float

    def held(self, source: str) -> int:
        return self.credit.held(source, self.job)

    def counted(self, source: str) -> float:
        return self.credit.counted(source, self.job)

    def missed(self, source: str, rank_seconds: float, away: float,
               ranks_before: int | None, counted_before: float) -> float:
        return self.credit.missed(source, self.job, rank_seconds, away, ranks_before,
                                  counted_before, self.now)


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
