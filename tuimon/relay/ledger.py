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
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuimon.model.efficiency import BEST_COVERED, BEST_WINDOW_S
from tuimon.model.slo import BURN_WINDOWS_S
from tuimon_core.errors import UsageError
from tuimon_core.protocol.fields import MAX_BUDGET_JOBS
from tuimon_core.protocol.schema import MAX_NUM
from tuimon_core.protocol.text import clean
from tuimon_core.wait_kinds import OTHER, WAIT_KINDS, split_wait, wait_kind

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
# Columns added to `buckets` in layout 2: samples processed and rank-seconds of wall
# time, so the job's best sustained per-GPU throughput (samples / rank-seconds) is read
# from the minutes themselves.
BUCKET_COLUMNS_2 = ("samples", "rank_s")
# The file's layout (PRAGMA user_version): 0, the first ledgers (buckets, totals); 1 adds
# `waits`; 2 adds BUCKET_COLUMNS_2. An older file is brought up to it in place, every
# minute kept; a newer one (a later relay's) is refused rather than written in a layout
# this relay does not know.
SCHEMA_VERSION = 2
# The job's best: per-GPU throughput over this many consecutive minutes, every one counted
# (the model's window: the viewer judges its own count by the same).
BEST_MINUTES = int(BEST_WINDOW_S // 60)
BEST_COVERED_S = BEST_COVERED * BEST_WINDOW_S
TOTALS_UPSERT = """
INSERT INTO totals (source, job, since, wall, compute, at) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (source, job) DO UPDATE SET since = excluded.since, wall = excluded.wall,
    compute = excluded.compute, at = excluded.at
"""
UPSERT = """
INSERT INTO buckets (job, minute, total_s, effective_s, samples, rank_s)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (job, minute) DO UPDATE SET total_s = total_s + excluded.total_s,
                                        effective_s = effective_s + excluded.effective_s,
                                        samples = samples + excluded.samples,
                                        rank_s = rank_s + excluded.rank_s
"""
# Unwritten minutes kept in memory while the disk refuses them (jobs x minutes).
MAX_PENDING = 100_000
# The wall clock moving this far apart from the monotonic one since start is a jump: a
# prune then would take history the clock only seems to have left behind.
JUMP_S = 3600.0
# Rank-seconds the totals must show missing before any is credited (float sums differ by
# less than this from the per-sample ones).
RECOVER_AT_LEAST_S = 0.01


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
    real = path.resolve()
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
                 window_hours: float = 720.0, max_bytes: int | None = None,
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
        # job -> (best per-GPU samples/s over BEST_MINUTES, the minute that window ended)
        self._best: dict[str, tuple[float, int]] = {}
        # job -> the oldest minute written whose windows are not all judged yet
        self._due: dict[str, int] = {}
        self._pending_waits: dict[tuple[str, int, str], float] = {}
        self._lost_minutes = 0
        # (source, job) -> (since, wall, compute, at): the agents' totals as last counted
        # (to write), and as the file had them when this relay started (to recover from).
        self._totals: dict[tuple[str, str], tuple[float, float, float, float]] = {}
        self._stored: dict[tuple[str, str], tuple[float, float, float, float]] = {}
        self._last: dict[tuple[str, str], tuple[float, float, float, float]] = {}
        # job -> run seconds credited from the agents' totals for time this relay missed
        # (since it started); and what of it is not yet in the log.
        self.recovered_s: dict[str, float] = {}
        self._unsaid: dict[str, list[Any]] = {}
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
            self._db.executescript(SCHEMA + TOTALS_SCHEMA + WAITS_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(buckets)")}
            for column in BUCKET_COLUMNS_2:
                if column not in columns:
                    self._db.execute(f"ALTER TABLE buckets ADD COLUMN {column} REAL NOT NULL "
                                     "DEFAULT 0")
            if version < SCHEMA_VERSION:
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._best = self._best_stored()
            self._stored = {(source, job): (since, wall, compute, at) for
                            source, job, since, wall, compute, at in self._db.execute(
                                "SELECT source, job, since, wall, compute, at FROM totals")}
        except (OSError, sqlite3.Error) as exc:
            self._unlock()
            raise LedgerError(f"ledger {self.path}: {exc}") from None
        except LedgerError:
            self._unlock()
            raise
        self._warn_future()

    def _unlock(self) -> None:
        fds, self._lock_fd = self._lock_fd, (-1, -1)
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)  # closing the descriptor releases the flock

    def close(self) -> None:
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
        samples processed and the rank-seconds they took, for the job's best."""
        if total_s <= 0:
            return
        minute = int(ts // 60)
        key = (job, minute)
        bucket = self._pending.get(key)
        if bucket is None:
            if len(self._pending) >= MAX_PENDING:
                self._lost_minutes += 1
                return
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

    def add_totals(self, source: str, entry: dict[str, Any], now: float) -> None:
        """An agent's cumulative sums for a job (its steps family's `total`), after this
        sample's own sums were added. Where the totals grew by more than this sample's
        own sums since this relay last counted them (from the file, for a relay that was
        away; in memory, for samples missed on the way), the difference is what this
        relay missed: credited evenly over the minutes between, and never more than that
        time allows for the node's ranks."""
        total = entry["total"]
        key = (source, entry["id"])
        last = self._last.get(key)
        if last is None:
            last = self._stored.pop(key, None)
        if last is not None:
            self._recover(source, entry, last, now)
        self._last[key] = self._totals[key] = (total["since"], total["wall"],
                                               total["compute"], now)

    def _recover(self, source: str, entry: dict[str, Any],
                 last: tuple[float, float, float, float], now: float) -> None:
        since, wall0, compute0, at = last
        total = entry["total"]
        ranks = entry.get("ranks") or ()
        # This sample's own sums were counted as usual: the gap is what came before them.
        wall = total["wall"] - sum(r.get("wall") or 0.0 for r in ranks)
        compute = total["compute"] - sum(r.get("compute") or 0.0 for r in ranks)
        if total["since"] != since:  # the agent counts anew: all it counted is in the gap
            wall0 = compute0 = 0.0
        away = now - at
        gap_wall = min(wall - wall0, away * max(1, len(ranks)))
        if away <= 0 or gap_wall < RECOVER_AT_LEAST_S:
            return  # the usual case: nothing was missed (float sums differ by dust)
        gap_compute = min(max(0.0, compute - compute0), gap_wall)
        world = max(1, int(entry.get("world") or 1))
        job = entry["id"]
        # Evenly over the minutes between: the burn windows see the gap where it was.
        for minute in range(int(at // 60), int(now // 60) + 1):
            lo, hi = max(at, minute * 60.0), min(now, minute * 60.0 + 60.0)
            if hi > lo:
                share = (hi - lo) / away
                self.add(job, lo, gap_wall * share / world, gap_compute * share / world)
        self.recovered_s[job] = self.recovered_s.get(job, 0.0) + gap_wall / world
        said = self._unsaid.setdefault(job, [0.0, set(), 0.0])
        said[0] += gap_wall / world
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
        if not self._pending and not self._totals:
            if self._due and self.error is None:
                self._note_best({})  # a job's last minute becomes whole after it stopped
            return self.error is None
        rows = [(job, minute, *sums) for (job, minute), sums in self._pending.items()]
        totals = [(source, job, *values) for (source, job), values in self._totals.items()]
        waits = [(*key, seconds) for key, seconds in self._pending_waits.items()]
        try:
            with self._db:  # one transaction: all of it or none of it
                self._db.execute("BEGIN")
                self._db.executemany(UPSERT, rows)
                self._db.executemany(TOTALS_UPSERT, totals)
                self._db.executemany(WAITS_UPSERT, waits)
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
        return True

    # -- the job's best ---------------------------------------------------------------

    @staticmethod
    def _best_in(rows: list[tuple[int, float, float]], before: int) -> tuple[float, int] | None:
        """The best per-GPU throughput over BEST_MINUTES consecutive minutes of `rows`
        (minute, samples, rank-seconds; oldest first), among windows that end before the
        minute `before` (a minute still being counted is not a whole one)."""
        best = None
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
            if len(window) == BEST_MINUTES and rank_s >= BEST_COVERED_S:
                value = samples / rank_s
                if value <= MAX_NUM and (best is None or value > best[0]):
                    best = (value, row[0])
        return best

    def _best_stored(self) -> dict[str, tuple[float, int]]:
        """Each job's best from the file, once, at start."""
        rows: dict[str, list[tuple[int, float, float]]] = {}
        for job, minute, samples, rank_s in self._db.execute(
                "SELECT job, minute, samples, rank_s FROM buckets WHERE rank_s > 0 "
                "ORDER BY job, minute"):
            rows.setdefault(clean(job), []).append((minute, samples, rank_s))
        now_minute = int(self.clock() // 60)
        out = {}
        for job, job_rows in rows.items():
            best = self._best_in(job_rows, now_minute)
            if best is not None:
                out[job] = best
        return out

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
            best = self._best_in(rows, now_minute)
            if best is not None and (job not in self._best or best[0] > self._best[job][0]):
                self._best[job] = best
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
        self._last = {k: v for k, v in self._last.items() if v[3] >= first * 60.0}
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
                self._db.execute("DELETE FROM totals WHERE at < ?", (first * 60.0,))
        except sqlite3.Error as exc:
            log.error("ledger %s: cannot prune: %s", self.path, exc)
            return 0
        log.info("ledger %s: pruned %d minute buckets older than %g days", self.path,
                 cur.rowcount, self.keep_days)
        return cur.rowcount

    # -- reading ------------------------------------------------------------------

    def summary(self, now: float | None = None) -> dict[str, dict[str, Any]]:
        """Per job: since when it is counted, consumed and observed hours over the window,
        and the error ratio of each burn window (nil where nothing was observed)."""
        now = self.clock() if now is None else now
        minute_now = int(now // 60)
        sums: dict[str, dict[str, Any]] = {}

        def add(job: str, key: str, total: float, effective: float) -> None:
            entry = sums.setdefault(job, {"windows": {}})
            t, e = entry["windows"].get(key, (0.0, 0.0))
            entry["windows"][key] = (t + total, e + effective)

        windows = {"run": self.window_hours * 3600}
        windows.update(BURN_WINDOWS_S)
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
        # What the run window's lost time waited on, by named kind; `other` is the rest.
        first_run = minute_now - int(windows["run"] // 60)
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
        since = {clean(job): minute for job, minute in self._db.execute(
            "SELECT job, MIN(minute) FROM buckets WHERE minute <= ? GROUP BY job",
            (minute_now,))}
        for (job, minute) in self._pending:
            since[job] = min(since.get(job, minute), minute)
        out: dict[str, dict[str, Any]] = {}
        if len(sums) > MAX_BUDGET_JOBS:
            # What a viewer reads in one batch: the jobs seen most recently.
            latest = {clean(job): minute for job, minute in self._db.execute(
                "SELECT job, MAX(minute) FROM buckets WHERE minute <= ? GROUP BY job",
                (minute_now,))}
            for job, minute in self._pending:
                latest[job] = max(latest.get(job, minute), minute)
            keep = sorted(sums, key=lambda j: latest.get(j, 0), reverse=True)[:MAX_BUDGET_JOBS]
            sums = {job: sums[job] for job in keep}
        for job, entry in sums.items():
            total, effective = entry["windows"].get("run", (0.0, 0.0))
            ratios = {}
            for key in BURN_WINDOWS_S:
                t, e = entry["windows"].get(key, (0.0, 0.0))
                ratios[key] = 1 - e / t if t > 0 else None
            # The named waits as shares of the time lost; the rest is `other`.
            spent = split_wait(named.get(job), max(0.0, total - effective))
            recovered = self.recovered_s.get(job)
            if recovered:
                out.setdefault(job, {})["recovered_h"] = recovered / 3600
            out[job] = {**out.get(job, {}), "since": since.get(job, minute_now) * 60.0,
                        "window_h": self.window_hours,
                        "consumed_h": (total - effective) / 3600,
                        "spent_h": {k: spent[k] / 3600 for k in WAIT_KINDS if k in spent},
                        **({"best_per_gpu": self._best[job][0],
                            "best_at": self._best[job][1] * 60.0 + 60.0}
                           if job in self._best else {}),
                        "observed_h": total / 3600,
                        "error_ratio": ratios,
                        "error": self.error}
        return out

    def buckets(self, job: str) -> list[tuple[int, float, float]]:
        """Every stored (minute, total_s, effective_s) of a job, oldest first."""
        return list(self._db.execute(
            "SELECT minute, total_s, effective_s FROM buckets WHERE job = ? ORDER BY minute",
            (job,)))
