"""The ledger's SQLite store: its tables and their layouts (PRAGMA user_version, an older
file brought up to date in place), the locks that keep a second relay off the file, rows
of the wrong kind set aside, the minutes not yet written (`Pending`) and the one
transaction that writes them, and the retention's prune.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from tuimon.model.attribution import FOLDED
from tuimon.relay import episodes
from tuimon_core.errors import UsageError
from tuimon_core.protocol.fields import MAX_CAUSE
from tuimon_core.wait_kinds import OTHER, wait_kind

# The ledger's modules log under one name, the one its lines have always carried.
log = logging.getLogger("tuimon.relay.ledger")

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
# Causes sent per job and kind; the rest are folded into FOLDED.
CAUSES_SENT = 8


def when(minute: int | None) -> str:
    """A minute (Unix time // 60) as the log says it."""
    return "-" if minute is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(minute * 60))


class LedgerError(UsageError):
    """The ledger file cannot be opened; the message names the path and the reason."""


def lock(path: Path) -> tuple[int, int]:
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


def unlock(fds: tuple[int, int]) -> None:
    """Release the locks `lock` took (-1: none)."""
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the descriptor releases the flock


def connect(path: Path, max_bytes: int | None) -> sqlite3.Connection:
    """The file opened (WAL), checked, brought up to SCHEMA_VERSION and its unsound rows
    set aside. Raises LedgerError (a newer layout, a damaged file) or sqlite3.Error."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    if max_bytes is not None:
        page = db.execute("PRAGMA page_size").fetchone()[0]
        db.execute(f"PRAGMA max_page_count={max(1, max_bytes // page)}")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise LedgerError(f"ledger {path} was written by a newer relay (layout "
                          f"{version}, this one knows up to {SCHEMA_VERSION}); run "
                          "that relay, or give --ledger another path")
    # Sound before anything is written to it (a layout brought up to date).
    check = db.execute("PRAGMA quick_check").fetchone()[0]
    if check != "ok":
        raise LedgerError(f"ledger {path} is damaged ({check}); move it aside "
                          "and the relay starts a new one")
    db.executescript(SCHEMA + TOTALS_SCHEMA + WAITS_SCHEMA + CAUSES_SCHEMA
                     + STOPS_SCHEMA + episodes.SCHEMA)
    columns = {row[1] for row in db.execute("PRAGMA table_info(buckets)")}
    for column in BUCKET_COLUMNS_2:
        if column not in columns:
            db.execute(f"ALTER TABLE buckets ADD COLUMN {column} REAL NOT NULL DEFAULT 0")
    columns = {row[1] for row in db.execute("PRAGMA table_info(totals)")}
    for column in TOTALS_COLUMNS_4:
        if column not in columns:  # NULL in the rows before: not known
            db.execute(f"ALTER TABLE totals ADD COLUMN {column} INTEGER")
    if TOTALS_COLUMN_6 not in columns:
        db.execute(f"ALTER TABLE totals ADD COLUMN {TOTALS_COLUMN_6} TEXT")
    if version < SCHEMA_VERSION:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    set_aside_damaged(db, path)
    return db


def set_aside_damaged(db: sqlite3.Connection, path: Path) -> None:
    """Rows whose values are not of their column's kind (a text where a number is
    kept, a blob for a name, an infinite sum: written by hand, or damaged) are moved
    to a `damaged_<table>` table beside theirs, in one transaction, and said once
    with their count: kept, never read, so no sum or name read later can fail on
    them."""
    moved = {}
    with db:
        db.execute("BEGIN")
        for table, sound in SOUND_ROWS.items():
            bad = f"NOT ({sound})"
            count = db.execute(f"SELECT COUNT(*) FROM {table} WHERE {bad}").fetchone()[0]
            if not count:
                continue
            db.execute(f"CREATE TABLE IF NOT EXISTS damaged_{table} AS "
                       f"SELECT * FROM {table} WHERE 0")
            # A damaged_ table an older layout made lacks the columns added since.
            columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            kept = {r[1] for r in db.execute(f"PRAGMA table_info(damaged_{table})")}
            for column in columns:
                if column not in kept:
                    db.execute(f"ALTER TABLE damaged_{table} ADD COLUMN {column}")
            names = ", ".join(columns)
            db.execute(f"INSERT INTO damaged_{table} ({names}) SELECT {names} "
                       f"FROM {table} WHERE {bad}")
            db.execute(f"DELETE FROM {table} WHERE {bad}")
            moved[table] = count
    for table, count in moved.items():
        log.error("ledger %s: %d row(s) of %s hold values of the wrong kind (damaged, or "
                  "written by hand); skipped: moved to damaged_%s", path, count,
                  table, table)


def warn_future(db: sqlite3.Connection, path: Path, now_minute: int) -> None:
    """Minutes ahead of this relay's clock (a file from a relay whose clock ran fast)
    are not counted in any window; say so once, at start."""
    ahead = db.execute("SELECT COUNT(*), MAX(minute) FROM buckets WHERE minute > ?",
                       (now_minute + 1,)).fetchone()
    if ahead and ahead[0]:
        log.warning("ledger %s: %d minute buckets are ahead of this relay's clock (up to "
                    "%.0f h ahead); they are kept but counted in no window", path,
                    ahead[0], (ahead[1] - now_minute) / 60)


def open_episodes(db: sqlite3.Connection) -> episodes.Episodes:
    """The episodes the file has open, to go on with (and the next number)."""
    top = db.execute("SELECT MAX(id) FROM episodes").fetchone()[0]
    found = episodes.Episodes(int(top or 0) + 1)
    rows = [episodes.read(r) for r in db.execute(
        f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE ended IS NULL")]
    found.resume([e for e in rows if e is not None])
    return found


class Pending:
    """What was counted and is not written yet: the next flush writes it, and every
    reading adds it to the file's rows (a disk that refuses loses no minute)."""

    def __init__(self) -> None:
        # (job, minute) -> [total_s, effective_s, samples, rank_s]
        self.minutes: dict[tuple[str, int], list[float]] = {}
        # (job, minute, kind) -> run seconds waited
        self.waits: dict[tuple[str, int, str], float] = {}
        # (job, hour, kind, cause) -> run seconds
        self.causes: dict[tuple[str, int, str, str], float] = {}
        # (job, hour, kind) -> the causes named in it: at most CAUSES_SENT, the rest folded
        self.hour_causes: dict[tuple[str, int, str], set[str]] = {}
        self.lost_minutes = 0

    def add_minute(self, job: str, ts: float, total_s: float, effective_s: float,
                   waits: dict[str, float] | None = None, samples: float = 0.0,
                   rank_s: float = 0.0) -> bool:
        """Run seconds into the job's minute at `ts` (and what they waited on, by named
        kind); False where MAX_PENDING minutes wait already and this one is not kept."""
        minute = int(ts // 60)
        key = (job, minute)
        bucket = self.minutes.get(key)
        if bucket is None:
            if len(self.minutes) >= MAX_PENDING:
                self.lost_minutes += 1
                return False
            bucket = self.minutes[key] = [0.0, 0.0, 0.0, 0.0]
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
                self.waits[wkey] = self.waits.get(wkey, 0.0) + seconds
        return True

    def add_cause(self, job: str, hour: int, kind: str, cause: str, seconds: float) -> None:
        """Seconds of a kind put down to a cause, in the hour; past CAUSES_SENT names in
        a (job, hour, kind), or while the disk refuses, under FOLDED."""
        names = self.hour_causes.setdefault((job, hour, kind), set())
        cause = cause[:MAX_CAUSE]
        if cause not in names:
            if len(names) >= CAUSES_SENT or len(self.causes) >= MAX_PENDING:
                cause = FOLDED
            names.add(cause)
        key = (job, hour, kind, cause)
        self.causes[key] = self.causes.get(key, 0.0) + seconds

    def written(self, hour_now: int) -> None:
        """All of it is in the file now; the hours before the last keep no names."""
        self.minutes.clear()
        self.waits.clear()
        self.causes.clear()
        self.hour_causes = {k: v for k, v in self.hour_causes.items() if k[1] >= hour_now - 1}


def write(db: sqlite3.Connection, pending: Pending, *, totals: list[tuple[Any, ...]],
          stops: list[tuple[str, str, str]], stops_gone: list[tuple[str]],
          incidents: list[tuple[Any, ...]]) -> None:
    """The pending minutes, waits and causes, the agents' totals they were counted up
    to, the stops open now (and those gone) and the episodes changed, in one transaction:
    all of it or none of it (sqlite3.Error, the file as it was)."""
    with db:
        db.execute("BEGIN")
        db.executemany(episodes.UPSERT, incidents)
        db.executemany(UPSERT, [(job, minute, *sums)
                                for (job, minute), sums in pending.minutes.items()])
        db.executemany(TOTALS_UPSERT, totals)
        db.executemany(WAITS_UPSERT, [(*key, s) for key, s in pending.waits.items()])
        db.executemany(CAUSES_UPSERT, [(*key, s) for key, s in pending.causes.items()])
        db.executemany("DELETE FROM stops WHERE job = ?", stops_gone)
        db.executemany("INSERT OR REPLACE INTO stops (job, spans, cause) VALUES (?, ?, ?)",
                       stops)


def prune(db: sqlite3.Connection, path: Path, first: int, keep_days: float) -> int:
    """Drop the rows before the minute `first` (the episodes that ended before it, and
    past MAX_EPISODES the oldest that ended); returns how many buckets went. Refused
    and logged where every bucket would go (the clock far ahead of the one that wrote
    them)."""
    try:
        old, total, newest_old = db.execute(
            "SELECT SUM(minute < ?), COUNT(*), MAX(CASE WHEN minute < ? THEN minute END) "
            "FROM buckets", (first, first)).fetchone()
        old, total = old or 0, total or 0
        if not old:
            return 0
        if old == total:
            log.error("ledger %s: every bucket (%d) is older than %g days by this relay's "
                      "clock (newest %s); not pruning: check the clock", path, total,
                      keep_days, when(newest_old))
            return 0
        with db:
            db.execute("BEGIN")
            cur = db.execute("DELETE FROM buckets WHERE minute < ?", (first,))
            db.execute("DELETE FROM waits WHERE minute < ?", (first,))
            db.execute("DELETE FROM causes WHERE hour < ?", (first // 60,))
            db.execute("DELETE FROM totals WHERE at < ?", (first * 60.0,))
            db.execute("DELETE FROM episodes WHERE ended < ?", (first * 60.0,))
            # Past MAX_EPISODES the oldest that ended go: a fault that never stops
            # raising new findings cannot fill the disk.
            db.execute(
                "DELETE FROM episodes WHERE ended IS NOT NULL AND id IN (SELECT id FROM "
                "episodes WHERE ended IS NOT NULL ORDER BY onset DESC LIMIT -1 OFFSET ?)",
                (episodes.MAX_EPISODES,))
    except sqlite3.Error as exc:
        log.error("ledger %s: cannot prune: %s", path, exc)
        return 0
    log.info("ledger %s: pruned %d minute buckets older than %g days", path,
             cur.rowcount, keep_days)
    return cur.rowcount
