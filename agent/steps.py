"""Receiving step telemetry: bounded, validated datagrams, aggregated per job and rank.

Ranks on this node send one datagram per step (agent.reporter). The agent keeps, per
(job, rank), what arrived since the last sample (steps, wall, compute, samples, tokens)
and the running totals that /metrics exports, so PromQL can compute the same SLI.

The socket is writable by every local user (jobs run as their users), so whatever
arrives is bounded before it counts (docs/security.md, "the step socket"):

- a rank is credited at most the real time that passed: its step seconds come out of
  an allowance that grows one second per second. A new rank starts with the agent's
  interval and a few seconds of slack, so `{"wall": 86400}` counts a few seconds, not
  a day; unused allowance keeps up to `ALLOWANCE_CAP_S` (a long step, a stall);
- a job belongs to the user (uid, from the kernel's SO_PASSCRED) that reported it
  first, while it lives: another user's reports for it are refused, so nobody can burn
  another user's budget;
- each user gets at most `SENDER_RATE` datagrams a second (a token bucket) before
  decoding: a flood costs the flooder, and is counted;
- names are cleaned and at most `MAX_JOB_NAME` characters, at most `MAX_JOBS` jobs
  and `MAX_RANKS` ranks a node, forgotten after `IDLE_S` of silence: the sample's steps
  section stays far under the frame limit whatever the socket receives;
- gaps in a rank's sequence numbers (reports its socket dropped, e.g. in a flood) are
  counted as lost, so a starved rank is never silent.

Every refusal is counted by reason (sent in the sample, exported in /metrics) and
logged at most once a minute per reason, with the count.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import stat
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from agent.reporter import MAX_DATAGRAM
from tuimon_core.efficiency_drop import BURN_SHORT_S, LONG_S, SHORT_S, DropJudge, judge_windows
from tuimon_core.protocol.fields import WAITS
from tuimon_core.protocol.text import clean
from tuimon_core.wait_kinds import add_waits, rank_kind, split_wait

log = logging.getLogger(__name__)

MAX_JOB_NAME = 128
MAX_JOBS = 64  # per node
MAX_RANKS = 1024  # per node, all jobs together: far above any real node's GPUs
IDLE_S = 600.0  # a rank silent this long is forgotten (and a job with no ranks released)
SENDER_RATE = 2000.0  # datagrams a second per user (uid), with a burst of twice that
ALLOWANCE_SLACK_S = 5.0  # a new rank's allowance: the agent's interval plus this
ALLOWANCE_CAP_S = 600.0  # at most this much unused allowance (the longest step credited)
LOG_EVERY_S = 60.0
# The windows each job's sums are also sent over (seconds, and how often a point of the
# history is kept): a viewer that connects now reads the last minute and the last hour
# of the job at once, as this node saw it, instead of waiting an hour to know (a drop
# in efficiency is the last minute against the hour before it), and the burn page's
# five minutes. The minute and the hour come first: the drop is judged from them.
STEP_WINDOWS: tuple[tuple[float, float], ...] = ((SHORT_S, 1.0), (LONG_S, 10.0),
                                                 (BURN_SHORT_S, 5.0))
REFUSALS = ("invalid", "name_too_long", "too_many_jobs", "too_many_ranks", "not_owner",
            "flood")
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid


class StepError(ValueError):
    """A datagram that is not a valid step report; `kind` is its refusal reason."""

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


def decode_step(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_DATAGRAM:
        raise StepError(f"datagram of {len(data)} bytes exceeds {MAX_DATAGRAM}")
    try:
        m = msgpack.unpackb(data, raw=False, max_str_len=512, max_array_len=16,
                            max_map_len=32, max_bin_len=0, max_ext_len=0)
    except Exception as exc:
        raise StepError(f"not msgpack: {exc}") from None
    if not isinstance(m, dict) or m.get("t") not in ("step", "end") or m.get("v") != 1:
        raise StepError("not a version 1 step report")
    job, rank, world = m.get("job"), m.get("rank"), m.get("world")
    if not isinstance(job, str) or not job:
        raise StepError("job: expected a name")
    if len(job) > MAX_JOB_NAME:
        raise StepError(f"job name of {len(job)} characters (limit {MAX_JOB_NAME})",
                        "name_too_long")
    if type(rank) is not int or type(world) is not int or not 0 <= rank < world <= 1 << 20:
        raise StepError(f"rank/world: expected 0 <= rank < world, got {rank!r}/{world!r}")
    out: dict[str, Any] = {"job": clean(job), "rank": rank, "world": world}
    if m["t"] == "end":  # the rank says the run is complete (StepReporter.finish)
        out["end"] = True
        return out
    for key in ("wall", "compute"):
        v = m.get(key)
        if not (type(v) is int or type(v) is float) or not math.isfinite(v) \
                or not 0 <= v <= 86400:
            raise StepError(f"{key}: expected seconds in [0, 86400], got {v!r}")
        out[key] = float(v)
    if out["compute"] > out["wall"] * 1.001 + 1e-6:
        raise StepError("compute time longer than the step")
    for key in ("samples", "tokens"):
        v = m.get(key, 0)
        if type(v) is not int or not 0 <= v <= 1 << 40:
            raise StepError(f"{key}: expected a count, got {v!r}")
        out[key] = v
    waits = m.get("waits")
    if waits is not None:
        out["waits"] = _decode_waits(waits, out["wall"])
    seq, pid = m.get("seq"), m.get("pid")
    out["seq"] = seq if type(seq) is int and seq >= 0 else None
    out["pid"] = pid if type(pid) is int else None
    return out


def _decode_waits(waits: Any, wall: float) -> dict[str, float]:
    """A step's seconds waited by kind, as the wire's `waits` maps are bounded: each a
    number of seconds no longer than the step. Together they may be longer (a
    `waiting()` inside another counts its time twice): they are shares, scaled to the
    step's waiting when it is credited (split_wait)."""
    if type(waits) is not dict or len(waits) > WAITS.max_items:
        raise StepError("waits: expected a map of kind -> seconds")
    out: dict[str, float] = {}
    for k, v in waits.items():
        if type(k) is not str or len(k) > WAITS.key_len:
            raise StepError(f"waits: expected kind names, got {k!r:.40}")
        if not (type(v) is int or type(v) is float) or not math.isfinite(v) \
                or not 0 <= v <= wall * 1.001 + 1e-6:
            raise StepError(f"waits.{k!r:.40}: expected seconds within the step, "
                            f"got {v!r:.40}")
        out[k] = float(v)
    return out


@dataclass
class RankTotals:
    world: int
    steps: int = 0
    wall: float = 0.0
    compute: float = 0.0
    samples: int = 0
    tokens: int = 0
    waits: dict[str, float] = field(default_factory=dict)  # kind -> seconds


@dataclass
class _Rank:
    """What bounds one rank: its time allowance, its last report and sequence number."""

    allowance: float
    at: float  # monotonic time the allowance was last topped up
    last_seen: float
    pid: int | None = None
    seq: int | None = None


class _JobHistory:
    """One job's cumulative sums on this node (they only grow, whatever ranks come and
    go) and, per window, points of them over time to subtract from."""

    __slots__ = ("compute", "drop", "points", "samples", "since", "steps", "waits", "wall")

    def __init__(self, now: float, since: float) -> None:
        self.steps = 0
        self.wall = self.compute = 0.0
        self.samples = 0
        self.waits: dict[str, float] = {}  # kind -> seconds
        self.since = since  # Unix time the agent first counted the job
        # One deque a window: (monotonic time, wall, compute, samples, waits), oldest
        # first.
        self.points: list[deque[tuple[float, float, float, int, dict[str, float]]]] = [
            deque([(now, 0.0, 0.0, 0, {})]) for _ in STEP_WINDOWS]
        self.drop = DropJudge()

    def mark(self, now: float) -> None:
        point = (now, self.wall, self.compute, self.samples, dict(self.waits))
        for (span, every), q in zip(STEP_WINDOWS, self.points):
            if now - q[-1][0] >= every:
                q.append(point)
            # One point at or before the window's start stays: the sums are subtracted
            # from it.
            while len(q) > 1 and q[1][0] <= now - span:
                q.popleft()

    def windows(self, now: float) -> list[dict[str, Any]]:
        out = []
        for (span, _), q in zip(STEP_WINDOWS, self.points):
            at, wall, compute, samples, waits = q[0]
            window: dict[str, Any] = {"s": span, "covered": min(span, max(0.0, now - at)),
                                      "wall": max(0.0, self.wall - wall),
                                      "compute": max(0.0, self.compute - compute),
                                      "samples": max(0, self.samples - samples)}
            grown = {k: v - waits.get(k, 0.0) for k, v in self.waits.items()
                     if v - waits.get(k, 0.0) > 0}
            if grown:
                window["waits"] = grown
            out.append(window)
        return out

    def judge(self, windows: list[dict[str, Any]], now: float) -> dict[str, Any] | None:
        """This node's verdict on the job's efficiency: the last minute against the hour
        before it (tuimon_core.efficiency_drop), as the `drop` the sample carries."""
        return judge_windows(self.drop, windows[0], windows[1], now)

    def totals(self) -> dict[str, Any]:
        out: dict[str, Any] = {"steps": self.steps, "wall": self.wall, "compute": self.compute,
                               "samples": self.samples, "since": self.since}
        if self.waits:
            out["waits"] = dict(self.waits)
        return out


class _Bucket:
    """A token bucket: `rate` tokens a second, at most `burst`."""

    __slots__ = ("at", "burst", "rate", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class StepAggregator:
    """Per (job, rank): this interval's sums, and totals since the agent started."""

    def __init__(self, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.wall_clock = wall_clock
        self.allowance_first = interval + ALLOWANCE_SLACK_S
        self.allowance_cap = max(ALLOWANCE_CAP_S, 10 * interval)
        self.interval: dict[tuple[str, int], RankTotals] = {}
        self.totals: dict[tuple[str, int], RankTotals] = {}
        self.received = 0
        self.rejected = 0
        self.refused: dict[str, int] = dict.fromkeys(REFUSALS, 0)
        self.clipped = 0  # reports credited less than they claimed (time allowance)
        self.lost = 0  # reports missing from ranks' sequence numbers
        self.last_error: str | None = None
        self._ranks: dict[tuple[str, int], _Rank] = {}
        self._owners: dict[str, int | None] = {}  # job -> the uid it belongs to
        self._senders: dict[int | None, _Bucket] = {}
        self._lost_now: dict[str, int] = {}
        self._ended_now: dict[str, tuple[int, int]] = {}  # job -> (world, ranks that ended)
        self._jobs: dict[str, _JobHistory] = {}  # job -> its sums since first counted
        self._logged: dict[str, tuple[float, int]] = {}

    # -- receiving ---------------------------------------------------------------------

    def add(self, data: bytes, uid: int | None = None, pid: int | None = None) -> None:
        now = self.clock()
        bucket = self._senders.get(uid)
        if bucket is None:
            if len(self._senders) > 4096:  # a node has far fewer users
                self._senders.clear()
            bucket = self._senders[uid] = _Bucket(SENDER_RATE, 2 * SENDER_RATE, now)
        if not bucket.take(now):
            self._refuse("flood", f"more than {SENDER_RATE:.0f} step reports a second from "
                                  f"uid {uid}", now)
            return
        try:
            step = decode_step(data)
        except StepError as exc:
            self._refuse(exc.kind, str(exc), now)
            return
        job, rank = step["job"], step["rank"]
        key = (job, rank)
        owner = self._owners.get(job, uid)
        if owner != uid:
            self._refuse("not_owner", f"job {job!r} belongs to uid {owner}; a report for it "
                                      f"from uid {uid} was refused", now)
            return
        if step.get("end"):
            if job in self._owners:  # a job this node counts: its ranks' word, once each
                world, n = self._ended_now.get(job, (step["world"], 0))
                self._ended_now[job] = (world, n + 1)
                self.received += 1
                self._ranks.pop(key, None)
            return
        state = self._ranks.get(key)
        if state is None:
            if job not in self._owners and len(self._owners) >= MAX_JOBS:
                self._refuse("too_many_jobs", f"more than {MAX_JOBS} jobs on this node; "
                                              f"job {job!r} refused", now)
                return
            if len(self._ranks) >= MAX_RANKS:
                self._refuse("too_many_ranks", f"more than {MAX_RANKS} ranks on this node; "
                                               f"{job!r} rank {rank} refused", now)
                return
            state = self._ranks[key] = _Rank(self.allowance_first, now, now)
            self._owners[job] = uid
        self._count_lost(job, state, step, now)
        wall, compute = self._credit(state, step["wall"], step["compute"], now)
        samples, tokens = step["samples"], step["tokens"]
        if wall < step["wall"]:  # cut by the allowance: the counts in proportion, so the
            share = wall / step["wall"]  # rate they make is not raised by the cut
            samples, tokens = int(samples * share), int(tokens * share)
        # What the credited waiting was spent on, in the shares the report gave.
        waits = split_wait(step.get("waits"), wall - compute, step["wall"] - step["compute"],
                           rank_kind)
        self.received += 1
        history = self._jobs.get(job)
        if history is None:
            history = self._jobs[job] = _JobHistory(now, self.wall_clock())
        history.steps += 1
        history.wall += wall
        history.compute += compute
        history.samples += samples
        add_waits(history.waits, waits)
        for table in (self.interval, self.totals):
            t = table.get(key)
            if t is None:
                t = table[key] = RankTotals(step["world"])
            t.world = step["world"]
            t.steps += 1
            t.wall += wall
            t.compute += compute
            t.samples += samples
            t.tokens += tokens
            add_waits(t.waits, waits)

    def _credit(self, state: _Rank, wall: float, compute: float,
                now: float) -> tuple[float, float]:
        """The seconds a report may count: no more than the rank's allowance, which grows
        with real time. Compute keeps its share of the step when the wall is cut."""
        state.allowance = min(self.allowance_cap, state.allowance + (now - state.at))
        state.at = state.last_seen = now
        if wall > state.allowance:
            self.clipped += 1
            share = compute / wall if wall > 0 else 0.0
            wall = state.allowance
            compute = wall * share
        state.allowance -= wall
        return wall, min(compute, wall)

    def _count_lost(self, job: str, state: _Rank, step: dict[str, Any], now: float) -> None:
        """Reports missing from the rank's sequence: at most as many as could have been
        sent since its last (SENDER_RATE a second, and a burst); a larger gap, or a
        sequence that went back, is a reporter that started again, not loss (a sender
        alternating 2^64-1 and 0 counts nothing)."""
        seq, pid = step["seq"], step["pid"]
        if seq is None:
            return
        if state.pid == pid and state.seq is not None and seq > state.seq + 1:
            missing = seq - state.seq - 1
            if missing <= (now - state.last_seen) * SENDER_RATE + 2 * SENDER_RATE:
                self.lost += missing
                self._lost_now[job] = self._lost_now.get(job, 0) + missing
        state.pid, state.seq = pid, seq

    def _refuse(self, kind: str, message: str, now: float) -> None:
        self.rejected += 1
        self.refused[kind] = self.refused.get(kind, 0) + 1
        self.last_error = message
        last, pending = self._logged.get(kind, (-math.inf, 0))
        if now - last >= LOG_EVERY_S:
            more = f" ({pending} more like it since the last message)" if pending else ""
            log.warning("step report refused: %s%s", message, more)
            self._logged[kind] = (now, 0)
        else:
            self._logged[kind] = (last, pending + 1)

    # -- sampling ----------------------------------------------------------------------

    def take(self) -> dict[str, Any] | None:
        """This interval's figures for the sample (nil when nothing arrived at all)."""
        self._forget_idle(self.clock())
        if not self.interval and not self.rejected and not self._lost_now \
                and not self._ended_now:
            return None
        jobs: dict[str, dict[str, Any]] = {}
        for (job, rank), t in sorted(self.interval.items()):
            entry = jobs.setdefault(job, {"id": job, "world": t.world, "ranks": []})
            r: dict[str, Any] = {"rank": rank, "steps": t.steps, "wall": t.wall,
                                 "compute": t.compute, "samples": t.samples,
                                 "tokens": t.tokens}
            if t.waits:
                r["waits"] = t.waits
            entry["ranks"].append(r)
        for job, n in self._lost_now.items():
            if job in jobs:
                jobs[job]["lost"] = n
        for job, (world, n) in self._ended_now.items():
            jobs.setdefault(job, {"id": job, "world": world, "ranks": []})["ended"] = n
        now = self.clock()
        for job, entry in jobs.items():
            history = self._jobs.get(job)
            if history is not None:
                history.mark(now)
                entry["total"] = history.totals()
                windows = entry["windows"] = history.windows(now)
                drop = history.judge(windows, now)
                if drop is not None:
                    entry["drop"] = drop
        self.interval = {}
        self._lost_now = {}
        self._ended_now = {}
        out: dict[str, Any] = {"jobs": list(jobs.values()), "received": self.received,
                               "rejected": self.rejected, "lost": self.lost,
                               "clipped": self.clipped}
        refused = {k: v for k, v in self.refused.items() if v}
        if refused:
            out["refused"] = refused
        return out

    def _forget_idle(self, now: float) -> None:
        idle = [k for k, r in self._ranks.items() if now - r.last_seen > IDLE_S]
        for key in idle:
            del self._ranks[key]
            self.totals.pop(key, None)
        if idle:
            alive = {job for job, _ in self._ranks}
            for job in [j for j in self._owners if j not in alive]:
                del self._owners[job]
            for job in [j for j in self._jobs if j not in alive]:
                del self._jobs[job]


# -- the socket -------------------------------------------------------------------------


class StepSocketError(OSError):
    """The step socket cannot be opened; the message says which path and why."""


class StepSocket:
    """The Unix datagram socket ranks send to: world-writable (jobs run as their users),
    with the sender's credentials read from each datagram (SO_PASSCRED, Linux)."""

    BATCH = 256  # datagrams read per wake-up, so a flood cannot hold the event loop

    def __init__(self, path: str, aggregator: StepAggregator) -> None:
        self.path = path
        self.aggregator = aggregator
        self._sock: socket.socket | None = None
        self._inode: tuple[int, int] | None = None
        self._creds = hasattr(socket, "SO_PASSCRED")

    def open(self) -> None:
        """Bind (refusing a path a live agent is serving), then read on the running loop."""
        import asyncio

        refuse_if_live(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            if self._creds:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            with contextlib.suppress(OSError):  # the kernel caps it at rmem_max
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # a stale socket: _refuse_if_live found nobody there
            sock.bind(self.path)
            os.chmod(self.path, 0o666)
            st = os.stat(self.path)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._inode = (st.st_dev, st.st_ino)
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        space = socket.CMSG_SPACE(_UCRED.size) if self._creds else 0
        for _ in range(self.BATCH):
            try:
                data, ancillary, _flags, _addr = sock.recvmsg(MAX_DATAGRAM + 1, space)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("step socket %s: %s", self.path, exc)
                return
            uid = pid = None
            for level, kind, payload in ancillary:
                if (level == socket.SOL_SOCKET and kind == getattr(socket, "SCM_CREDENTIALS", -1)
                        and len(payload) >= _UCRED.size):
                    pid, uid, _gid = _UCRED.unpack_from(payload)
            self.aggregator.add(data, uid, pid)

    def close(self) -> None:
        """Stop reading; remove the path only if it is still the socket this one made."""
        import asyncio

        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(RuntimeError, ValueError):
            asyncio.get_running_loop().remove_reader(sock.fileno())
        sock.close()
        with contextlib.suppress(OSError):
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                os.unlink(self.path)


def refuse_if_live(path: str) -> None:
    """A path that is a socket with a reader behind it belongs to a running agent."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise StepSocketError(f"step socket {path}: exists and is not a socket; move it "
                              "aside or give --steps-socket another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return  # left behind by an agent that died: safe to replace
    except OSError:
        return
    finally:
        probe.close()
    raise StepSocketError(f"step socket {path} is in use by a running agent; stop it first "
                          "or give --steps-socket another path")

