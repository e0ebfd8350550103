"""The ledger's read side: what viewers and a run's report read from it. Every reading
adds to the file's minutes those not yet written and the stops still open as they stand,
bounded on both sides (a minute ahead of the clock is in no window).
"""

from __future__ import annotations

import sqlite3
from typing import Any, NamedTuple

from tuimon.model.attribution import FOLDED
from tuimon.model.slo import BURN_WINDOWS_S
from tuimon.relay import episodes
from tuimon.relay.ledger_best import Bests
from tuimon.relay.ledger_recovery import Recovery
from tuimon.relay.ledger_stops import Stops
from tuimon.relay.ledger_store import CAUSES_SENT, EPISODE_COLUMNS, Pending
from tuimon_core.protocol.fields import MAX_BUDGET_JOBS, MAX_CAUSE, MAX_DETAILED_JOBS, MAX_HISTORY
from tuimon_core.protocol.text import clean
from tuimon_core.wait_kinds import STOPPED, WAIT_KINDS, split_wait, wait_kind

# The periods a job's SLI over its run is read by (minutes): the shortest that gives at
# most MAX_HISTORY of them, else whole hours.
SLI_PERIODS_MIN = (1, 5, 15, 60)


class SliSeries(NamedTuple):
    """A job's run time and effective time (seconds) by period, oldest first."""

    start: float  # when the first period begins (Unix time)
    every_s: float  # seconds each period covers
    total_s: list[float]
    effective_s: list[float]


def summary(db: sqlite3.Connection, pending: Pending, stops: Stops, bests: Bests,
            recovery: Recovery, *, now: float, window_hours: float, error: str | None,
            job: str | None = None) -> dict[str, dict[str, Any]]:
    """Per job: since when it is counted, consumed and observed hours over the window,
    the error ratio of each burn window (nil where nothing was observed), what the
    lost hours were spent on and put down to, the hours lost by hour, and whether
    it is stopped now. A stop still open counts as it stands. `job`: that job in
    full (its causes and history) whether or not it is among the most recent (a
    run's report asks for one job)."""
    wanted = job  # (`job` names each job in the loops below)
    minute_now = int(now // 60)
    windows = {"run": window_hours * 3600}
    windows.update(BURN_WINDOWS_S)
    first_run = minute_now - int(windows["run"] // 60)
    # The stops still open, as minutes of lost time (written once the job is back).
    stopped: dict[str, dict[int, float]] = {
        job: stop.lost_by_minute(now, stops.most_s) for job, stop in stops.by_job.items()}
    sums: dict[str, dict[str, Any]] = {}

    def add(job: str, key: str, total: float, effective: float) -> None:
        entry = sums.setdefault(job, {"windows": {}})
        t, e = entry["windows"].get(key, (0.0, 0.0))
        entry["windows"][key] = (t + total, e + effective)

    for key, seconds in windows.items():
        first = minute_now - int(seconds // 60)
        # Bounded on both sides: a minute from the future (a clock that ran ahead)
        # is in no window, so it cannot count in every window for ever.
        for job, total, effective in db.execute(
                "SELECT job, SUM(total_s), SUM(effective_s) FROM buckets "
                "WHERE minute > ? AND minute <= ? GROUP BY job", (first, minute_now)):
            add(clean(job), key, total or 0.0, effective or 0.0)
        for (job, minute), bucket in pending.minutes.items():
            if first < minute <= minute_now:
                add(job, key, bucket[0], bucket[1])
        for job, minutes in stopped.items():
            add(job, key, sum(v for m, v in minutes.items() if first < m <= minute_now),
                0.0)
    # What the run window's lost time waited on, by named kind; `other` is the rest.
    named: dict[str, dict[str, float]] = {}
    for job, kind, seconds in db.execute(
            "SELECT job, kind, SUM(seconds) FROM waits WHERE minute > ? AND minute <= ? "
            "GROUP BY job, kind", (first_run, minute_now)):
        by_kind = named.setdefault(clean(job), {})
        by_kind[wait_kind(kind)] = by_kind.get(wait_kind(kind), 0.0) + (seconds or 0.0)
    for (job, minute, kind), seconds in pending.waits.items():
        if first_run < minute <= minute_now:
            by_kind = named.setdefault(job, {})
            by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    for job, minutes in stopped.items():
        by_kind = named.setdefault(job, {})
        by_kind[STOPPED] = by_kind.get(STOPPED, 0.0) + sum(
            v for m, v in minutes.items() if first_run < m <= minute_now)
    causes = _causes(db, pending, stops, first_run, minute_now, stopped)
    since = {clean(job): minute for job, minute in db.execute(
        "SELECT job, MIN(minute) FROM buckets WHERE minute <= ? GROUP BY job",
        (minute_now,))}
    for (job, minute) in pending.minutes:
        since[job] = min(since.get(job, minute), minute)
    out: dict[str, dict[str, Any]] = {}
    # What a viewer reads in one batch: the jobs seen most recently (their causes and
    # history for fewer still).
    latest = {clean(job): minute for job, minute in db.execute(
        "SELECT job, MAX(minute) FROM buckets WHERE minute <= ? GROUP BY job",
        (minute_now,))}
    for job, minute in pending.minutes:
        latest[job] = max(latest.get(job, minute), minute)
    for job in stops.by_job:
        latest[job] = minute_now
    recent = sorted(sums, key=lambda j: latest.get(j, 0), reverse=True)
    asked = [wanted] if wanted in sums else []
    sums = {name: sums[name] for name in [*recent[:MAX_BUDGET_JOBS], *asked]}
    detailed = {*recent[:MAX_DETAILED_JOBS], *asked}
    history = _history(db, pending, first_run, minute_now, stopped, detailed)
    for job, entry in sums.items():
        total, effective = entry["windows"].get("run", (0.0, 0.0))
        ratios = {}
        for key in BURN_WINDOWS_S:
            t, e = entry["windows"].get(key, (0.0, 0.0))
            ratios[key] = 1 - e / t if t > 0 else None
        # The named waits as shares of the time lost; the rest is `other`.
        spent = split_wait(named.get(job), max(0.0, total - effective))
        doc: dict[str, Any] = {
            "since": since.get(job, minute_now) * 60.0, "window_h": window_hours,
            "consumed_h": (total - effective) / 3600,
            "spent_h": {k: spent[k] / 3600 for k in WAIT_KINDS if k in spent},
            "observed_h": total / 3600, "error_ratio": ratios, "error": error}
        if recovery.recovered_s.get(job):
            doc["recovered_h"] = recovery.recovered_s[job] / 3600
            doc["recovered_spent_h"] = {
                k: v / 3600 for k, v in (recovery.recovered_lost_s.get(job) or {}).items()}
        best = bests.best.get(job)
        if best is not None and best.value is not None:
            doc["best_per_gpu"] = best.value
            doc["best_at"] = best.at
        if causes.get(job) and job in detailed:
            doc["causes_h"] = causes[job]
        if job in history and job in detailed:
            doc["lost_from"], doc["lost_every_h"], doc["lost_h"] = history[job]
        stop = stops.by_job.get(job)
        if stop is not None and stop.ended is None:
            doc["stopped_since"] = stop.spans[0][0]
            doc["stopped_cause"] = stop.cause
        out[job] = doc
    return out


def _causes(db: sqlite3.Connection, pending: Pending, stops: Stops, first: int, last: int,
            stopped: dict[str, dict[int, float]]) -> dict[str, dict[str, dict[str, float]]]:
    """job -> kind -> cause -> hours over the minutes (first, last], the CAUSES_SENT
    largest of each kind, the rest as FOLDED."""
    table: dict[str, dict[str, dict[str, float]]] = {}

    def add(job: str, kind: str, cause: str, seconds: float) -> None:
        by_cause = table.setdefault(job, {}).setdefault(wait_kind(kind), {})
        by_cause[cause] = by_cause.get(cause, 0.0) + seconds

    for job, kind, cause, seconds in db.execute(
            "SELECT job, kind, cause, SUM(seconds) FROM causes WHERE hour > ? AND "
            "hour <= ? GROUP BY job, kind, cause", (first // 60, last // 60)):
        add(clean(job), kind, clean(cause)[:MAX_CAUSE], seconds or 0.0)
    for (job, hour, kind, cause), seconds in pending.causes.items():
        if first // 60 < hour <= last // 60:
            add(job, kind, cause, seconds)
    for job, minutes in stopped.items():
        add(job, STOPPED, stops.by_job[job].cause,
            sum(v for m, v in minutes.items() if first < m <= last))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for job, kinds in table.items():
        for kind, by_cause in kinds.items():
            ranked = sorted(by_cause.items(), key=lambda kv: -kv[1])
            kept = dict(ranked[:CAUSES_SENT])
            rest = sum(v for _, v in ranked[CAUSES_SENT:])
            if rest > 0:
                kept[FOLDED] = kept.get(FOLDED, 0.0) + rest
            hours = {c: v / 3600 for c, v in kept.items() if v > 0}
            if hours:
                out.setdefault(job, {})[kind] = hours
    return out


def _history(db: sqlite3.Connection, pending: Pending, first: int, last: int,
             stopped: dict[str, dict[int, float]], jobs: set[str]
             ) -> dict[str, tuple[float, float, list[float]]]:
    """job -> (start, hours each entry covers, the hours lost in each, oldest first):
    from the job's first minute in the window, at most MAX_HISTORY entries."""
    lost: dict[str, dict[int, float]] = {}
    names = sorted(jobs)
    for job, hour, seconds in db.execute(
            "SELECT job, minute / 60, SUM(total_s - effective_s) FROM buckets WHERE "
            f"minute > ? AND minute <= ? AND job IN ({','.join('?' * len(names))}) "
            "GROUP BY job, minute / 60", (first, last, *names)):
        by_minute = lost.setdefault(clean(job), {})
        by_minute[hour * 60] = by_minute.get(hour * 60, 0.0) + (seconds or 0.0)
    for (job, minute), bucket in pending.minutes.items():
        if first < minute <= last and job in jobs:
            by_minute = lost.setdefault(job, {})
            by_minute[minute] = by_minute.get(minute, 0.0) + bucket[0] - bucket[1]
    for job, minutes in stopped.items():
        if job not in jobs:
            continue
        by_minute = lost.setdefault(job, {})
        for minute, seconds in minutes.items():
            if first < minute <= last:
                by_minute[minute] = by_minute.get(minute, 0.0) + seconds
    out = {}
    for job, by_minute in lost.items():
        if not by_minute:
            continue
        start = min(by_minute) // 60 * 60  # the hour of its first minute
        hours = (last - start) // 60 + 1
        every = max(1, -(-hours // MAX_HISTORY))  # hours per entry
        entries = [0.0] * (-(-hours // every))
        for minute, seconds in by_minute.items():
            entries[min(len(entries) - 1, (minute - start) // 60 // every)] += \
                max(0.0, seconds) / 3600
        out[job] = (start * 60.0, float(every), entries)
    return out


def sli_series(db: sqlite3.Connection, pending: Pending, stops: Stops, job: str,
               since: float, now: float) -> SliSeries | None:
    """A job's run time and effective time by period over (since, now], from its
    first minute there: at most MAX_HISTORY periods of 1, 5, 15 or 60 minutes or of
    whole hours, the shortest that fits (a run of an hour is drawn by the minute, one
    of a month by three hours); None where it has no minute there. Read as `summary`
    reads the minutes (the file's, those not yet written, a stop's lost time as it
    stands), bounded on both sides, so its sums are the summary's over the same
    range."""
    first, last = int(since // 60), int(now // 60)
    minutes: dict[int, list[float]] = {}

    def add(minute: int, total: float, effective: float) -> None:
        if first < minute <= last:
            sums = minutes.setdefault(minute, [0.0, 0.0])
            sums[0] += total
            sums[1] += effective

    for minute, total, effective in db.execute(
            "SELECT minute, total_s, effective_s FROM buckets WHERE job = ? AND "
            "minute > ? AND minute <= ?", (job, first, last)):
        add(minute, total or 0.0, effective or 0.0)
    for (name, minute), bucket in pending.minutes.items():
        if name == job:
            add(minute, bucket[0], bucket[1])
    stop = stops.by_job.get(job)
    if stop is not None:
        for minute, seconds in stop.lost_by_minute(now, stops.most_s).items():
            add(minute, seconds, 0.0)
    if not minutes:
        return None
    span = last - min(minutes) + 1
    every = next((m for m in SLI_PERIODS_MIN if -(-span // m) <= MAX_HISTORY),
                 60 * -(-span // (60 * MAX_HISTORY)))
    start = min(minutes) // every * every
    total = [0.0] * ((last - start) // every + 1)
    effective = list(total)
    for minute, (t, e) in minutes.items():
        total[(minute - start) // every] += t
        effective[(minute - start) // every] += e
    return SliSeries(start * 60.0, every * 60.0, total, effective)


def buckets(db: sqlite3.Connection, job: str) -> list[tuple[int, float, float]]:
    """Every stored (minute, total_s, effective_s) of a job, oldest first."""
    return list(db.execute(
        "SELECT minute, total_s, effective_s FROM buckets WHERE job = ? ORDER BY minute",
        (job,)))


def incidents(db: sqlite3.Connection, held: episodes.Episodes, since: float, until: float,
              job: str | None, most: int) -> list[episodes.Episode]:
    """The episodes that held at any time in [since, until], newest onset first: the
    file's, with those not yet written as they stand in memory; of one job's nodes
    where `job` is given."""
    found: dict[int, episodes.Episode] = {}
    for row in db.execute(
            f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE onset <= ? AND "
            "(ended IS NULL OR ended >= ?) ORDER BY onset DESC LIMIT ?",
            (until, since, most)):
        e = episodes.read(row)
        if e is not None:
            found[e.id] = e
    live = [*held.dirty.values(), *held.open.values()]
    for e in live:
        if e.onset <= until and (e.ended is None or e.ended >= since):
            found[e.id] = e
    out = sorted(found.values(), key=lambda e: -e.onset)
    if job is not None:
        out = [e for e in out if job in e.jobs]
    return out[:most]

