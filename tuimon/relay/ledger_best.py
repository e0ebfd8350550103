"""The ledger's best for each job: its per-GPU throughput (samples over rank-seconds) over
the best BEST_MINUTES consecutive minutes of its run, every one counted, by the model's
rule (tuimon.model.efficiency.Best): read from the file's minutes at start, and judged
again as minutes are written.
"""

from __future__ import annotations

import sqlite3

from tuimon.model.efficiency import BEST_COVERED, BEST_WINDOW_S, Best
from tuimon_core.protocol.schema import MAX_NUM
from tuimon_core.protocol.text import clean

# The job's best: per-GPU throughput over this many consecutive minutes, every one counted
# (the model's window: the viewer judges its own count by the same).
BEST_MINUTES = int(BEST_WINDOW_S // 60)
BEST_COVERED_S = BEST_COVERED * BEST_WINDOW_S


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


class Bests:
    """Each job's best so far, and how far its minutes were judged."""

    def __init__(self) -> None:
        # job -> its best per-GPU samples/s over BEST_MINUTES, and the last minute whose
        # window was offered to it
        self.best: dict[str, Best] = {}
        self.offered: dict[str, int] = {}
        # job -> the oldest minute written whose windows are not all judged yet
        self.due: dict[str, int] = {}

    def load(self, db: sqlite3.Connection, now_minute: int) -> None:
        """Each job's best from the file, once, at start: every window in order, by the
        same rule as while counting (efficiency.Best), so a best is what its history
        allows whatever a minute in the file says."""
        rows: dict[str, list[tuple[int, float, float]]] = {}
        for job, minute, samples, rank_s in db.execute(
                "SELECT job, minute, samples, rank_s FROM buckets WHERE rank_s > 0 "
                "ORDER BY job, minute"):
            rows.setdefault(clean(job), []).append((minute, samples, rank_s))
        for job, job_rows in rows.items():
            best = Best()
            offered = _offer_windows(best, job_rows, now_minute, None)
            if best.value is not None:
                self.best[job] = best
            if offered is not None:
                self.offered[job] = offered

    def note(self, db: sqlite3.Connection, written: dict[str, int], now_minute: int) -> None:
        """After a flush: the windows that end at the minutes just written (job -> the
        oldest), and at minutes that became whole since (a job's last minute is whole
        only after the job stopped sending)."""
        for job, oldest in written.items():
            self.due[job] = min(oldest, self.due.get(job, oldest))
        for job, oldest in list(self.due.items()):
            rows = [(m, n, r) for m, n, r in db.execute(
                "SELECT minute, samples, rank_s FROM buckets WHERE job = ? AND minute >= ? "
                "AND rank_s > 0 ORDER BY minute", (job, oldest - BEST_MINUTES))]
            best = self.best.get(job) or Best()
            offered = _offer_windows(best, rows, now_minute, self.offered.get(job))
            if best.value is not None:
                self.best[job] = best
            if offered is not None:
                self.offered[job] = offered
            newest = rows[-1][0] if rows else oldest
            if newest < now_minute:
                del self.due[job]  # every window ending at its minutes judged
            else:
                self.due[job] = newest  # judged again once this minute is whole

