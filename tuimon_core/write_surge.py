"""A shared file system written far above its own level on one node: the checkpoint storm.

A checkpoint is a write burst by nature, so a burst alone is no finding: writes held at
SURGE_FACTOR times the node's own level of the last LEVEL_WINDOW_S (the median of its
BUCKET_S means, the surge's own buckets left out) for a whole SURGE_HOLD_S are. A normal
checkpoint of a few tens of seconds never holds that long; a storm (checkpoints back to
back, a job saving every step) does. The level is never taken below LEVEL_FLOOR, so a
node that wrote nothing before cannot raise it with a trickle, and the level is only
judged once MIN_LEVEL_S of it was seen. Severity `info`: it is the cause a job's
`checkpoint` (or `data`) waiting is put down to, not a fault of its own. A surge that
lasts past THAW_S is the node's new normal: the level takes it in.

Standard library only: the agent runs it beside the other node rules.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from tuimon_core.filesystems import SHARED_FSTYPES
from tuimon_core.findings import Finding
from tuimon_core.protocol.rows import FsRow
from tuimon_core.units import rate
from tuimon_core.wording import duration_text

BUCKET_S = 10.0
LEVEL_WINDOW_S = 1800.0
MIN_LEVEL_S = 30.0
SURGE_HOLD_S = 60.0
SURGE_FACTOR = 5.0
LEVEL_FLOOR = 100e6  # bytes/s
THAW_S = 1800.0
HELD_BUCKETS = int(SURGE_HOLD_S / BUCKET_S)
STALE_S = 2 * BUCKET_S  # no write rate from the mount this long: its surge is not said
KIND = "storage_surge"
SCORE = 0.6  # below a leaf's congestion, above a straggler without a cause


@dataclass
class _Mount:
    level: deque[float] = field(default_factory=lambda: deque(
        maxlen=int(LEVEL_WINDOW_S / BUCKET_S)))
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=HELD_BUCKETS))
    bucket_at: float | None = None  # when the open bucket began
    bucket_sum: float = 0.0  # bytes/s x seconds in the open bucket
    bucket_s: float = 0.0
    surge_since: float | None = None
    seen_at: float = 0.0  # the last sample that gave its write rate


class WriteSurge:
    """One node's writes to each shared file system, a sample at a time."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._mounts: dict[str, _Mount] = {}

    def observe(self, filesystems: Iterable[FsRow], now: float, dt: float) -> None:
        for f in filesystems:
            if f.get("fstype") not in SHARED_FSTYPES:
                continue
            rate: float | None = f.get("write_bytes_s")
            if not isinstance(rate, (int, float)) or isinstance(rate, bool):
                continue
            m = self._mounts.get(f["id"])
            if m is None:
                if len(self._mounts) >= 64:
                    continue
                m = self._mounts[f["id"]] = _Mount()
            m.seen_at = now
            if m.bucket_at is None:
                m.bucket_at = now
            m.bucket_sum += rate * dt
            m.bucket_s += dt
            if now - m.bucket_at >= BUCKET_S and m.bucket_s > 0:
                self._close(m, m.bucket_sum / m.bucket_s, now)
                m.bucket_at, m.bucket_sum, m.bucket_s = now, 0.0, 0.0

    def _close(self, m: _Mount, mean: float, now: float) -> None:
        m.recent.append(mean)
        judged = len(m.level) * BUCKET_S >= MIN_LEVEL_S
        level = max(LEVEL_FLOOR, statistics.median(m.level)) if m.level else LEVEL_FLOOR
        high = mean >= SURGE_FACTOR * level
        if judged and high:
            if m.surge_since is None:
                m.surge_since = now
            if now - m.surge_since < THAW_S:
                return  # the surge's buckets are not its own level
        else:
            m.surge_since = None
        m.level.append(mean)

    def conditions(self, now: float) -> list[Finding]:
        out = []
        # A mount that no longer gives its writes (unmounted, unreadable) says nothing:
        # its surge is not known to hold; one gone for the level's window is forgotten.
        for gone in [k for k, m in self._mounts.items() if now - m.seen_at > LEVEL_WINDOW_S]:
            del self._mounts[gone]
        for mount, m in self._mounts.items():
            if m.surge_since is None or len(m.recent) < HELD_BUCKETS \
                    or now - m.seen_at > STALE_S:
                continue
            median = statistics.median(m.level) if m.level else 0.0
            level = max(LEVEL_FLOOR, median)
            if min(m.recent) < SURGE_FACTOR * level:
                continue  # not held for the whole of SURGE_HOLD_S
            was = rate(level) if median >= LEVEL_FLOOR else f"under {rate(LEVEL_FLOOR)}"
            out.append(Finding(
                "info", KIND,
                f"{self.node} writes {mount} at {rate(m.recent[-1])}, "
                f"x{m.recent[-1] / level:.0f} its level ({was}), held "
                f"{duration_text(SURGE_HOLD_S)}",
                node=self.node, fs=mount, score=SCORE))
        return out
