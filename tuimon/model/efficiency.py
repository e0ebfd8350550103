"""Per-job efficiency from step telemetry: SLI over rolling windows, throughput, scaling
efficiency, error budget and burn, stragglers, as docs/definitions.md defines them.

Without any step telemetry the view falls back to a proxy (mean GPU busy of the nodes
that are up: SM active where DCGM profiling gives it, else utilization), always labelled
proxy, so the numbers are never blank.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tuimon.model.cluster import ClusterState
from tuimon.model.slo import (
    DEFAULT_HOURS,
    DEFAULT_TARGET,
    BurnReadout,
    BurnTracker,
    LedgerBurn,
    Slo,
)
from tuimon.model.step_credit import JobCredit, StepCredit
from tuimon_core.efficiency_drop import BURN_SHORT_S, LONG_S, MIN_BEFORE_S, SHORT_S, Drop
from tuimon_core.node_states import UP
from tuimon_core.protocol.fields import MAX_BUDGET_JOBS
from tuimon_core.protocol.overview_layout import busy, busy_percents
from tuimon_core.timing import JOB_STOPPED_AFTER_S
from tuimon_core.wait_kinds import add_waits, rank_kind, split_wait

WINDOWS = {"1m": 60, "5m": 300, "1h": 3600}
# Dense BF16 peak per GPU (FLOP/s), by product name prefix, for MFU.
PEAK_FLOPS = (("NVIDIA H200", 989e12), ("NVIDIA H100", 989e12), ("NVIDIA A100", 312e12),
              ("NVIDIA B200", 2250e12), ("NVIDIA GB200", 2500e12))
# A job whose step reports stopped this long ago is stale: its windows say what was, not
# what is (every view shows it so, from the job's verdict).
STEPS_STALE_S = 15.0
# A rank is reporting when it sent a step within this long.
REPORTING_S = 60.0
# A job with no step reports for this long, and no ledger naming it, is forgotten: the
# viewer's memory holds the jobs that run, not every name a peer ever sent.
FORGET_JOB_S = 24 * 3600.0
# ...and at most this many are kept (what a relay's budget carries), the longest idle
# forgotten first: each is judged every tick.
MAX_JOBS_KEPT = MAX_BUDGET_JOBS
# Without a baseline (one GPU's throughput), a job is compared with its own best: the
# highest per-GPU throughput it sustained over this long, as this viewer counted it.
BEST_WINDOW_S = 600.0
# ...and only a window its reports cover this much of: a pause in it is not "sustained".
BEST_COVERED = 0.9
# The most a job's best may rise in one BEST_WINDOW_S: a rank that claims a thousandfold
# throughput for ten minutes cannot make the job read a thousandth of its best for the
# rest of the run (docs/security.md). A real job's best grows with its warm-up, far
# slower.
BEST_RISE = 2.0
STRAGGLER_RATIO = 1.10
STRAGGLER_SECONDS = 30.0


@dataclass(slots=True)
class Best:
    """A job's best per-GPU throughput sustained over BEST_WINDOW_S (samples/s), and when
    the window that set it ended: the first window's value, then at most BEST_RISE times
    what the best was a window before. The one rule the viewer's count and the relay's
    ledger keep a best by."""

    value: float | None = None
    at: float | None = None
    base: float = 0.0  # the best at `base_at`: what it may rise from until a window later
    base_at: float = -math.inf

    def offer(self, value: float, at: float) -> None:
        """A window of `value` per GPU that ended at `at` (windows offered in order)."""
        if not math.isfinite(value) or value <= 0:
            return
        if self.value is None:
            self.value, self.at, self.base, self.base_at = value, at, value, at
            return
        if at - self.base_at >= BEST_WINDOW_S:
            self.base, self.base_at = self.value, at
        value = min(value, self.base * BEST_RISE)
        if value > self.value:
            self.value, self.at = value, at


@dataclass
class Straggler:
    job: str
    rank: int
    node: str
    gpu: int | None
    ratio: float  # compute time over the median of its peers


# The windows a job's nodes sum its steps over and send (agent.steps: the last minute,
# the last hour).
REPORTED_SPANS = (SHORT_S, BURN_SHORT_S, LONG_S)


@dataclass(frozen=True, slots=True)
class Window:
    """Sums over a window: how much of it they cover, rank-seconds of wall and compute."""

    covered: float
    wall: float
    compute: float
    samples: int = 0
    waits: dict[str, float] = field(default_factory=dict)  # kind -> rank-seconds

    @property
    def sli(self) -> float | None:
        return self.compute / self.wall if self.wall > 0 else None


@dataclass(frozen=True)
class JobVerdict:
    state: str  # stopped | page | ticket | stale | degraded | ok
    firing: list[tuple[str, str, str, float]]  # (severity, long, short, threshold)
    steps_age: float | None  # seconds since the last step report
    reporting: int  # ranks that reported within REPORTING_S
    # Stopped: what held on its nodes when it stopped (`node lost gpu042`, a finding).
    cause: str | None = None


@dataclass
class JobState:
    job: str
    slo: Slo
    world: int = 0
    # The ranks its rank-seconds are divided by for run time: the world, or fewer while
    # fewer report (tuimon.model.step_credit).
    run_ranks: int = 0
    # (ts, wall rank-seconds, compute rank-seconds, samples) per viewer tick
    history: deque[tuple[float, float, float, int]] = field(default_factory=deque)
    # (ts, kind -> rank-seconds waited) per viewer tick that had any waiting
    wait_history: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)
    # The viewer's own tracker, or the relay's ledger once a relay sends it.
    burn: BurnReadout | None = None
    # rank -> deque of (ts, compute per step); rank -> (node, local gpu)
    rank_compute: dict[int, deque[tuple[float, float]]] = field(default_factory=dict)
    rank_where: dict[int, tuple[str, int | None]] = field(default_factory=dict)
    stragglers: list[Straggler] = field(default_factory=list)
    rank_last: dict[int, float] = field(default_factory=dict)  # rank -> last credited
    last_update: float | None = None  # when steps last arrived
    created: float = field(default_factory=time.time)  # when the viewer first heard of it
    # target -> (when it arrived, window length -> the node's sums, the node's drop):
    # what each node counted over its last minute and hour and judged of them (the steps
    # family's `windows` and `drop`).
    reported: dict[str, tuple[float, dict[float, Window], Drop | None]] = field(
        default_factory=dict)
    # The nodes' sums by (window, now), as reported_window added them: every figure of a
    # tick reads them (a few windows each, over thousands of nodes); emptied when the
    # nodes' reports change (EfficiencyView.update).
    summed: dict[tuple[float, float], Window | None] = field(default_factory=dict)
    # Waiting counted but not yet put down to a cause, by kind (run seconds: updates
    # between two judgements add up), and what the viewer has put the waiting down to so
    # far: (kind, cause) -> run seconds (tuimon.model.attribution).
    unattributed: dict[str, float] = field(default_factory=dict)
    causes: dict[tuple[str, str], float] = field(default_factory=dict)
    # The best per-GPU throughput sustained over BEST_WINDOW_S (samples/s), and when.
    best: Best = field(default_factory=Best)

    def nodes(self) -> set[str]:
        """The nodes the job's ranks report from (as the step reports place them): the
        one rule of a job's nodes for the viewer (its screen, the map filtered to them,
        what its waiting and a drop are put down to)."""
        return {node for node, _ in self.rank_where.values()}

    @property
    def best_per_gpu(self) -> float | None:
        return self.best.value

    @property
    def best_at(self) -> float | None:
        return self.best.at

    def note_best(self, now: float) -> None:
        """Keep the job's best sustained per-GPU throughput: the last BEST_WINDOW_S, once
        this viewer's count covers all of it."""
        ranks = self.run_ranks or self.world
        if not self.history or not ranks or \
                self.history[0][0] > now - BEST_WINDOW_S + 1.0:
            return
        wall = 0.0
        samples = 0
        for ts, w, _, s in reversed(self.history):
            if ts < now - BEST_WINDOW_S:
                break
            wall += w
            samples += s
        if wall <= 0 or wall / ranks < BEST_COVERED * BEST_WINDOW_S:
            return
        self.best.offer(samples / wall, now)  # per GPU: samples over their rank-seconds

    def window(self, seconds: float, now: float) -> tuple[float | None, float | None]:
        """(SLI, samples/s) over the last `seconds`.

        Throughput is samples over the run time the step reports cover (rank-seconds over
        the world size), not over the time the viewer happened to watch: it reads the
        same whether the viewer ticked once or sixty times, one-shot or watching."""
        wall = compute = 0.0
        samples = 0
        for ts, w, c, s in reversed(self.history):
            if ts < now - seconds:
                break
            wall += w
            compute += c
            samples += s
        ranks = self.run_ranks or self.world or max(1, len(self.rank_last))
        run = wall / ranks  # seconds of the run the reports cover
        if wall <= 0 or run <= 0:  # (a valid 5e-324 s over a million ranks is 0)
            return None, None
        rate = samples / run  # no rate from a run of 1e-300 s: it is no throughput
        return compute / wall, rate if math.isfinite(rate) else None

    def throughput(self, seconds: float, now: float) -> float | None:
        """Samples/s over the last `seconds`, read as the SLI windows are: from the nodes'
        window that best fits where it covers more than this reader's own count."""
        reported = self.nodes_window(seconds, now)
        if reported is not None and reported.wall > 0:
            ranks = self.run_ranks or self.world or max(1, len(self.rank_last))
            run = reported.wall / ranks
            rate = reported.samples / run if run > 0 else math.inf
            return rate if math.isfinite(rate) else None
        return self.window(seconds, now)[1]

    def sli_window(self, seconds: float, now: float) -> tuple[float | None, float]:
        """(SLI, seconds of the window it covers) over the last `seconds`: as the job's
        nodes counted it where they sent that window (they watched all along), else as
        this viewer saw it since it first did. Every reader (the strip, status, a job's
        screen) says a window's SLI from here, with its coverage where it is short."""
        reported = self.nodes_window(seconds, now)
        if reported is not None and reported.sli is not None:
            return reported.sli, reported.covered
        return self.window(seconds, now)[0], self.seen(seconds, now)

    def seen(self, seconds: float, now: float) -> float:
        """Seconds of the last `seconds` this reader's own count covers: the run time it
        counted in them, so a gap (its relay away a while) is not taken as seen."""
        wall = 0.0
        for ts, w, _, _ in reversed(self.history):
            if ts < now - seconds:
                break
            wall += w
        ranks = self.run_ranks or self.world or max(1, len(self.rank_last))
        return max(0.0, min(float(seconds), wall / ranks))

    def nodes_window(self, seconds: float, now: float) -> Window | None:
        """The nodes' window that best fits the last `seconds` (reported_fit), where it
        covers at least what this reader's own count does: every figure over a window
        (SLI, throughput, waiting, burn) reads it or the own count by this one rule."""
        reported = self.reported_fit(seconds, now)
        if reported is None or reported.covered < self.seen(seconds, now):
            return None
        return reported

    def sli_from_nodes(self, seconds: float, now: float) -> tuple[float, float] | None:
        """(SLI, seconds covered) of the last `seconds` as the nodes summed it (the burn
        tracker weighs it against its own count)."""
        w = self.reported_fit(seconds, now)
        return None if w is None or w.sli is None else (w.sli, w.covered)

    def reported_fit(self, seconds: float, now: float) -> Window | None:
        """The nodes' window that best stands for the last `seconds`: one that lies wholly
        inside them (its span no longer, or the time it covers no longer, as for nodes
        counting a job for three minutes of a 5-minute window), the one covering the most;
        its `covered` is the seconds of the asked window it stands for. The burn
        windows and the SLI windows read the nodes' sums through this one choice."""
        best: Window | None = None
        for span in REPORTED_SPANS:
            w = self.reported_window(span, now)
            if w is None or w.sli is None:
                continue
            covered = min(float(span), w.covered)
            if (span <= seconds or covered <= seconds) and (
                    best is None or covered > best.covered):
                best = Window(covered, w.wall, w.compute, w.samples, w.waits)
        return best

    def sli_windows(self, now: float) -> dict[str, tuple[float | None, float]]:
        """The windows of WINDOWS worth saying, each (SLI, seconds covered): a window
        only where it covers more than the shorter ones said (a longer name over the same
        seconds would be one short window said under three names)."""
        out: dict[str, tuple[float | None, float]] = {}
        widest = -1.0
        for name, seconds in WINDOWS.items():
            sli, seen = self.sli_window(seconds, now)
            if not out or (sli is not None and seen > widest + 1.0):
                out[name] = (sli, seen)
                widest = max(widest, seen)
        return out

    def reported_window(self, seconds: float, now: float) -> Window | None:
        """The job's sums over the last `seconds` as its nodes counted them, added over the
        nodes that reported lately; None unless each of them sent that window."""
        key = (seconds, now)
        if key in self.summed:
            return self.summed[key]
        if len(self.summed) > 64:
            self.summed.clear()
        out = self.summed[key] = self._sum_reported(seconds, now)
        return out

    def _sum_reported(self, seconds: float, now: float) -> Window | None:
        covered = math.inf
        wall = compute = 0.0
        samples = 0
        waits: dict[str, float] = {}
        found = False
        for at, windows, _ in self.reported.values():
            if now - at > STEPS_STALE_S:
                continue
            w = windows.get(seconds)
            if w is None:
                return None
            found = True
            covered = min(covered, w.covered)
            wall += w.wall
            compute += w.compute
            samples += w.samples
            add_waits(waits, w.waits, rank_kind)
        return Window(covered, wall, compute, samples, waits) if found else None

    def wait_shares(self, seconds: float, now: float) -> tuple[float, dict[str, float]]:
        """(the share of the step time spent waiting, each kind's share of the step
        time) over the last `seconds`: as the job's nodes counted it where they sent
        that window, else as this viewer did."""
        reported = self.nodes_window(seconds, now)
        if reported is not None and reported.wall > 0:
            # As shares of the waiting the nodes counted: a node's kinds cannot say more
            # than that, and older agents' unnamed waiting is `other`.
            wall, waited = reported.wall, reported.wall - reported.compute
            by_kind = split_wait(reported.waits, waited, kind=rank_kind)
        else:
            wall = compute = 0.0
            for ts, w, c, _ in reversed(self.history):
                if ts < now - seconds:
                    break
                wall += w
                compute += c
            waited = wall - compute
            by_kind = {}
            for ts, kinds in reversed(self.wait_history):
                if ts < now - seconds:
                    break
                add_waits(by_kind, kinds)
        if wall <= 0:
            return 0.0, {}
        return max(0.0, waited / wall), {k: v / wall for k, v in by_kind.items() if v > 0}

    def reported_drop(self, now: float) -> tuple[bool, Drop | None]:
        """(whether the job's nodes judge its efficiency, their verdict): a drop when
        most of the nodes that reported lately say so, from the median SLI they say it
        dropped from, since the first of them saw it."""
        fresh = [drop for at, _, drop in self.reported.values() if now - at <= STEPS_STALE_S]
        if not fresh:
            return False, None
        drops = [d for d in fresh if d is not None]
        if 2 * len(drops) <= len(fresh):
            return True, None
        return True, Drop(statistics.median(d.from_sli for d in drops),
                          min(d.since for d in drops))

    def short_sli(self, now: float) -> float | None:
        """The SLI of the last minute: as the nodes counted it, else as this viewer did."""
        return self.sli_window(SHORT_S, now)[0]

    def drop_windows(self, now: float) -> tuple[float | None, float | None]:
        """(the SLI of the last minute, of the hour before it) from what this viewer saw,
        for a viewer judging a job its nodes do not judge; the hour before is None while
        it holds less than MIN_BEFORE_S."""
        recent_wall = recent_compute = wall = compute = 0.0
        oldest = None
        for ts, w, c, _ in self.history:
            if ts < now - LONG_S:
                continue
            if ts >= now - SHORT_S:
                recent_wall += w
                recent_compute += c
            else:
                oldest = ts if oldest is None else oldest
                wall += w
                compute += c
        enough = oldest is not None and now - SHORT_S - oldest >= MIN_BEFORE_S
        return (recent_compute / recent_wall if recent_wall > 0 else None,
                compute / wall if enough and wall > 0 else None)

    def ranks_reporting(self, now: float, within: float = REPORTING_S) -> int:
        return sum(1 for ts in self.rank_last.values() if ts >= now - within)

    def verdict(self, now: float) -> JobVerdict:
        """How the job stands, as every view says it: stopped (the relay's ledger saw
        every rank fall silent; that time is lost), paging or ticketing on its burn,
        stale (no step reports lately: no numbers from before an outage pass as now),
        degraded (a rank silent), or ok."""
        firing = self.burn.firing(now) if self.burn else []
        age = self.age(now)
        reporting = self.ranks_reporting(now)
        stopped = self.burn.stopped_since if isinstance(self.burn, LedgerBurn) else None
        back = (self.last_update is not None and stopped is not None
                and self.last_update > stopped + JOB_STOPPED_AFTER_S)
        if stopped is not None and not back:  # every rank silent, as the ledger saw
            assert isinstance(self.burn, LedgerBurn)
            return JobVerdict("stopped", firing, max(0.0, now - stopped), reporting,
                              self.burn.stopped_cause)
        if age is not None and age > STEPS_STALE_S:
            state = "stale"
        elif any(f[0] == "page" for f in firing):
            state = "page"
        elif firing:
            state = "ticket"
        elif reporting < self.world:
            state = "degraded"
        else:
            state = "ok"
        return JobVerdict(state, firing, age, reporting)

    def age(self, now: float) -> float | None:
        return None if self.last_update is None else max(0.0, now - self.last_update)


class EfficiencyView:
    def __init__(self, slo: Slo | None = None, baselines: dict[str, float] | None = None,
                 wall: Callable[[], float] = time.time,
                 flops_per_sample: dict[str, float] | None = None,
                 peak_flops: float | None = None) -> None:
        self.slo = slo or Slo(DEFAULT_TARGET, DEFAULT_HOURS)
        self.baselines = dict(baselines or {})  # job -> samples/s of one GPU alone
        self.flops_per_sample = dict(flops_per_sample or {})
        self.peak_flops = peak_flops  # per GPU; else from the GPUs' product names
        self.gpu_peak: float | None = None
        self.jobs: dict[str, JobState] = {}
        self.proxy: float | None = None
        self._wall = wall
        self.now = wall()  # the time of the latest update
        # Each (job, rank) from one node only, never more than the time that passed.
        self.credit = StepCredit()

    def update(self, cluster: ClusterState) -> None:
        # The receiver's clock (docs/security.md, "time"): one agent whose clock is a
        # decade ahead cannot push every window past the others' data. The demo passes
        # its simulated clock and a replay its recording's, so windows keep their meaning.
        now = self._wall()
        self.now = now
        for state in self.jobs.values():
            state.summed.clear()  # the nodes' reports change below
        sums: dict[str, JobCredit] = {}
        busy_sum = busy_n = 0
        for node in cluster.nodes.values():
            if node.sample is None or node.status != UP:
                node.pending_steps = None  # steps of a node that is not up do not count
                continue
            if node.overview is not None:
                known = busy_percents(busy(node.overview) or b"")
                busy_sum += sum(known)
                busy_n += len(known)
            pending, node.pending_steps = node.pending_steps, None
            sent = {j["id"]: j for j in pending.get("jobs") or ()} if pending else {}
            for job in self.credit.credit(node.target, pending, now):
                state = self._job(job.job)
                # As the trust rule keeps them now (a job's world is reset when it has
                # been gone a while, and may be claimed anew).
                state.world, state.run_ranks = job.world, job.run_ranks
                acc = sums.get(job.job)
                if acc is None:
                    acc = sums[job.job] = JobCredit(job.job, job.world)
                acc.world, acc.run_ranks = job.world, job.run_ranks
                acc.wall += job.wall
                acc.compute += job.compute
                acc.samples += job.samples
                add_waits(acc.waits, job.waits)
                judged = sent.get(job.job) or {}
                windows = judged.get("windows")
                if windows:
                    drop = judged.get("drop")
                    state.reported[node.target] = (now, {
                        w["s"]: Window(w["covered"], w["wall"], w["compute"],
                                       w.get("samples") or 0, w.get("waits") or {})
                        for w in windows},
                        None if drop is None else Drop(drop["from"], now - drop["held"]))
                for r in job.ranks:
                    state.rank_last[r.rank] = now
                    if r.steps:
                        q = state.rank_compute.setdefault(r.rank, deque())
                        q.append((now, r.compute / r.steps))
                        state.rank_where[r.rank] = (node.name, r.rank % max(1, node.gpu_count)
                                                    if node.gpu_count else None)
        self.proxy = busy_sum / busy_n / 100 if busy_n else None
        if self.gpu_peak is None:
            for node in cluster.nodes.values():
                if node.hello and node.hello.gpus and node.hello.gpus[0].name:
                    name = node.hello.gpus[0].name
                    self.gpu_peak = next((p for prefix, p in PEAK_FLOPS
                                          if name.startswith(prefix)), None)
                    break
        for name, acc in sums.items():
            state = self.jobs[name]
            ranks = acc.divisor
            if ranks:
                add_waits(state.unattributed, {
                    k: v / ranks
                    for k, v in split_wait(acc.waits, acc.wall - acc.compute).items()})
            state.last_update = now
            state.history.append((now, acc.wall, acc.compute, acc.samples))
            if acc.waits:
                state.wait_history.append((now, acc.waits))
            state.note_best(now)
            if isinstance(state.burn, BurnTracker) and ranks:
                state.burn.add(now, acc.total_s, acc.effective_s, acc.waits_s)
        for name, summary in cluster.budgets.items():
            # The relay has counted the whole run; the viewer has seen only its session.
            self._job(name).burn = LedgerBurn(self.slo, summary)
        oldest = now - max(WINDOWS.values())
        for name in [n for n, s in self.jobs.items() if n not in cluster.budgets and
                     (s.last_update or s.created) < now - FORGET_JOB_S]:
            del self.jobs[name]  # no steps for a day, no ledger naming it: the job is over
        if len(self.jobs) > MAX_JOBS_KEPT:
            # A peer that names a new job every sample: the longest idle go first (never
            # one that reported now or that a ledger names).
            idle = sorted((s.last_update or s.created, n) for n, s in self.jobs.items()
                          if n not in sums and n not in cluster.budgets)
            for _, name in idle[:len(self.jobs) - MAX_JOBS_KEPT]:
                del self.jobs[name]
        for state in self.jobs.values():
            while state.history and state.history[0][0] < oldest:
                state.history.popleft()
            while state.wait_history and state.wait_history[0][0] < oldest:
                state.wait_history.popleft()
            for target in [t for t, (at, _, _) in state.reported.items()
                           if now - at > REPORTING_S]:
                del state.reported[target]
            state.stragglers = self._stragglers(state, now)

    def _job(self, name: str) -> JobState:
        state = self.jobs.get(name)
        if state is None:
            state = self.jobs[name] = JobState(name, self.slo, created=self.now)
            # Its burn windows from the nodes' sums where they cover more than this
            # viewer's own count (a one-shot's seconds against the nodes' hour).
            state.burn = BurnTracker(self.slo, nodes_saw=state.sli_from_nodes)
        return state

    def _stragglers(self, state: JobState, now: float) -> list[Straggler]:
        means: dict[int, float] = {}
        for rank, q in state.rank_compute.items():
            while q and q[0][0] < now - STRAGGLER_SECONDS:
                q.popleft()
            # Only ranks seen over (almost) the whole window: "for 30 s", not a blip.
            if q and now - q[0][0] >= STRAGGLER_SECONDS * 0.8:
                means[rank] = sum(v for _, v in q) / len(q)
        if len(means) < 2:
            return []
        median = statistics.median(means.values())
        out = []
        for rank, mean in means.items():
            if median > 0 and mean / median >= STRAGGLER_RATIO:
                node, gpu = state.rank_where.get(rank, ("?", None))
                out.append(Straggler(state.job, rank, node, gpu, mean / median))
        return sorted(out, key=lambda s: -s.ratio)

    def mfu(self, state: JobState, throughput: float | None) -> float | None:
        """Model FLOPs utilization: achieved FLOP/s over the GPUs' peak."""
        flops = self.flops_per_sample.get(state.job)
        peak = self.peak_flops or self.gpu_peak
        if not flops or not peak or throughput is None or not state.world:
            return None
        return throughput * flops / (state.world * peak)

    def sli_series(self, state: JobState, points: int) -> list[float]:
        """The SLI of each recent update, oldest first, for a sparkline."""
        out = [c / w for _, w, c, _ in list(state.history)[-points:] if w > 0]
        return out

    def scaling_efficiency(self, state: JobState, throughput: float | None) -> float | None:
        base = self.baselines.get(state.job)
        if base is None or throughput is None or not state.world:
            return None
        return throughput / (state.world * base)

    def efficiency(self, state: JobState,
                   throughput: float | None) -> tuple[float, str] | None:
        """(the job's efficiency, against what): against one GPU alone where a baseline
        is given (scaling efficiency), else against the job's own best sustained
        BEST_WINDOW_S, labelled so; None before either is known."""
        scaling = self.scaling_efficiency(state, throughput)
        if scaling is not None:
            return scaling, "baseline"
        # The run's best as the relay's ledger counted it, or this viewer's, the higher.
        best = max(state.best_per_gpu or 0.0, getattr(state.burn, "best_per_gpu", None) or 0.0)
        if best > 0 and throughput is not None and state.world:
            return throughput / (state.world * best), f"its best {BEST_WINDOW_S / 60:.0f} min"
        return None
