"""The ledger's stops: a job none of whose ranks reports past its time has stopped, and
its silence is lost time put down to what held on its nodes then. A stop is kept (the
`stops` table) while the job is silent, so a relay restarted meanwhile counts it too,
and written into the minutes it covered once the job is back.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuimon.relay.ledger_store import Pending, log, when
from tuimon_core.protocol.fields import MAX_CAUSE
from tuimon_core.protocol.text import clean
from tuimon_core.timing import JOB_STOPPED_AFTER_S
from tuimon_core.wait_kinds import STOPPED

# A job none of whose ranks reported for this long (or for STOP_GAPS times the longest
# gap between its reports lately, for jobs with long steps) has stopped.
STOP_AFTER_S = JOB_STOPPED_AFTER_S
STOP_GAPS = 4.0
# Reports this soon after a stop are its return: what they credit (a hung collective that
# returns reports its own wait) is not counted again as stopped.
RETURN_S = 5.0
# A stop is written once every node of the job that is up has reported it again (their
# agents' totals then say what ran meanwhile), or this long after its return at most.
SETTLE_MOST_S = 120.0
MAX_SPANS = 64


@dataclass
class Stop:
    """A job whose ranks all fell silent: when the relay saw it so, and why."""

    cause: str
    spans: list[list[float | None]]  # [from, to]; the last one open (None) while silent
    ended: float | None = None  # when it reported again
    credited: float = 0.0  # run seconds its reports credited in the RETURN_S after it
    recovered: float = 0.0  # run seconds the agents' totals showed it ran meanwhile

    def seen(self, now: float) -> list[tuple[float, float]]:
        return [(lo or 0.0, now if hi is None else hi) for lo, hi in self.spans]

    def lost(self, now: float, most: float) -> float:
        """The seconds it counts as stopped: the silence, less what the reports that
        ended it credited beyond the time since (a step that hung and returned brings
        its own wait), and less what the agents' totals show it ran."""
        span = sum(hi - lo for lo, hi in self.seen(now))
        brought = max(0.0, self.credited - RETURN_S)
        return min(most, max(0.0, span - brought - self.recovered))

    def lost_by_minute(self, now: float, most: float) -> dict[int, float]:
        """`lost` as it stands, over the minutes it covers."""
        return per_minute(self.seen(now), self.lost(now, most))


def per_minute(spans: list[tuple[float, float]], seconds: float) -> dict[int, float]:
    """`seconds` spread over the minutes of `spans` in proportion to the time in each."""
    whole = sum(hi - lo for lo, hi in spans)
    out: dict[int, float] = {}
    if whole <= 0 or seconds <= 0:
        return out
    for lo, hi in spans:
        for minute in range(int(lo // 60), int(hi // 60) + 1):
            part = min(hi, minute * 60.0 + 60.0) - max(lo, minute * 60.0)
            if part > 0:
                out[minute] = out.get(minute, 0.0) + seconds * part / whole
    return out


class Stops:
    """Each job's reports as they come (the gaps between them), its stop once it is
    silent past its time, and the stop's lost time booked once the job is back."""

    def __init__(self, path: Path, most_s: float, pending: Pending) -> None:
        self.path = path  # for the log
        self._pending = pending  # where a settled stop's lost time goes
        # A silence longer than this is taken as the job's end, not counted.
        self.most_s = most_s
        # job -> [its last report (wall clock), the longest gap between reports lately]
        self.seen: dict[str, list[float]] = {}
        self.by_job: dict[str, Stop] = {}
        self.gone: set[str] = set()  # rows to delete at the next flush
        # job -> when its ranks said the run is complete (reports soon after are its
        # last steps, not a new run)
        self.ended_at: dict[str, float] = {}

    def load(self, db: sqlite3.Connection, start: float) -> None:
        """The stops a relay before this one saw: counted up to what it saw, and again
        from this relay's start (`start`, the wall clock) while the job stays silent."""
        for job, spans_text, cause in db.execute("SELECT job, spans, cause FROM stops"):
            try:
                spans: list[list[float | None]] = []
                for lo, hi in json.loads(spans_text)[-MAX_SPANS:]:
                    spans.append([float(lo), float(hi)])
            except (ValueError, TypeError):
                log.warning("ledger %s: job %s: an unreadable stop (%r) dropped", self.path,
                            clean(job), spans_text[:80])
                self.gone.add(job)
                continue
            if clean(job) != job:
                self.gone.add(job)  # kept under its clean name from now on
            self.by_job[clean(job)] = Stop(clean(cause)[:MAX_CAUSE],
                                           [*spans, [start, None]])

    def saw(self, job: str, ts: float, total_s: float) -> None:
        """A live report of the job: learn its gaps, end its stop if it had one."""
        if job in self.ended_at and ts - self.ended_at[job] > STOP_AFTER_S:
            del self.ended_at[job]  # the same name runs again
        seen = self.seen.get(job)
        stop = self.by_job.get(job)
        if seen is None:
            self.seen[job] = [ts, 0.0]
        else:
            gap = ts - seen[0]
            if stop is None and gap > 0:  # the gaps of a job that runs, decaying slowly
                seen[1] = max(gap, seen[1] * 0.99)
            seen[0] = max(seen[0], ts)
        if stop is not None:
            if stop.ended is None:
                stop.spans[-1][1] = ts
                stop.ended = ts
            if ts - stop.ended <= RETURN_S:
                stop.credited += total_s

    def ended(self, job: str, ts: float) -> None:
        """The job's ranks said the run is complete (at `ts`): its silence from now is
        not lost. A job not counted here is ignored."""
        if job not in self.seen and job not in self.by_job:
            return
        self.ended_at[job] = ts
        stop = self.by_job.get(job)
        if stop is not None and stop.ended is None:
            del self.by_job[job]
            self.gone.add(job)

    def note(self, now: float, cause_of: Callable[[str], str],
             returned: Callable[[str, float], bool] | None = None) -> None:
        """Jobs silent past their time have stopped (put down to what `cause_of` says
        held on their nodes now); a stop longer than `most_s` is the job's end; a stop
        whose job came back is booked once `returned(job, when)` says
        every node of it that is up has reported since."""
        for job, (last, gap) in list(self.seen.items()):
            if job in self.by_job or now - last <= max(STOP_AFTER_S, STOP_GAPS * gap):
                continue
            if job in self.ended_at:
                del self.seen[job]
                del self.ended_at[job]
                continue
            cause = cause_of(job)[:MAX_CAUSE]
            self.by_job[job] = Stop(cause, [[last, None]])
            log.info("ledger %s: job %s: no step report for %.0f s (%s): counted as stopped "
                     "until it reports again", self.path, job, now - last, cause)
        for job, stop in list(self.by_job.items()):
            if stop.ended is None and stop.lost(now, math.inf) > self.most_s:
                log.warning("ledger %s: job %s: silent for more than %g h: taken as ended, "
                            "its silence not counted", self.path, job, self.most_s / 3600)
                del self.by_job[job]
                self.seen.pop(job, None)
                self.gone.add(job)
        self.settle(now, returned)

    def settle(self, now: float, returned: Callable[[str, float], bool] | None = None,
               final: bool = False) -> None:
        """Stops whose job came back: their lost time into the minutes they covered, once
        its nodes are back (`returned`), or at the latest SETTLE_MOST_S after, or now
        (`final`: the relay is closing)."""
        for job, stop in list(self.by_job.items()):
            if stop.ended is None or now - stop.ended <= RETURN_S:
                continue
            if not final and now - stop.ended <= SETTLE_MOST_S and (
                    returned is None or not returned(job, stop.ended)):
                continue
            del self.by_job[job]
            self.gone.add(job)
            lost = stop.lost(now, self.most_s)
            if lost < RETURN_S + 1.0:  # the step that ended it covered it: a long step
                seen = self.seen.get(job)
                if seen is not None:
                    seen[1] = max(seen[1], stop.ended - (stop.spans[0][0] or 0.0))
                continue
            for minute, seconds in per_minute(stop.seen(now), lost).items():
                self._pending.add_minute(job, minute * 60.0, seconds, 0.0, {STOPPED: seconds})
                self._pending.add_cause(job, minute // 60, STOPPED, stop.cause, seconds)
            log.warning("ledger %s: job %s: its ranks were silent from %s to %s: %.0f s "
                        "counted as stopped (%s)", self.path, job,
                        when(int((stop.spans[0][0] or 0.0) // 60)),
                        when(int(stop.ended // 60)), lost, stop.cause)

    def ran(self, job: str, seconds: float, since: float, now: float) -> None:
        """The agents' totals show the job ran `seconds` evenly over (since, now]: the
        part of that inside its silence was not stopped."""
        stop = self.by_job.get(job)
        if stop is not None:
            away = now - since
            inside = sum(max(0.0, min(hi, now) - max(lo, since)) for lo, hi in stop.seen(now))
            stop.recovered += seconds * inside / away

    def unwritten(self) -> bool:
        """Rows to write: an open stop's spans grow until it is settled."""
        return bool(self.gone or self.by_job)

    def rows(self, now: float) -> tuple[list[tuple[str, str, str]], list[tuple[str]]]:
        """The `stops` rows of the jobs silent now, and the jobs whose row goes."""
        silent = [(job, json.dumps([[lo, hi] for lo, hi in stop.seen(now)]), stop.cause)
                  for job, stop in self.by_job.items() if stop.ended is None]
        gone = [(job,) for job in self.gone if job not in self.by_job]
        return silent, gone
