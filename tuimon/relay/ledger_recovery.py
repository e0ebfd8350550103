"""The ledger's recovery from the agents' totals: each agent's cumulative step sums as
this relay last counted them (kept in the `totals` table, written with the minutes they
were counted into), and the run time they show this relay missed (samples lost on the
way, or the relay away: killed, restarted, upgraded) credited evenly over the minutes
between, as much as the trust rule allows (tuimon.model.step_credit).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from tuimon.model.step_credit import JobCredit
from tuimon.relay.ledger_stops import Stops
from tuimon.relay.ledger_store import Pending, log
from tuimon_core.wait_kinds import OTHER, rank_kind

# Rank-seconds the totals must show missing before any is credited (float sums differ by
# less than this from the per-sample ones).
RECOVER_AT_LEAST_S = 0.01


class Totals(NamedTuple):
    """An agent's cumulative sums for a job as the relay counted them."""

    since: float
    wall: float  # rank-seconds
    compute: float
    at: float  # when (the relay's clock)
    ranks: int | None  # ranks of the job the source held then (None: not kept)
    run_ranks: int | None  # the ranks the job's run time was divided by then
    counted: float = 0.0  # rank-seconds the relay had credited it then (this process)
    waits: dict[str, float] | None = None  # cumulative rank-seconds by kind (None: unknown)


class Grant(Protocol):
    """What the trust rule lets one job's source be credited beyond its reports
    (tuimon.model.step_credit.StepCredit, bound to the source's job)."""

    def held(self, source: str) -> int: ...

    def counted(self, source: str) -> float: ...

    def missed(self, source: str, rank_seconds: float, away: float,
               ranks_before: int | None, counted_before: float) -> float: ...


class Recovery:
    """The agents' totals as counted, and the run time they show this relay missed."""

    def __init__(self, path: Path, pending: Pending, stops: Stops) -> None:
        self.path = path  # for the log
        self._pending = pending
        self._stops = stops
        # (source, job) -> the agents' totals as last counted (to write), as the file had
        # them when this relay started (to recover from; ranks None where an older
        # layout did not keep them), and as this relay last counted them.
        self.unwritten: dict[tuple[str, str], Totals] = {}
        self.stored: dict[tuple[str, str], Totals] = {}
        self.last: dict[tuple[str, str], Totals] = {}
        # job -> run seconds credited from the agents' totals for time this relay missed
        # (since it started); and what of it is not yet in the log.
        self.recovered_s: dict[str, float] = {}
        # job -> kind -> run seconds of that recovered time lost, as the ranks' totals
        # named it (`other`: what they did not name, or a source that sent no waits)
        self.recovered_lost_s: dict[str, dict[str, float]] = {}
        self._unsaid: dict[str, list[Any]] = {}

    def load(self, db: sqlite3.Connection) -> None:
        """The totals the file has: what a relay before this one counted."""
        self.stored = {
            (source, job): Totals(since, wall, compute, at, ranks, run_ranks, 0.0,
                                  _stored_waits(waits))
            for source, job, since, wall, compute, at, ranks, run_ranks, waits
            in db.execute("SELECT source, job, since, wall, compute, at, ranks, "
                          "run_ranks, waits FROM totals")}

    def add_totals(self, source: str, entry: dict[str, Any], now: float,
                   credited: JobCredit, grant: Grant) -> None:
        """An agent's cumulative sums for a job (its steps family's `total`), after this
        sample's own sums were added (`credited`: what they counted for). Where the
        totals grew by more than this sample's own sums since this relay last counted
        them (in memory, for samples missed on the way; from the file, for a relay that
        was away), the difference is what this relay missed: credited evenly over the
        minutes between, as much as `grant` allows (the trust rule,
        tuimon.model.step_credit: the time that passed for the ranks the source holds)."""
        total = entry["total"]
        key = (source, entry["id"])
        last = self.last.get(key)
        if last is None:
            last = self.stored.pop(key, None)
        if last is not None:
            self._recover(source, entry, last, now, credited, grant)
        self.last[key] = self.unwritten[key] = Totals(
            total["since"], total["wall"], total["compute"], now, grant.held(source),
            credited.divisor, grant.counted(source), _kinds(total.get("waits")))

    def _recover(self, source: str, entry: dict[str, Any], last: Totals, now: float,
                 credited: JobCredit, grant: Grant) -> None:
        total = entry["total"]
        # This sample's own sums were counted as usual: the gap is what came before them.
        wall = total["wall"] - sum(r.get("wall") or 0.0 for r in entry.get("ranks") or ())
        compute = total["compute"] - sum(r.get("compute") or 0.0
                                         for r in entry.get("ranks") or ())
        wall0, compute0 = last.wall, last.compute
        if total["since"] != last.since:  # the agent counts anew: all it counted is in the gap
            wall0 = compute0 = 0.0
        away = now - last.at
        claimed = wall - wall0
        if away <= 0 or claimed < RECOVER_AT_LEAST_S:
            return  # the usual case: nothing was missed (float sums differ by dust)
        # At most the time missed for each rank the node held then, less what its
        # reports were credited since (this sample's; a row from the file was counted by
        # another process: all this one credited it).
        gap_wall = grant.missed(source, claimed, away, last.ranks, last.counted)
        if gap_wall < RECOVER_AT_LEAST_S:
            return
        gap_compute = min(max(0.0, compute - compute0), gap_wall)
        # What the ranks reported waiting on meanwhile, by kind (their totals' growth,
        # less this sample's own), in the share of the claim that was granted and at most
        # the time lost: the gap's loss booked as they reported it, not as `other`.
        gap_waits: dict[str, float] = {}
        now_waits = _kinds(total.get("waits"))
        if now_waits is not None and (last.waits is not None
                                      or total["since"] != last.since):
            before = last.waits if total["since"] == last.since and last.waits else {}
            own: dict[str, float] = {}
            for r in entry.get("ranks") or ():
                for name, seconds in (r.get("waits") or {}).items():
                    own[rank_kind(name)] = own.get(rank_kind(name), 0.0) + seconds
            for kind, seconds in now_waits.items():
                grown = seconds - own.get(kind, 0.0) - before.get(kind, 0.0)
                if grown > 0:
                    gap_waits[kind] = grown * gap_wall / claimed
            named = sum(gap_waits.values())
            lost = gap_wall - gap_compute
            if named > lost > 0:
                gap_waits = {k: v * lost / named for k, v in gap_waits.items()}
            elif lost <= 0:
                gap_waits = {}
        # Run time of the job as it was then (all its ranks ran while this relay heard
        # none): a relay back after an outage hears the first node before the others.
        ranks = last.run_ranks or credited.world
        job = entry["id"]
        # Evenly over the minutes between: the burn windows see the gap where it was.
        for minute in range(int(last.at // 60), int(now // 60) + 1):
            lo, hi = max(last.at, minute * 60.0), min(now, minute * 60.0 + 60.0)
            if hi > lo:
                part = (hi - lo) / away
                self._pending.add_minute(
                    job, lo, gap_wall * part / ranks, gap_compute * part / ranks,
                    {k: v * part / ranks for k, v in gap_waits.items()})
        self.recovered_s[job] = self.recovered_s.get(job, 0.0) + gap_wall / ranks
        lost_s = self.recovered_lost_s.setdefault(job, {})
        lost_total = max(0.0, gap_wall - gap_compute) / ranks
        for kind, seconds in gap_waits.items():
            lost_s[kind] = lost_s.get(kind, 0.0) + seconds / ranks
            lost_total -= seconds / ranks
        if lost_total > RECOVER_AT_LEAST_S / ranks:
            lost_s[OTHER] = lost_s.get(OTHER, 0.0) + lost_total
        self._stops.ran(job, gap_wall / ranks, last.at, now)
        said = self._unsaid.setdefault(job, [0.0, set(), 0.0])
        said[0] += gap_wall / ranks
        if len(said[1]) < 100_000:
            said[1].add(source)
        said[2] = max(said[2], away)

    def say(self) -> None:
        """Log what was recovered since the last call, once per job."""
        for job, (seconds, sources, away) in self._unsaid.items():
            log.warning("ledger %s: job %s: credited %.0f s of run time this relay missed "
                        "(up to %.0f s away), from the step totals of %d node(s)", self.path,
                        job, seconds, away, len(sources))
        self._unsaid.clear()

    def rows(self) -> list[tuple[Any, ...]]:
        """The `totals` rows counted since the last write."""
        return [(source, job, t.since, t.wall, t.compute, t.at, t.ranks, t.run_ranks,
                 None if t.waits is None else json.dumps(t.waits))
                for (source, job), t in self.unwritten.items()]

    def forget_before(self, at: float) -> None:
        """Totals last counted before `at` (the retention) are no longer recovered from."""
        self.last = {k: v for k, v in self.last.items() if v.at >= at}


def _kinds(waits: Any) -> dict[str, float] | None:
    """A source's cumulative waits by kind, folded as a rank's report is (a rank cannot
    report `stopped`); None where it sent none."""
    if not isinstance(waits, dict):
        return None
    out: dict[str, float] = {}
    for name, seconds in waits.items():
        if isinstance(seconds, (int, float)) and seconds > 0:
            kind = rank_kind(name)
            out[kind] = out.get(kind, 0.0) + float(seconds)
    return out


def _stored_waits(text: object) -> dict[str, float] | None:
    """The `waits` column as written by flush (None: an older layout, or none sent)."""
    if not isinstance(text, str):
        return None  # NULL, or a value no relay wrote
    try:
        return _kinds(json.loads(text))
    except (ValueError, RecursionError):
        return None
