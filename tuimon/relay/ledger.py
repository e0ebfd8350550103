"""The relay's SLO ledger: per job, total and effective seconds in per-minute buckets, and
what the rest was spent waiting on (by kind), in SQLite (WAL), kept 30 days.

Step reports arrive as per-sample sums; they are added to buckets in memory and written
in one transaction every `flush_every` seconds (10 by default), so a kill -9 loses at
most that much. WAL with synchronous=NORMAL makes a committed transaction survive the
process dying (only an OS crash can lose the last ones). A write that fails (disk full,
read-only file system, the size cap) is reported with the path and SQLite's reason, the
unwritten minutes stay in memory and are retried; SQLite's rollback leaves the file as
it was, never half written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from tuimon.model.attribution import FOLDED, share
from tuimon.model.efficiency import BEST_COVERED, BEST_WINDOW_S, Best
from tuimon.model.slo import BURN_WINDOWS_S, DEFAULT_HOURS
from tuimon.model.step_credit import JobCredit
from tuimon.relay import episodes
from tuimon_core.errors import UsageError
from tuimon_core.findings import Finding
from tuimon_core.protocol.fields import (
    MAX_BUDGET_JOBS,
    MAX_CAUSE,
    MAX_DETAILED_JOBS,
    MAX_HISTORY,
)
from tuimon_core.protocol.schema import MAX_NUM
from tuimon_core.protocol.text import clean
from tuimon_core.timing import JOB_STOPPED_AFTER_S
from tuimon_core.wait_kinds import OTHER, STOPPED, WAIT_KINDS, rank_kind, split_wait, wait_kind

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS buckets (
    job TEXT NOT NULL,
    minute INTEGER NOT NULL,      -- Unix time // 60, on the relay's clock (receive time)
    total_s REAL NOT NULL,        -- run time in the minute (rank-seconds / world)
    effective_s REAL NOT NULL,    -- compute time in the minute (rank-seconds / world)
    PRIMARY KEY (job, minute)
) WITHOUT ROWID;
"""
# The agents' cumulative step sums as this relay last counted them, written in the same
# transaction as the minutes they were counted into: a relay that was away (killed,
# restarted, upgraded) recovers the time it missed from them.
TOTALS_SCHEMA = """
CREATE TABLE IF NOT EXISTS totals (
    source TEXT NOT NULL,         -- the agent (target)
    job TEXT NOT NULL,
    since REAL NOT NULL,          -- the agent's `since`: another value is another count
    wall REAL NOT NULL,           -- rank-seconds, cumulative, as last counted
    compute REAL NOT NULL,
    at REAL NOT NULL,             -- when (the relay's clock)
    PRIMARY KEY (source, job)
) WITHOUT ROWID;
"""
# Added to `totals` in layout 4: how many ranks of the job the source held when its totals
# were last counted, and the ranks the job's run time was divided by then. A relay back
# after an outage credits at most the outage for each rank the source held
# (docs/security.md), as run time of the job as it was: a row without them (an older
# layout) is bounded by the ranks the source holds when it is read, over the job's world.
TOTALS_COLUMNS_4 = ("ranks", "run_ranks")
# Added to `totals` in layout 6: the source's cumulative waits by kind (JSON), as last
# counted, so the lost time of a gap the relay missed is booked as the kinds the ranks
# reported meanwhile; NULL (an older layout, an agent that sends none): booked as `other`.
TOTALS_COLUMN_6 = "waits"
# What each minute's lost time (total - effective) was spent waiting on, by kind (since
# schema 1): the budget's loss by its cause. Time no kind names is `other`.
WAITS_SCHEMA = """
CREATE TABLE IF NOT EXISTS waits (
    job TEXT NOT NULL,
    minute INTEGER NOT NULL,
    kind TEXT NOT NULL,           -- comm, data, checkpoint (tuimon_core.wait_kinds)
    seconds REAL NOT NULL,        -- run time waited (rank-seconds / world)
    PRIMARY KEY (job, minute, kind)
) WITHOUT ROWID;
"""
WAITS_UPSERT = """
INSERT INTO waits (job, minute, kind, seconds) VALUES (?, ?, ?, ?)
ON CONFLICT (job, minute, kind) DO UPDATE SET seconds = seconds + excluded.seconds
"""
# What each minute's lost time (its waits by kind, `stopped` and the unnamed rest
# included) was put down to, since layout 3: the findings that held on the job's nodes
# as the relay judged them, shared by tuimon.model.attribution.
CAUSES_SCHEMA = """
CREATE TABLE IF NOT EXISTS causes (
    job TEXT NOT NULL,
    hour INTEGER NOT NULL,        -- Unix time // 3600: by hour, the run's split needs no more
    kind TEXT NOT NULL,           -- a wait kind, or `stopped`
    cause TEXT NOT NULL,          -- `congestion gpu042 mlx5_0:1`, `node lost gpu042`, ...
    seconds REAL NOT NULL,        -- run time (rank-seconds / world)
    PRIMARY KEY (job, hour, kind, cause)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS causes_by_hour ON causes (hour);
"""
CAUSES_UPSERT = """
INSERT INTO causes (job, hour, kind, cause, seconds) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (job, hour, kind, cause) DO UPDATE SET seconds = seconds + excluded.seconds
"""
# Jobs whose ranks all fell silent, while they are (since layout 3): a relay restarted
# meanwhile counts the spans the relays before it saw, and again from its own start.
STOPS_SCHEMA = """
CREATE TABLE IF NOT EXISTS stops (
    job TEXT NOT NULL PRIMARY KEY,
    spans TEXT NOT NULL,          -- JSON [[from, to], ...]: the times the silence was seen
    cause TEXT NOT NULL           -- what held on its nodes when it stopped
) WITHOUT ROWID;
"""
# Columns added to `buckets` in layout 2: samples processed and rank-seconds of wall
# time, so the job's best sustained per-GPU throughput (samples / rank-seconds) is read
# from the minutes themselves.
BUCKET_COLUMNS_2 = ("samples", "rank_s")
# The file's layout (PRAGMA user_version): 0, the first ledgers (buckets, totals); 1 adds
# `waits`; 2 adds BUCKET_COLUMNS_2; 3 adds `causes` and `stops`; 4 adds TOTALS_COLUMNS_4;
# 5 adds `episodes` (tuimon.relay.episodes: the incidents the relay's judgement held);
# 6 adds TOTALS_COLUMN_6.
# An older file is brought
# up to it in place, every minute kept; a newer one (a later relay's) is refused rather
# than written in a layout this relay does not know.
SCHEMA_VERSION = 6
# The job's best: per-GPU throughput over this many consecutive minutes, every one counted
# (the model's window: the viewer judges its own count by the same).
BEST_MINUTES = int(BEST_WINDOW_S // 60)
BEST_COVERED_S = BEST_COVERED * BEST_WINDOW_S
TOTALS_UPSERT = """
INSERT INTO totals (source, job, since, wall, compute, at, ranks, run_ranks, waits)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (source, job) DO UPDATE SET since = excluded.since, wall = excluded.wall,
    compute = excluded.compute, at = excluded.at, ranks = excluded.ranks,
    run_ranks = excluded.run_ranks, waits = excluded.waits
"""
UPSERT = """
INSERT INTO buckets (job, minute, total_s, effective_s, samples, rank_s)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (job, minute) DO UPDATE SET total_s = total_s + excluded.total_s,
                                        effective_s = effective_s + excluded.effective_s,
                                        samples = samples + excluded.samples,
                                        rank_s = rank_s + excluded.rank_s
"""
# What a sound row of each table holds (SQLite keeps any value in any column): names as
# text, minutes and hours as integers, sums as finite numbers within the wire's bound.
_NAME = "typeof({}) = 'text'"
_WHOLE = "typeof({}) = 'integer'"
_SUM = "(typeof({0}) IN ('real', 'integer') AND {0} BETWEEN -1e18 AND 1e18)"
_COUNT = "(typeof({}) IN ('integer', 'null'))"


def _sound(**columns: str) -> str:
    return " AND ".join(kind.format(column) for column, kind in columns.items())


SOUND_ROWS = {
    "buckets": _sound(job=_NAME, minute=_WHOLE, total_s=_SUM, effective_s=_SUM,
                      samples=_SUM, rank_s=_SUM),
    "totals": _sound(source=_NAME, job=_NAME, since=_SUM, wall=_SUM, compute=_SUM, at=_SUM,
                     ranks=_COUNT, run_ranks=_COUNT)
    + " AND (waits IS NULL OR typeof(waits) = 'text')",
    "waits": _sound(job=_NAME, minute=_WHOLE, kind=_NAME, seconds=_SUM),
    "causes": _sound(job=_NAME, hour=_WHOLE, kind=_NAME, cause=_NAME, seconds=_SUM),
    "stops": _sound(job=_NAME, spans=_NAME, cause=_NAME),
    "episodes": _sound(id=_WHOLE, key=_NAME, kind=_NAME, severity=_NAME, onset=_SUM,
                       components=_NAME, message=_NAME, jobs=_NAME, lost_s=_SUM,
                       flaps=_WHOLE) + " AND (ended IS NULL OR " + _SUM.format("ended") + ")",
}
EPISODE_COLUMNS = ("id, key, kind, severity, onset, ended, components, message, jobs, "
                   "lost_s, flaps")
# Unwritten minutes kept in memory while the disk refuses them (jobs x minutes).
MAX_PENDING = 100_000
# The wall clock moving this far apart from the monotonic one since start is a jump: a
# prune then would take history the clock only seems to have left behind.
JUMP_S = 3600.0
# Rank-seconds the totals must show missing before any is credited (float sums differ by
# less than this from the per-sample ones).
RECOVER_AT_LEAST_S = 0.01
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
# Causes sent per job and kind; the rest are folded into FOLDED.
CAUSES_SENT = 8
# The periods a job's SLI over its run is read by (minutes): the shortest that gives at
# most MAX_HISTORY of them, else whole hours.
SLI_PERIODS_MIN = (1, 5, 15, 60)
MAX_SPANS = 64


class SliSeries(NamedTuple):
    """A job's run time and effective time (seconds) by period, oldest first."""

    start: float  # when the first period begins (Unix time)
    every_s: float  # seconds each period covers
    total_s: list[float]
    effective_s: list[float]


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


def _per_minute(spans: list[tuple[float, float]], seconds: float) -> dict[int, float]:
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


def _when(minute: int | None) -> str:
    return "-" if minute is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(minute * 60))


class LedgerError(UsageError):
    """The ledger file cannot be opened; the message names the path and the reason."""


def _lock(path: Path) -> tuple[int, int]:
    """Exclusive locks on the ledger file itself (its inode: the same file through a
    symlink, a hard link or another mount is one lock) and on `ledger.db.lock` beside
    the real file (which older relays take, and which names the holder): two relays
    adding the same steps to one file would count every second twice. Held until the
    process exits."""
    try:
        real = path.resolve()
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError before 3.13)
        raise LedgerError(f"ledger {path}: cannot resolve the path: {exc}") from None
    if real.exists() and not real.is_file():
        # A device or a directory: no lock file is made beside it, nothing is opened.
        raise LedgerError(f"ledger {path} (the file {real}) is not a regular file; give "
                          "--ledger the path of a file")
    lock_path = real.with_name(real.name + ".lock")
    fds: list[int] = []
    try:
        for target in (lock_path, real):
            try:
                fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise LedgerError(f"ledger {path}: cannot open {target} to lock it: "
                                  f"{exc.strerror or exc}") from None
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fds[0], 64, 0).decode(errors="replace").strip() or "?"
                raise LedgerError(
                    f"ledger {path} (the file {real}) is in use by another relay (pid "
                    f"{holder}); two relays on one ledger would count every second twice. "
                    "Give this one another --ledger or stop the other.") from None
    except LedgerError:
        for fd in fds:
            os.close(fd)
        raise
    os.ftruncate(fds[0], 0)
    os.write(fds[0], f"{os.getpid()}\n".encode())
    return fds[0], fds[1]


class Ledger:
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
        # (job, minute) -> [total_s, effective_s, samples, rank_s] not yet written
        self._pending: dict[tuple[str, int], list[float]] = {}
        # job -> its best per-GPU samples/s over BEST_MINUTES, and the last minute whose
        # window was offered to it
        self._best: dict[str, Best] = {}
        self._best_offered: dict[str, int] = {}
        # job -> the oldest minute written whose windows are not all judged yet
        self._due: dict[str, int] = {}
        self._pending_waits: dict[tuple[str, int, str], float] = {}
        self._lost_minutes = 0
        # (source, job) -> (since, wall, compute, at, ranks held): the agents' totals as
        # last counted (to write), as the file had them when this relay started (to
        # recover from; ranks None where an older layout did not keep them), and as this
        # relay last counted them.
        self._totals: dict[tuple[str, str], Totals] = {}
        self._stored: dict[tuple[str, str], Totals] = {}
        self._last: dict[tuple[str, str], Totals] = {}
        # job -> run seconds credited from the agents' totals for time this relay missed
        # (since it started); and what of it is not yet in the log.
        self.recovered_s: dict[str, float] = {}
        # job -> kind -> run seconds of that recovered time lost, as the ranks' totals
        # named it (`other`: what they did not name, or a source that sent no waits)
        self.recovered_lost_s: dict[str, dict[str, float]] = {}
        self._unsaid: dict[str, list[Any]] = {}
        # A silence longer than this is taken as the job's end, not counted.
        self.stopped_most_s = stopped_most_h * 3600.0
        # job -> [its last report (wall clock), the longest gap between reports lately]
        self._seen: dict[str, list[float]] = {}
        self._stops: dict[str, Stop] = {}
        self._stops_gone: set[str] = set()  # rows to delete at the next flush
        # job -> when its ranks said the run is complete (reports soon after are its
        # last steps, not a new run)
        self._ended: dict[str, float] = {}
        # (job, minute) -> kind -> lost seconds not yet put down to a cause
        self._unattributed: dict[tuple[str, int], dict[str, float]] = {}
        # (job, hour, kind, cause) -> seconds not yet written
        self._pending_causes: dict[tuple[str, int, str, str], float] = {}
        # (job, hour, kind) -> the causes named in it: at most CAUSES_SENT, the rest folded
        self._hour_causes: dict[tuple[str, int, str], set[str]] = {}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(f"ledger {self.path}: {exc.strerror or exc}") from None
        self._lock_fd = _lock(self.path)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            if max_bytes is not None:
                page = self._db.execute("PRAGMA page_size").fetchone()[0]
                self._db.execute(f"PRAGMA max_page_count={max(1, max_bytes // page)}")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise LedgerError(f"ledger {self.path} was written by a newer relay (layout "
                                  f"{version}, this one knows up to {SCHEMA_VERSION}); run "
                                  "that relay, or give --ledger another path")
            # Sound before anything is written to it (a layout brought up to date).
            check = self._db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise LedgerError(f"ledger {self.path} is damaged ({check}); move it aside "
                                  "and the relay starts a new one")
            self._db.executescript(SCHEMA + TOTALS_SCHEMA + WAITS_SCHEMA + CAUSES_SCHEMA
                                   + STOPS_SCHEMA + episodes.SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(buckets)")}
            for column in BUCKET_COLUMNS_2:
                if column not in columns:
                    self._db.execute(f"ALTER TABLE buckets ADD COLUMN {column} REAL NOT NULL "
                                     "DEFAULT 0")
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(totals)")}
            for column in TOTALS_COLUMNS_4:
                if column not in columns:  # NULL in the rows before: not known
                    self._db.execute(f"ALTER TABLE totals ADD COLUMN {column} INTEGER")
            if TOTALS_COLUMN_6 not in columns:
                self._db.execute(f"ALTER TABLE totals ADD COLUMN {TOTALS_COLUMN_6} TEXT")
            if version < SCHEMA_VERSION:
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._set_aside_damaged()
            self._best_stored()
            self._stored = {
                (source, job): Totals(since, wall, compute, at, ranks, run_ranks, 0.0,
                                      _stored_waits(waits))
                for source, job, since, wall, compute, at, ranks, run_ranks, waits
                in self._db.execute("SELECT source, job, since, wall, compute, at, ranks, "
                                    "run_ranks, waits FROM totals")}
            self._load_stops()
            self._load_episodes()
        except (OSError, sqlite3.Error) as exc:
            self._unlock()
            raise LedgerError(f"ledger {self.path}: {exc}") from None
        except LedgerError:
            self._unlock()
            raise
        self._warn_future()

    def _set_aside_damaged(self) -> None:
        """Rows whose values are not of their column's kind (a text where a number is
        kept, a blob for a name, an infinite sum: written by hand, or damaged) are moved
        to a `damaged_<table>` table beside theirs, in one transaction, and said once
        with their count: kept, never read, so no sum or name read later can fail on
        them."""
        moved = {}
        with self._db:
            self._db.execute("BEGIN")
            for table, sound in SOUND_ROWS.items():
                bad = f"NOT ({sound})"
                count = self._db.execute(f"SELECT COUNT(*) FROM {table} WHERE {bad}"
                                         ).fetchone()[0]
                if not count:
                    continue
                self._db.execute(f"CREATE TABLE IF NOT EXISTS damaged_{table} AS "
                                 f"SELECT * FROM {table} WHERE 0")
                # A damaged_ table an older layout made lacks the columns added since.
                columns = [r[1] for r in self._db.execute(f"PRAGMA table_info({table})")]
                kept = {r[1] for r in self._db.execute(
                    f"PRAGMA table_info(damaged_{table})")}
                for column in columns:
                    if column not in kept:
                        self._db.execute(f"ALTER TABLE damaged_{table} ADD COLUMN {column}")
                names = ", ".join(columns)
                self._db.execute(f"INSERT INTO damaged_{table} ({names}) SELECT {names} "
                                 f"FROM {table} WHERE {bad}")
                self._db.execute(f"DELETE FROM {table} WHERE {bad}")
                moved[table] = count
        for table, count in moved.items():
            log.error("ledger %s: %d row(s) of %s hold values of the wrong kind (damaged, or "
                      "written by hand); skipped: moved to damaged_%s", self.path, count,
                      table, table)

    def _unlock(self) -> None:
        fds, self._lock_fd = self._lock_fd, (-1, -1)
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)  # closing the descriptor releases the flock

    def close(self) -> None:
        self._settle_stops(self.clock(), final=True)
        self.flush()
        self._db.close()
        self._unlock()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _warn_future(self) -> None:
        """Minutes ahead of this relay's clock (a file from a relay whose clock ran fast)
        are not counted in any window; say so once, at start."""
        now_minute = int(self.clock() // 60)
        ahead = self._db.execute("SELECT COUNT(*), MAX(minute) FROM buckets WHERE minute > ?",
                                 (now_minute + 1,)).fetchone()
        if ahead and ahead[0]:
            log.warning("ledger %s: %d minute buckets are ahead of this relay's clock (up to "
                        "%.0f h ahead); they are kept but counted in no window", self.path,
                        ahead[0], (ahead[1] - now_minute) / 60)

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
        self._saw(job, ts, total_s)
        if self._add_minute(job, ts, total_s, effective_s, waits, samples, rank_s):
            lost = self._unattributed.setdefault((job, int(ts // 60)), {})
            for kind, seconds in split_wait(waits, max(0.0, total_s - effective_s)).items():
                lost[kind] = lost.get(kind, 0.0) + seconds

    def _add_minute(self, job: str, ts: float, total_s: float, effective_s: float,
                    waits: dict[str, float] | None = None, samples: float = 0.0,
                    rank_s: float = 0.0) -> bool:
        minute = int(ts // 60)
        key = (job, minute)
        bucket = self._pending.get(key)
        if bucket is None:
            if len(self._pending) >= MAX_PENDING:
                self._lost_minutes += 1
                return False
            bucket = self._pending[key] = [0.0, 0.0, 0.0, 0.0]
        bucket[0] += total_s
        bucket[1] += min(effective_s, total_s)
        # Every rank-second, with samples or not: per-GPU throughput is samples over all
        # of the ranks' time, as the viewer counts it (a job whose rank 0 alone counts
        # the global batch reads the same either way).
        bucket[2] += max(0.0, samples)
        bucket[3] += max(0.0, rank_s)
        for name, seconds in (waits or {}).items():
            kind = wait_kind(name)
            if kind != OTHER and seconds > 0:
                wkey = (job, minute, kind)
                self._pending_waits[wkey] = self._pending_waits.get(wkey, 0.0) + seconds
        return True

    # -- stops and causes ---------------------------------------------------------

    def _saw(self, job: str, ts: float, total_s: float) -> None:
        """A live report of the job: learn its gaps, end its stop if it had one."""
        if job in self._ended and ts - self._ended[job] > STOP_AFTER_S:
            del self._ended[job]  # the same name runs again
        seen = self._seen.get(job)
        stop = self._stops.get(job)
        if seen is None:
            self._seen[job] = [ts, 0.0]
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
        not lost. A job this ledger does not count is ignored."""
        if job not in self._seen and job not in self._stops:
            return
        self._ended[job] = ts
        stop = self._stops.get(job)
        if stop is not None and stop.ended is None:
            del self._stops[job]
            self._stops_gone.add(job)

    def note_stops(self, now: float, cause_of: Callable[[str], str],
                   returned: Callable[[str, float], bool] | None = None) -> None:
        """Jobs silent past their time have stopped (put down to what `cause_of` says
        held on their nodes now); a stop longer than `stopped_most` is the job's end; a
        stop whose job came back is written once `returned(job, when)` says every node
        of it that is up has reported since. Call about once a second."""
        for job, (last, gap) in list(self._seen.items()):
            if job in self._stops or now - last <= max(STOP_AFTER_S, STOP_GAPS * gap):
                continue
            if job in self._ended:
                del self._seen[job]
                del self._ended[job]
                continue
            cause = cause_of(job)[:MAX_CAUSE]
            self._stops[job] = Stop(cause, [[last, None]])
            log.info("ledger %s: job %s: no step report for %.0f s (%s): counted as stopped "
                     "until it reports again", self.path, job, now - last, cause)
        for job, stop in list(self._stops.items()):
            if stop.ended is None and stop.lost(now, math.inf) > self.stopped_most_s:
                log.warning("ledger %s: job %s: silent for more than %g h: taken as ended, "
                            "its silence not counted", self.path, job,
                            self.stopped_most_s / 3600)
                del self._stops[job]
                self._seen.pop(job, None)
                self._stops_gone.add(job)
        self._settle_stops(now, returned)

    def _settle_stops(self, now: float,
                      returned: Callable[[str, float], bool] | None = None,
                      final: bool = False) -> None:
        """Stops whose job came back: their lost time into the minutes they covered, once
        its nodes are back (`returned`), or at the latest SETTLE_MOST_S after, or now
        (`final`: the relay is closing)."""
        for job, stop in list(self._stops.items()):
            if stop.ended is None or now - stop.ended <= RETURN_S:
                continue
            if not final and now - stop.ended <= SETTLE_MOST_S and (
                    returned is None or not returned(job, stop.ended)):
                continue
            del self._stops[job]
            self._stops_gone.add(job)
            lost = stop.lost(now, self.stopped_most_s)
            if lost < RETURN_S + 1.0:  # the step that ended it covered it: a long step
                seen = self._seen.get(job)
                if seen is not None:
                    seen[1] = max(seen[1], stop.ended - (stop.spans[0][0] or 0.0))
                continue
            for minute, seconds in _per_minute(stop.seen(now), lost).items():
                self._add_minute(job, minute * 60.0, seconds, 0.0, {STOPPED: seconds})
                self._add_cause(job, minute // 60, STOPPED, stop.cause, seconds)
            log.warning("ledger %s: job %s: its ranks were silent from %s to %s: %.0f s "
                        "counted as stopped (%s)", self.path, job,
                        _when(int((stop.spans[0][0] or 0.0) // 60)),
                        _when(int(stop.ended // 60)), lost, stop.cause)

    # -- incidents ------------------------------------------------------------------

    def _load_episodes(self) -> None:
        """The episodes the file has open, to go on with (and the next number)."""
        top = self._db.execute("SELECT MAX(id) FROM episodes").fetchone()[0]
        self.episodes = episodes.Episodes(int(top or 0) + 1)
        rows = [episodes.read(r) for r in self._db.execute(
            f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE ended IS NULL")]
        self.episodes.resume([e for e in rows if e is not None])

    def observe(self, findings: list[Finding], now: float,
                jobs_of: Callable[[Finding], list[str]] | None = None) -> None:
        """What the relay's judgement holds at `now`: its incidents begin, go on and end
        (written at the next flush). Call once a judgement."""
        self.episodes.observe(findings, now, jobs_of)

    def incidents(self, since: float, until: float | None = None,
                  job: str | None = None, most: int = 1000) -> list[episodes.Episode]:
        """The episodes that held at any time in [since, until], newest onset first: the
        file's, with those not yet written as they stand in memory; of one job's nodes
        where `job` is given."""
        until = self.clock() if until is None else until
        found: dict[int, episodes.Episode] = {}
        for row in self._db.execute(
                f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE onset <= ? AND "
                "(ended IS NULL OR ended >= ?) ORDER BY onset DESC LIMIT ?",
                (until, since, most)):
            e = episodes.read(row)
            if e is not None:
                found[e.id] = e
        live = [*self.episodes.dirty.values(), *self.episodes.open.values()]
        for e in live:
            if e.onset <= until and (e.ended is None or e.ended >= since):
                found[e.id] = e
        out = sorted(found.values(), key=lambda e: -e.onset)
        if job is not None:
            out = [e for e in out if job in e.jobs]
        return out[:most]

    def attribute(self, findings_of: Callable[[str], list[Finding]]) -> None:
        """Put the lost time added since the last call down to the findings that
        concern each job now (`findings_of(job)`), as the viewer does (shared by
        tuimon.model.attribution). Call about once a second."""
        for (job, minute), lost in self._unattributed.items():
            for (kind, cause), seconds in share(lost, findings_of(job)).items():
                self.episodes.add_lost(cause, seconds)
                self._add_cause(job, minute // 60, kind, cause, seconds)
        self._unattributed.clear()

    def _add_cause(self, job: str, hour: int, kind: str, cause: str, seconds: float) -> None:
        """Seconds of a kind put down to a cause, in the hour; past CAUSES_SENT names in
        a (job, hour, kind), or while the disk refuses, under FOLDED."""
        names = self._hour_causes.setdefault((job, hour, kind), set())
        cause = cause[:MAX_CAUSE]
        if cause not in names:
            if len(names) >= CAUSES_SENT or len(self._pending_causes) >= MAX_PENDING:
                cause = FOLDED
            names.add(cause)
        key = (job, hour, kind, cause)
        self._pending_causes[key] = self._pending_causes.get(key, 0.0) + seconds

    def _load_stops(self) -> None:
        """The stops a relay before this one saw: counted up to what it saw, and again
        from this relay's start while the job stays silent."""
        for job, spans_text, cause in self._db.execute("SELECT job, spans, cause FROM stops"):
            try:
                spans: list[list[float | None]] = []
                for lo, hi in json.loads(spans_text)[-MAX_SPANS:]:
                    spans.append([float(lo), float(hi)])
            except (ValueError, TypeError):
                log.warning("ledger %s: job %s: an unreadable stop (%r) dropped", self.path,
                            clean(job), spans_text[:80])
                self._stops_gone.add(job)
                continue
            if clean(job) != job:
                self._stops_gone.add(job)  # kept under its clean name from now on
            self._stops[clean(job)] = Stop(clean(cause)[:MAX_CAUSE],
                                           [*spans, [self._wall0, None]])

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
        last = self._last.get(key)
        if last is None:
            last = self._stored.pop(key, None)
        if last is not None:
            self._recover(source, entry, last, now, credited, grant)
        self._last[key] = self._totals[key] = Totals(
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
                self._add_minute(job, lo, gap_wall * part / ranks, gap_compute * part / ranks,
                                 {k: v * part / ranks for k, v in gap_waits.items()})
        self.recovered_s[job] = self.recovered_s.get(job, 0.0) + gap_wall / ranks
        lost_s = self.recovered_lost_s.setdefault(job, {})
        lost_total = max(0.0, gap_wall - gap_compute) / ranks
        for kind, seconds in gap_waits.items():
            lost_s[kind] = lost_s.get(kind, 0.0) + seconds / ranks
            lost_total -= seconds / ranks
        if lost_total > RECOVER_AT_LEAST_S / ranks:
            lost_s[OTHER] = lost_s.get(OTHER, 0.0) + lost_total
        stop = self._stops.get(job)
        if stop is not None:  # it ran meanwhile: that part of the silence was not stopped
            inside = sum(max(0.0, min(hi, now) - max(lo, last.at)) for lo, hi in stop.seen(now))
            stop.recovered += gap_wall / ranks * inside / away
        said = self._unsaid.setdefault(job, [0.0, set(), 0.0])
        said[0] += gap_wall / ranks
        if len(said[1]) < 100_000:
            said[1].add(source)
        said[2] = max(said[2], away)

    def _say_recovered(self) -> None:
        for job, (seconds, sources, away) in self._unsaid.items():
            log.warning("ledger %s: job %s: credited %.0f s of run time this relay missed "
                        "(up to %.0f s away), from the step totals of %d node(s)", self.path,
                        job, seconds, away, len(sources))
        self._unsaid.clear()

    def flush(self) -> bool:
        """Write the buckets added since the last flush, and the agents' totals they were
        counted up to, in one transaction; False if the disk refused."""
        self._say_recovered()
        if not self._pending and not self._totals and not self._stops_gone \
                and not self._stops and not self._pending_causes and not self.episodes.dirty:
            if self._due and self.error is None:
                self._note_best({})  # a job's last minute becomes whole after it stopped
            return self.error is None
        rows = [(job, minute, *sums) for (job, minute), sums in self._pending.items()]
        totals = [(source, job, t.since, t.wall, t.compute, t.at, t.ranks, t.run_ranks,
                   None if t.waits is None else json.dumps(t.waits))
                  for (source, job), t in self._totals.items()]
        waits = [(*key, seconds) for key, seconds in self._pending_waits.items()]
        causes = [(*key, seconds) for key, seconds in self._pending_causes.items()]
        now = self.clock()
        stops = [(job, json.dumps([[lo, hi] for lo, hi in stop.seen(now)]), stop.cause)
                 for job, stop in self._stops.items() if stop.ended is None]
        gone = [(job,) for job in self._stops_gone if job not in self._stops]
        incidents = [e.row() for e in self.episodes.dirty.values()]
        try:
            with self._db:  # one transaction: all of it or none of it
                self._db.execute("BEGIN")
                self._db.executemany(episodes.UPSERT, incidents)
                self._db.executemany(UPSERT, rows)
                self._db.executemany(TOTALS_UPSERT, totals)
                self._db.executemany(WAITS_UPSERT, waits)
                self._db.executemany(CAUSES_UPSERT, causes)
                self._db.executemany("DELETE FROM stops WHERE job = ?", gone)
                self._db.executemany("INSERT OR REPLACE INTO stops (job, spans, cause) "
                                     "VALUES (?, ?, ?)", stops)
        except sqlite3.Error as exc:
            message = (f"ledger {self.path}: cannot write {len(rows)} minute buckets: {exc};"
                       " keeping them in memory and retrying")
            if message != self.error:
                log.error("%s", message)
            self.error = message
            return False
        if self.error is not None:
            log.warning("ledger %s: writing again (%d buckets caught up)", self.path, len(rows))
        self.error = None
        self.written += len(rows)
        oldest: dict[str, int] = {}
        for job, minute in self._pending:
            oldest[job] = min(minute, oldest.get(job, minute))
        self._note_best(oldest)
        self._pending.clear()
        self._totals.clear()
        self._pending_waits.clear()
        self._pending_causes.clear()
        self._stops_gone.clear()
        self.episodes.dirty.clear()
        hour_now = int(self.clock() // 3600)
        self._hour_causes = {k: v for k, v in self._hour_causes.items() if k[1] >= hour_now - 1}
        return True

    # -- the job's best ---------------------------------------------------------------

    @staticmethod
    def _offer_windows(best: Best, rows: list[tuple[int, float, float]], before: int,
                       after: int | None) -> int | None:
        """Offer `best` the per-GPU throughput of each BEST_MINUTES consecutive minutes of
        `rows` (minute, samples, rank-seconds; oldest first) whose window ends after the
        minute `after` and before the minute `before` (a minute still being counted is
        not a whole one), in order; returns the last minute offered (or `after`)."""
        window: list[tuple[int, float, float]] = []
        samples = rank_s = 0.0
        for row in rows:
            if row[0] >= before:
                break
            if window and row[0] != window[-1][0] + 1:  # a gap: start again
                window, samples, rank_s = [], 0.0, 0.0
            window.append(row)
            samples += row[1]
            rank_s += row[2]
            if len(window) > BEST_MINUTES:
                old = window.pop(0)
                samples -= old[1]
                rank_s -= old[2]
            # At least one rank through most of the window: a few stray rank-seconds
            # (a report of a microsecond with a thousand samples) are no sustained best.
            if len(window) == BEST_MINUTES and rank_s >= BEST_COVERED_S and \
                    (after is None or row[0] > after):
                value = samples / rank_s
                if value <= MAX_NUM:
                    best.offer(value, row[0] * 60.0 + 60.0)
                after = row[0]
        return after

    def _best_stored(self) -> None:
        """Each job's best from the file, once, at start: every window in order, by the
        same rule as while counting (efficiency.Best), so a best is what its history
        allows whatever a minute in the file says."""
        rows: dict[str, list[tuple[int, float, float]]] = {}
        for job, minute, samples, rank_s in self._db.execute(
                "SELECT job, minute, samples, rank_s FROM buckets WHERE rank_s > 0 "
                "ORDER BY job, minute"):
            rows.setdefault(clean(job), []).append((minute, samples, rank_s))
        now_minute = int(self.clock() // 60)
        for job, job_rows in rows.items():
            best = Best()
            offered = self._offer_windows(best, job_rows, now_minute, None)
            if best.value is not None:
                self._best[job] = best
            if offered is not None:
                self._best_offered[job] = offered

    def _note_best(self, written: dict[str, int]) -> None:
        """After a flush: the windows that end at the minutes just written (job -> the
        oldest), and at minutes that became whole since (a job's last minute is whole
        only after the job stopped sending)."""
        for job, oldest in written.items():
            self._due[job] = min(oldest, self._due.get(job, oldest))
        now_minute = int(self.clock() // 60)
        for job, oldest in list(self._due.items()):
            rows = [(m, n, r) for m, n, r in self._db.execute(
                "SELECT minute, samples, rank_s FROM buckets WHERE job = ? AND minute >= ? "
                "AND rank_s > 0 ORDER BY minute", (job, oldest - BEST_MINUTES))]
            best = self._best.get(job) or Best()
            offered = self._offer_windows(best, rows, now_minute, self._best_offered.get(job))
            if best.value is not None:
                self._best[job] = best
            if offered is not None:
                self._best_offered[job] = offered
            newest = rows[-1][0] if rows else oldest
            if newest < now_minute:
                del self._due[job]  # every window ending at its minutes judged
            else:
                self._due[job] = newest  # judged again once this minute is whole

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
        self._last = {k: v for k, v in self._last.items() if v.at >= first * 60.0}
        try:
            old, total, newest_old = self._db.execute(
                "SELECT SUM(minute < ?), COUNT(*), MAX(CASE WHEN minute < ? THEN minute END) "
                "FROM buckets", (first, first)).fetchone()
            old, total = old or 0, total or 0
            if not old:
                return 0
            if old == total:
                log.error("ledger %s: every bucket (%d) is older than %g days by this relay's "
                          "clock (newest %s); not pruning: check the clock", self.path, total,
                          self.keep_days, _when(newest_old))
                return 0
            with self._db:
                self._db.execute("BEGIN")
                cur = self._db.execute("DELETE FROM buckets WHERE minute < ?", (first,))
                self._db.execute("DELETE FROM waits WHERE minute < ?", (first,))
                self._db.execute("DELETE FROM causes WHERE hour < ?", (first // 60,))
                self._db.execute("DELETE FROM totals WHERE at < ?", (first * 60.0,))
                self._db.execute("DELETE FROM episodes WHERE ended < ?", (first * 60.0,))
                # Past MAX_EPISODES the oldest that ended go: a fault that never stops
                # raising new findings cannot fill the disk.
                self._db.execute(
                    "DELETE FROM episodes WHERE ended IS NOT NULL AND id IN (SELECT id FROM "
                    "episodes WHERE ended IS NOT NULL ORDER BY onset DESC LIMIT -1 OFFSET ?)",
                    (episodes.MAX_EPISODES,))
        except sqlite3.Error as exc:
            log.error("ledger %s: cannot prune: %s", self.path, exc)
            return 0
        log.info("ledger %s: pruned %d minute buckets older than %g days", self.path,
                 cur.rowcount, self.keep_days)
        return cur.rowcount

    # -- reading ------------------------------------------------------------------

    def summary(self, now: float | None = None,
                job: str | None = None) -> dict[str, dict[str, Any]]:
        """Per job: since when it is counted, consumed and observed hours over the window,
        the error ratio of each burn window (nil where nothing was observed), what the
        lost hours were spent on and put down to, the hours lost by hour, and whether
        it is stopped now. A stop still open counts as it stands. `job`: that job in
        full (its causes and history) whether or not it is among the most recent (a
        run's report asks for one job)."""
        wanted = job  # (`job` names each job in the loops below)
        now = self.clock() if now is None else now
        minute_now = int(now // 60)
        windows = {"run": self.window_hours * 3600}
        windows.update(BURN_WINDOWS_S)
        first_run = minute_now - int(windows["run"] // 60)
        # The stops still open, as minutes of lost time (written once the job is back).
        stopped: dict[str, dict[int, float]] = {
            job: _per_minute(stop.seen(now), stop.lost(now, self.stopped_most_s))
            for job, stop in self._stops.items()}
        sums: dict[str, dict[str, Any]] = {}

        def add(job: str, key: str, total: float, effective: float) -> None:
            entry = sums.setdefault(job, {"windows": {}})
            t, e = entry["windows"].get(key, (0.0, 0.0))
            entry["windows"][key] = (t + total, e + effective)

        for key, seconds in windows.items():
            first = minute_now - int(seconds // 60)
            # Bounded on both sides: a minute from the future (a clock that ran ahead)
            # is in no window, so it cannot count in every window for ever.
            for job, total, effective in self._db.execute(
                    "SELECT job, SUM(total_s), SUM(effective_s) FROM buckets "
                    "WHERE minute > ? AND minute <= ? GROUP BY job", (first, minute_now)):
                add(clean(job), key, total or 0.0, effective or 0.0)
            for (job, minute), bucket in self._pending.items():
                if first < minute <= minute_now:
                    add(job, key, bucket[0], bucket[1])
            for job, minutes in stopped.items():
                add(job, key, sum(v for m, v in minutes.items() if first < m <= minute_now),
                    0.0)
        # What the run window's lost time waited on, by named kind; `other` is the rest.
        named: dict[str, dict[str, float]] = {}
        for job, kind, seconds in self._db.execute(
                "SELECT job, kind, SUM(seconds) FROM waits WHERE minute > ? AND minute <= ? "
                "GROUP BY job, kind", (first_run, minute_now)):
            by_kind = named.setdefault(clean(job), {})
            by_kind[wait_kind(kind)] = by_kind.get(wait_kind(kind), 0.0) + (seconds or 0.0)
        for (job, minute, kind), seconds in self._pending_waits.items():
            if first_run < minute <= minute_now:
                by_kind = named.setdefault(job, {})
                by_kind[kind] = by_kind.get(kind, 0.0) + seconds
        for job, minutes in stopped.items():
            by_kind = named.setdefault(job, {})
            by_kind[STOPPED] = by_kind.get(STOPPED, 0.0) + sum(
                v for m, v in minutes.items() if first_run < m <= minute_now)
        causes = self._causes(first_run, minute_now, stopped)
        since = {clean(job): minute for job, minute in self._db.execute(
            "SELECT job, MIN(minute) FROM buckets WHERE minute <= ? GROUP BY job",
            (minute_now,))}
        for (job, minute) in self._pending:
            since[job] = min(since.get(job, minute), minute)
        out: dict[str, dict[str, Any]] = {}
        # What a viewer reads in one batch: the jobs seen most recently (their causes and
        # history for fewer still).
        latest = {clean(job): minute for job, minute in self._db.execute(
            "SELECT job, MAX(minute) FROM buckets WHERE minute <= ? GROUP BY job",
            (minute_now,))}
        for job, minute in self._pending:
            latest[job] = max(latest.get(job, minute), minute)
        for job in self._stops:
            latest[job] = minute_now
        recent = sorted(sums, key=lambda j: latest.get(j, 0), reverse=True)
        asked = [wanted] if wanted in sums else []
        sums = {name: sums[name] for name in [*recent[:MAX_BUDGET_JOBS], *asked]}
        detailed = {*recent[:MAX_DETAILED_JOBS], *asked}
        history = self._history(first_run, minute_now, stopped, detailed)
        for job, entry in sums.items():
            total, effective = entry["windows"].get("run", (0.0, 0.0))
            ratios = {}
            for key in BURN_WINDOWS_S:
                t, e = entry["windows"].get(key, (0.0, 0.0))
                ratios[key] = 1 - e / t if t > 0 else None
            # The named waits as shares of the time lost; the rest is `other`.
            spent = split_wait(named.get(job), max(0.0, total - effective))
            doc: dict[str, Any] = {
                "since": since.get(job, minute_now) * 60.0, "window_h": self.window_hours,
                "consumed_h": (total - effective) / 3600,
                "spent_h": {k: spent[k] / 3600 for k in WAIT_KINDS if k in spent},
                "observed_h": total / 3600, "error_ratio": ratios, "error": self.error}
            if self.recovered_s.get(job):
                doc["recovered_h"] = self.recovered_s[job] / 3600
                doc["recovered_spent_h"] = {
                    k: v / 3600 for k, v in (self.recovered_lost_s.get(job) or {}).items()}
            best = self._best.get(job)
            if best is not None and best.value is not None:
                doc["best_per_gpu"] = best.value
                doc["best_at"] = best.at
            if causes.get(job) and job in detailed:
                doc["causes_h"] = causes[job]
            if job in history and job in detailed:
                doc["lost_from"], doc["lost_every_h"], doc["lost_h"] = history[job]
            stop = self._stops.get(job)
            if stop is not None and stop.ended is None:
                doc["stopped_since"] = stop.spans[0][0]
                doc["stopped_cause"] = stop.cause
            out[job] = doc
        return out

    def _causes(self, first: int, last: int, stopped: dict[str, dict[int, float]]
                ) -> dict[str, dict[str, dict[str, float]]]:
        """job -> kind -> cause -> hours over the minutes (first, last], the CAUSES_SENT
        largest of each kind, the rest as FOLDED."""
        table: dict[str, dict[str, dict[str, float]]] = {}

        def add(job: str, kind: str, cause: str, seconds: float) -> None:
            by_cause = table.setdefault(job, {}).setdefault(wait_kind(kind), {})
            by_cause[cause] = by_cause.get(cause, 0.0) + seconds

        for job, kind, cause, seconds in self._db.execute(
                "SELECT job, kind, cause, SUM(seconds) FROM causes WHERE hour > ? AND "
                "hour <= ? GROUP BY job, kind, cause", (first // 60, last // 60)):
            add(clean(job), kind, clean(cause)[:MAX_CAUSE], seconds or 0.0)
        for (job, hour, kind, cause), seconds in self._pending_causes.items():
            if first // 60 < hour <= last // 60:
                add(job, kind, cause, seconds)
        for job, minutes in stopped.items():
            add(job, STOPPED, self._stops[job].cause,
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

    def _history(self, first: int, last: int, stopped: dict[str, dict[int, float]],
                 jobs: set[str]) -> dict[str, tuple[float, float, list[float]]]:
        """job -> (start, hours each entry covers, the hours lost in each, oldest first):
        from the job's first minute in the window, at most MAX_HISTORY entries."""
        lost: dict[str, dict[int, float]] = {}
        names = sorted(jobs)
        for job, hour, seconds in self._db.execute(
                "SELECT job, minute / 60, SUM(total_s - effective_s) FROM buckets WHERE "
                f"minute > ? AND minute <= ? AND job IN ({','.join('?' * len(names))}) "
                "GROUP BY job, minute / 60", (first, last, *names)):
            by_minute = lost.setdefault(clean(job), {})
            by_minute[hour * 60] = by_minute.get(hour * 60, 0.0) + (seconds or 0.0)
        for (job, minute), bucket in self._pending.items():
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

    def sli_series(self, job: str, since: float, now: float | None = None) -> SliSeries | None:
        """A job's run time and effective time by period over (since, now], from its
        first minute there: at most MAX_HISTORY periods of 1, 5, 15 or 60 minutes or of
        whole hours, the shortest that fits (a run of an hour is drawn by the minute, one
        of a month by three hours); None where it has no minute there. Read as `summary`
        reads the minutes (the file's, those not yet written, a stop's lost time as it
        stands), bounded on both sides, so its sums are the summary's over the same
        range."""
        now = self.clock() if now is None else now
        first, last = int(since // 60), int(now // 60)
        minutes: dict[int, list[float]] = {}

        def add(minute: int, total: float, effective: float) -> None:
            if first < minute <= last:
                sums = minutes.setdefault(minute, [0.0, 0.0])
                sums[0] += total
                sums[1] += effective

        for minute, total, effective in self._db.execute(
                "SELECT minute, total_s, effective_s FROM buckets WHERE job = ? AND "
                "minute > ? AND minute <= ?", (job, first, last)):
            add(minute, total or 0.0, effective or 0.0)
        for (name, minute), bucket in self._pending.items():
            if name == job:
                add(minute, bucket[0], bucket[1])
        stop = self._stops.get(job)
        if stop is not None:
            for minute, seconds in _per_minute(stop.seen(now),
                                               stop.lost(now, self.stopped_most_s)).items():
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

    def buckets(self, job: str) -> list[tuple[int, float, float]]:
        """Every stored (minute, total_s, effective_s) of a job, oldest first."""
        return list(self._db.execute(
            "SELECT minute, total_s, effective_s FROM buckets WHERE job = ? ORDER BY minute",
            (job,)))


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
