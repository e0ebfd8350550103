"""The relay's HTTP side: `/v1/stream` for viewers (batches), `/v1/history` (its
incidents) and `/v1/report` (a run's report), `/metrics`, `/healthz`.

`build_relay_app` returns an aiohttp Application whose `cleanup_ctx` owns the upstream
streams, the ledger and the periodic work (start in order, stop in reverse, await every
task), and whose shutdown closes every open viewer stream, as aiohttp's examples do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSCloseCode, web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tuimon.relay.cadence import BATCH_EVERY_S
from tuimon.relay.fanout import JOB_SOURCES_KEEP_S, FanOut
from tuimon.relay.ledger import Ledger
from tuimon.relay.report import report_document
from tuimon.relay.viewer_feed import Shared, ViewerFeed
from tuimon.sources.agent_stream import AgentStream, StreamOptions, watching
from tuimon_core import heap, json_text
from tuimon_core.findings_family import judgement_to_wire
from tuimon_core.hostlist import TargetError
from tuimon_core.protocol import ProtocolError, Subscribe
from tuimon_core.protocol.text import clean
from tuimon_core.serving.finding_metrics import finding_families
from tuimon_core.serving.guard import guard_of
from tuimon_core.serving.metrics import connection_metrics, metrics_response
from tuimon_core.serving.viewer_socket import MAX_CLIENT_MESSAGE, bearer_auth, read_viewer
from tuimon_core.version import __version__

log = logging.getLogger(__name__)


@dataclass
class RelayState:
    """Everything one relay holds; one per application, no module-level singletons."""

    name: str
    targets: list[str]
    relays: list[str]
    upstream: StreamOptions
    fanout: FanOut
    ledger: Ledger | None
    interval: float = BATCH_EVERY_S
    max_viewers: int = 256
    budget_every: float = 5.0
    flush_every: float = 10.0
    token: str | None = None
    budget: dict[str, dict[str, Any]] | None = None
    budget_seq: int = 0
    # The judgement sent to viewers: again when its findings (or their severities)
    # change, and every budget_every to carry the holds forward.
    judgement: Shared | None = None
    _judged: frozenset[tuple[object, ...]] = frozenset()
    _judgement_at: float = 0.0
    started: float = field(default_factory=time.time)
    # The upstream streams by target, while they run.
    streams: dict[str, AgentStream] = field(default_factory=dict)

    def apply_demand(self) -> None:
        """Ask each upstream for what the viewers want now: each agent its own families
        (every value for a node a viewer looks at closely), each upstream relay the union.
        A stream sends a subscribe only when its own changed."""
        families, detail = self.fanout.relay_subscription()  # the same for every relay
        for target, stream in self.streams.items():
            if stream.relay:
                stream.set_families(families)
                stream.set_detail(detail)
            else:
                stream.set_families(self.fanout.upstream_families(target))


STATE = web.AppKey("relay", RelayState)
STREAMS: web.AppKey[weakref.WeakSet[web.WebSocketResponse]] = web.AppKey(
    "streams", weakref.WeakSet)
REGISTRY = web.AppKey("registry", CollectorRegistry)


async def _upstream(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    async with watching(state.targets, state.fanout, state.upstream,
                        relays=state.relays) as streams:
        state.streams = streams
        state.apply_demand()
        heap.settle()  # thousands of streams exist now; frames churn from here on
        yield
        state.streams = {}


async def _housekeeping(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    task = asyncio.create_task(_periodic(state), name="tuimon-relay-housekeeping")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if state.ledger is not None:
        state.ledger.close()


async def _periodic(state: RelayState) -> None:
    last_flush = last_budget = last_prune = last_forget = 0.0
    while True:
        now = time.monotonic()
        with _logged("judging"):
            state.fanout.refresh()
        with _logged("sending the judgement"):
            _share_judgement(state, now)
        if state.ledger is not None:
            # Each part alone: a failure is logged and the others, and the next round,
            # go on (this task ending would stop every flush and budget after it).
            with _logged("keeping the incidents"):
                state.ledger.observe(state.fanout.findings, time.time(),
                                     state.fanout.jobs_touched)
            with _logged("putting lost time down to causes"):
                state.ledger.attribute(state.fanout.job_findings)
                state.ledger.note_stops(time.time(), state.fanout.stop_cause,
                                        state.fanout.returned)
            if now - last_forget >= 60:
                state.fanout.forget_jobs(max(JOB_SOURCES_KEEP_S, state.ledger.stopped_most_s))
                last_forget = now
            if now - last_flush >= state.flush_every:
                with _logged("writing the ledger"):
                    state.ledger.flush()
                last_flush = now
            if now - last_prune >= 3600:
                with _logged("pruning the ledger"):
                    state.ledger.prune()
                last_prune = now
            if now - last_budget >= state.budget_every:
                with _logged("summing the ledger for viewers"):
                    state.budget = state.ledger.summary()
                    state.budget_seq += 1
                    state.fanout.judge.apply_budget(state.budget)
                last_budget = now
        await asyncio.sleep(min(1.0, state.budget_every, state.flush_every))


def _share_judgement(state: RelayState, now: float) -> None:
    """The judgement for the viewers, made again when what it holds changed (a finding
    raised or cleared, a severity moved) or every budget_every."""
    judge = state.fanout.judge
    if judge.judged_at is None:
        return
    findings = state.fanout.findings
    held = frozenset((*f.key, f.severity) for f in findings)
    if state.judgement is not None and held == state._judged and \
            now - state._judgement_at < state.budget_every:
        return
    seq = state.judgement.seq + 1 if state.judgement is not None else 0
    state.judgement = Shared(judgement_to_wire(findings, judge.judged_at), seq)
    state._judged, state._judgement_at = held, now


@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    try:
        yield
    except Exception:
        log.exception("relay: %s failed", what)


async def _close_streams(app: web.Application) -> None:
    streams = app[STREAMS]  # bound first: list()'s context would skew the key's type
    for ws in list(streams):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"relay shutting down")


async def _writer(ws: web.WebSocketResponse, feed: ViewerFeed, state: RelayState) -> None:
    # The first batch goes out after a short pause, so a subscription sent right after
    # connecting shapes it (a full snapshot of thousands of nodes is not cheap).
    await asyncio.sleep(min(0.2, feed.interval))
    while not ws.closed:
        started = time.monotonic()
        for data in feed.take(time.time(), state.name, state.budget, state.budget_seq,
                              state.judgement):
            await ws.send_bytes(data)  # waits while the viewer's socket is full
        await asyncio.sleep(max(0.0, feed.interval - (time.monotonic() - started)))


async def stream(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    peer = request.remote or "?"
    if len(state.fanout.viewers) >= state.max_viewers:
        raise web.HTTPServiceUnavailable(
            text=f"503: too many viewers (limit {state.max_viewers})\n")
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=MAX_CLIENT_MESSAGE)
    await ws.prepare(request)
    request.app[STREAMS].add(ws)
    feed = ViewerFeed(peer, state.interval)
    state.fanout.attach(feed)
    state.apply_demand()
    writer = asyncio.create_task(_writer(ws, feed, state), name=f"tuimon-relay-{peer}")

    def subscribe(message: Subscribe) -> None:
        before = feed.detail
        try:
            changed = feed.subscribe(message.interval, message.families, message.nodes,
                                     message.detail, message.overview_form)
        except TargetError as exc:
            raise ProtocolError(f"subscribe.nodes: {exc}") from None
        if changed:
            state.fanout.refill(feed)
        else:  # only what it looks at closely changed: a drill-down costs one node
            state.fanout.refill_detail(feed, feed.detail - before)
        state.apply_demand()

    try:
        await read_viewer(ws, peer, subscribe, writer)
    finally:
        state.fanout.detach(feed)
        state.apply_demand()
    return ws


MAX_HISTORY_S = 400 * 86400.0  # the longest look back one request may ask


async def history(request: web.Request) -> web.Response:
    """The incidents the relay's judgement held (its ledger's episodes): `since` seconds
    back (default 6 h), or from `from` to `until` (Unix time); `job`: those that touched
    its nodes. JSON, newest first."""
    state = request.app[STATE]
    if state.ledger is None:
        raise web.HTTPNotFound(text="this relay keeps no ledger: no history\n")
    now = time.time()
    try:
        q = request.query
        since = float(q.get("since", 6 * 3600.0))
        start = float(q["from"]) if "from" in q else now - since
        until = float(q["until"]) if "until" in q else now
        most = int(q.get("most", 1000))
    except ValueError:
        raise web.HTTPBadRequest(text="since, from, until: seconds; most: a count\n") \
            from None
    if not (math.isfinite(start) and math.isfinite(until) and 0 < most <= 10_000
            and 0 <= until - start <= MAX_HISTORY_S):
        raise web.HTTPBadRequest(text=f"a range of 0 to {MAX_HISTORY_S / 86400:.0f} days "
                                      "and at most 10000 incidents\n")
    job = q.get("job")
    found = state.ledger.incidents(start, until, job=clean(job) if job else None, most=most)
    return web.json_response({"relay": state.name, "from": start, "until": until,
                              "incidents": [e.to_json() for e in found]},
                             dumps=json_text.dumps)


async def report(request: web.Request) -> web.Response:
    """A job's report (tuimon.relay.report): its budget, its SLI by period and its
    incidents over the last `since` seconds (default: the ledger's window), where its
    lost time lies by node and by leaf, and the fleet's differences now. JSON; 404 with
    the reason for a relay without a ledger or a job its ledger does not count."""
    state = request.app[STATE]
    if state.ledger is None:
        raise web.HTTPNotFound(text="this relay keeps no ledger: no report\n")
    q = request.query
    job = clean(q.get("job", ""))
    try:
        since = float(q.get("since", state.ledger.window_hours * 3600))
    except ValueError:
        raise web.HTTPBadRequest(text="since: seconds\n") from None
    if not job or not (math.isfinite(since) and 0 < since <= MAX_HISTORY_S):
        raise web.HTTPBadRequest(text=f"job: a job's name; since: 0 to "
                                      f"{MAX_HISTORY_S / 86400:.0f} days in seconds\n")
    doc = report_document(state.ledger, state.fanout, state.name, job, since, time.time())
    if doc is None:
        known = ", ".join(sorted(state.budget or {})[:10]) or "none yet"
        raise web.HTTPNotFound(text=f"no job {job!r} in this relay's ledger over its "
                                    f"{state.ledger.window_hours:g} h window (jobs: {known})\n")
    return web.json_response(doc, dumps=json_text.dumps)


async def healthz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    ledger = state.ledger
    return web.json_response({
        "status": "ok" if ledger is None or ledger.error is None else "ledger_error",
        "relay": state.name,
        "version": __version__,
        "sources": state.fanout.counts(),
        "viewers": len(state.fanout.viewers),
        "frames_in": state.fanout.stats.frames_in,
        "bad_frames": state.fanout.stats.bad_frames,
        "pending_connections": guard_of(request.app).pending,
        # Unauthenticated: counts and the ledger's health, never job or node names.
        "ledger": None if ledger is None else {"ok": ledger.error is None,
                                                "jobs": len(state.budget or {})},
        # What the last judgement took and held (counts, never names).
        "judgement": {"seconds": round(state.fanout.judge.seconds, 4),
                      "findings": len(state.fanout.findings)},
    })


class RelayCollector(Collector):
    """The relay's own health, built from its state at scrape time."""

    def __init__(self, state: RelayState, guard: Any = None) -> None:
        self.state = state
        self.guard = guard

    def collect(self) -> list[Metric]:
        s = self.state
        sources = GaugeMetricFamily("tuimon_relay_sources", "Upstream nodes by state",
                                    labels=["state"])
        for name, n in s.fanout.counts().items():
            sources.add_metric([name], n)
        viewers = GaugeMetricFamily("tuimon_relay_viewers", "Connected viewers")
        viewers.add_metric([], len(s.fanout.viewers))
        frames = CounterMetricFamily("tuimon_relay_frames_received",
                                     "Frames received from upstream nodes")
        frames.add_metric([], s.fanout.stats.frames_in)
        bad = CounterMetricFamily("tuimon_relay_bad_frames", "Upstream frames refused")
        bad.add_metric([], s.fanout.stats.bad_frames)
        ledger_ok = GaugeMetricFamily("tuimon_relay_ledger_ok",
                                      "1 when the SLO ledger's last write succeeded")
        ledger_ok.add_metric([], 1 if s.ledger is None or s.ledger.error is None else 0)
        consumed = GaugeMetricFamily("tuimon_relay_budget_consumed_hours",
                                     "Error budget consumed over the SLO window, per job",
                                     labels=["job"])
        for job, entry in (s.budget or {}).items():
            consumed.add_metric([job], entry["consumed_h"])
        judged = GaugeMetricFamily("tuimon_relay_judgement_seconds",
                                   "What the relay's last judgement of its nodes took "
                                   "(it judges once a second)")
        judged.add_metric([], s.fanout.judge.seconds)
        out = [sources, viewers, frames, bad, ledger_ok, consumed, judged,
               *finding_families(s.fanout.findings, "this relay's judgement",
                                        s.fanout.names.holder)]
        if self.guard is not None:
            out.extend(connection_metrics("tuimon_relay", None, self.guard))
        return out


async def metrics(request: web.Request) -> web.Response:
    return metrics_response(request.app[REGISTRY])


def build_relay_app(state: RelayState) -> web.Application:
    app = web.Application(middlewares=[bearer_auth(lambda app: app[STATE].token)],
                          client_max_size=MAX_CLIENT_MESSAGE)
    app[STATE] = state
    app[STREAMS] = weakref.WeakSet()
    registry = CollectorRegistry(auto_describe=True)
    registry.register(RelayCollector(state, guard_of(app)))
    app[REGISTRY] = registry
    app.router.add_get("/v1/stream", stream)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/v1/history", history)
    app.router.add_get("/v1/report", report)
    app.cleanup_ctx.append(_housekeeping)
    app.cleanup_ctx.append(_upstream)
    app.on_shutdown.append(_close_streams)
    return app
