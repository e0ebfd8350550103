"""The relay's SLO ledger: per job, total and effective seconds in per-minute buckets, and
what the rest was spent waiting on (by kind), in SQLite (WAL), kept 30 days.

Step reports arrive as per-sample sums; they are added to buckets in memory and written
in one transaction every `flush_every` seconds (10 by default), so a kill -9 loses at
most that much. WAL with synchronous=NORMAL makes a committed transaction survive the
process dying (only an OS crash can lose the last ones). A write that fails (disk full,
read-only file system, the size cap) is reported with the path and SQLite's reason, the
unwritten minutes stay in memory and are retried; SQLite's rollback leaves the file as
it was, never half written.

`Ledger` puts together the parts, each in its module: the file and what is not yet
written to it (ledger_store), the jobs stopped (ledger_stops), the time recovered from
the agents' totals (ledger_recovery), each job's best ten minutes (ledger_best) and what
viewers and reports read (ledger_summary).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuimon.model.attribution import share
from tuimon.model.slo import DEFAULT_HOURS
from tuimon.model.step_credit import JobCredit
from tuimon.relay import episodes, ledger_store, ledger_summary
from tuimon.relay.ledger_best import Bests
from tuimon.relay.ledger_recovery import Grant, Recovery
from tuimon.relay.ledger_stops import RETURN_S, STOP_AFTER_S, Stops
from tuimon.relay.ledger_store import SCHEMA_VERSION, LedgerError, Pending, log
from tuimon.relay.ledger_summary import SliSeries
from tuimon_core.findings import Finding
from tuimon_core.wait_kinds import split_wait

# The names callers import from here, wherever they are kept.
__all__ = ["RETURN_S", "SCHEMA_VERSION", "STOP_AFTER_S", "Grant", "Ledger", "LedgerError",
           "SliSeries"]

# The wall clock moving this far apart from the monotonic one since start is a jump: a
# prune then would take history the clock only seems to have left behind.
JUMP_S = 3600.0


class Ledger:
    """One relay's ledger file, locked for this process (LedgerError where it cannot be
    had, with the path and the reason): what the relay adds to it, and reads from it."""

    def __init__(self, path: str | Path, *, keep_days: float = 30.0,
                 window_hours: float = DEFAULT_HOURS, max_bytes: int | None = None,
                 stopped_most_h: float = 24.0,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.keep_days = keep_days
        self.window_hours = window_hours
        self.clock = clock
        self._monotonic = monotonic
        self._wall0, self._mono0 = clock(), monotonic()
        self.error: str | None = None
        self.written = 0
        self._pending = Pending()
        self._bests = Bests()
        self._stops = Stops(self.path, stopped_most_h * 3600.0, self._pending)
        self._recovery = Recovery(self.path, self._pending, self._stops)
        # (job, minute) -> kind -> lost seconds not yet put down to a cause
        self._unattributed: dict[tuple[str, int], dict[str, float]] = {}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(f"ledger {self.path}: {exc.strerror or exc}") from None
        self._lock_fd = ledger_store.lock(self.path)
        try:
            self._db = ledger_store.connect(self.path, max_bytes)
            self._bests.load(self._db, int(self.clock() // 60))
            self._recovery.load(self._db)
            self._stops.load(self._db, self._wall0)
            self.episodes = ledger_store.open_episodes(self._db)
        except (OSError, sqlite3.Error) as exc:
            self._unlock()
            raise LedgerError(f"ledger {self.path}: {exc}") from None
        except LedgerError:
            self._unlock()
            raise
        ledger_store.warn_future(self._db, self.path, int(self.clock() // 60))

    @property
    def stopped_most_s(self) -> float:
        """A silence longer than this is taken as the job's end, not counted."""
        return self._stops.most_s

    @property
    def recovered_s(self) -> dict[str, float]:
        """job -> run seconds credited from the agents' totals for time this relay
        missed (since it started)."""
        return self._recovery.recovered_s

    @property
    def recovered_lost_s(self) -> dict[str, dict[str, float]]:
        """job -> kind -> run seconds of that recovered time lost."""
        return self._recovery.recovered_lost_s

    def _unlock(self) -> None:
        fds, self._lock_fd = self._lock_fd, (-1, -1)
        ledger_store.unlock(fds)

    def close(self) -> None:
        self._stops.settle(self.clock(), final=True)
        self.flush()
        self._db.close()
        self._unlock()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ------------------------------------------------------------------

    def add(self, job: str, ts: float, total_s: float, effective_s: float,
            waits: dict[str, float] | None = None, samples: float = 0.0,
            rank_s: float = 0.0) -> None:
        """Run seconds of a job received at `ts`: total, effective, and what the rest
        waited on by kind (run seconds; `other` need not be given: it is the rest); the
        samples processed and the rank-seconds they took, for the job's best. The lost
        time waits to be put down to causes (`attribute`)."""
        if total_s <= 0:
            return
        self._stops.saw(job, ts, total_s)
        if self._pending.add_minute(job, ts, total_s, effective_s, waits, samples, rank_s):
            lost = self._unattributed.setdefault((job, int(ts // 60)), {})
            for kind, seconds in split_wait(waits, max(0.0, total_s - effective_s)).items():
                lost[kind] = lost.get(kind, 0.0) + seconds

    def ended(self, job: str, ts: float) -> None:
        """The job's ranks said the run is complete (at `ts`): its silence from now is
        not lost. A job this ledger does not count is ignored."""
        self._stops.ended(job, ts)

    def note_stops(self, now: float, cause_of: Callable[[str], str],
                   returned: Callable[[str, float], bool] | None = None) -> None:
        """Jobs silent past their time have stopped (put down to what `cause_of` says
        held on their nodes now); a stop longer than `stopped_most` is the job's end; a
        stop whose job came back is written once `returned(job, when)` says every node
        of it that is up has reported since. Call about once a second."""
        self._stops.note(now, cause_of, returned)

    def observe(self, findings: list[Finding], now: float,
                jobs_of: Callable[[Finding], list[str]] | None = None) -> None:
        """What the relay's judgement holds at `now`: its incidents begin, go on and end
        (written at the next flush). Call once a judgement."""
        self.episodes.observe(findings, now, jobs_of)

    def attribute(self, findings_of: Callable[[str], list[Finding]]) -> None:
        """Put the lost time added since the last call down to the findings that
        concern each job now (`findings_of(job)`), as the viewer does (shared by
        tuimon.model.attribution). Call about once a second."""
        for (job, minute), lost in self._unattributed.items():
            for (kind, cause), seconds in share(lost, findings_of(job)).items():
                self.episodes.add_lost(cause, seconds)
                self._pending.add_cause(job, minute // 60, kind, cause, seconds)
        self._unattributed.clear()

    def add_totals(self, source: str, entry: dict[str, Any], now: float,
                   credited: JobCredit, grant: Grant) -> None:
        """An agent's cumulative sums for a job, after this sample's own sums were added:
        what they show this relay missed is credited (ledger_recovery)."""
        self._recovery.add_totals(source, entry, now, credited, grant)

    def flush(self) -> bool:
        """Write the buckets added since the last flush, and the agents' totals they were
        counted up to, in one transaction; False if the disk refused."""
        self._recovery.say()
        if not self._pending.minutes and not self._recovery.unwritten \
                and not self._stops.unwritten() and not self._pending.causes \
                and not self.episodes.dirty:
            if self._bests.due and self.error is None:
                # a job's last minute becomes whole after it stopped
                self._bests.note(self._db, {}, int(self.clock() // 60))
            return self.error is None
        buckets = len(self._pending.minutes)
        totals = self._recovery.rows()
        stops, gone = self._stops.rows(self.clock())
        incidents = [e.row() for e in self.episodes.dirty.values()]
        try:
            ledger_store.write(self._db, self._pending, totals=totals, stops=stops,
                               stops_gone=gone, incidents=incidents)
        except sqlite3.Error as exc:
            message = (f"ledger {self.path}: cannot write {buckets} minute buckets: {exc};"
                       " keeping them in memory and retrying")
            if message != self.error:
                log.error("%s", message)
            self.error = message
            return False
        if self.error is not None:
            log.warning("ledger %s: writing again (%d buckets caught up)", self.path, buckets)
        self.error = None
        self.written += buckets
        oldest: dict[str, int] = {}
        for job, minute in self._pending.minutes:
            oldest[job] = min(minute, oldest.get(job, minute))
        self._bests.note(self._db, oldest, int(self.clock() // 60))
        self._pending.written(int(self.clock() // 3600))
        self._recovery.unwritten.clear()
        self._stops.gone.clear()
        self.episodes.dirty.clear()
        return True

    def prune(self) -> int:
        """Drop buckets older than the retention; returns how many went. A prune the clock
        cannot be trusted for is refused and logged, the ledger being worth more than the
        disk it uses: when the wall clock moved more than an hour apart from the time that
        passed since the relay started (it jumped, and may have written a minute where it
        landed), or when every bucket would go (this relay's clock far ahead of the one
        that wrote them)."""
        jump = (self.clock() - self._wall0) - (self._monotonic() - self._mono0)
        if abs(jump) > JUMP_S:
            log.error("ledger %s: the clock moved %+.1f h apart from the time that passed "
                      "since this relay started; not pruning: check the clock", self.path,
                      jump / 3600)
            return 0
        first = int(self.clock() // 60) - int(self.keep_days * 1440)
        self._recovery.forget_before(first * 60.0)
        return ledger_store.prune(self._db, self.path, first, self.keep_days)

    # -- reading (ledger_summary) -------------------------------------------------------

    def summary(self, now: float | None = None,
                job: str | None = None) -> dict[str, dict[str, Any]]:
        """Per job, its budget over the window and the burn windows as viewers read it;
        `job`: that job in full whether or not it is among the most recent."""
        return ledger_summary.summary(
            self._db, self._pending, self._stops, self._bests, self._recovery,
            now=self.clock() if now is None else now, window_hours=self.window_hours,
            error=self.error, job=job)

    def sli_series(self, job: str, since: float, now: float | None = None) -> SliSeries | None:
        """A job's run time and effective time by period over (since, now]; None where
        it has no minute there."""
        return ledger_summary.sli_series(self._db, self._pending, self._stops, job, since,
                                         self.clock() if now is None else now)

    def incidents(self, since: float, until: float | None = None,
                  job: str | None = None, most: int = 1000) -> list[episodes.Episode]:
        """The episodes that held at any time in [since, until], newest onset first; of
        one job's nodes where `job` is given."""
        return ledger_summary.incidents(self._db, self.episodes, since,
                                        self.clock() if until is None else until, job, most)

    def buckets(self, job: str) -> list[tuple[int, float, float]]:
        """Every stored (minute, total_s, effective_s) of a job, oldest first."""
        return ledger_summary.buckets(self._db, job)
