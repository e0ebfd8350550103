"""`tuimon prom URL --serve HOST:PORT`: the judgement over Prometheus, with no screen.

A site that runs dcgm-exporter, node_exporter and Prometheus, and no tuimon agents, gets
the findings the app would show over the same server (the viewer's model: node, fleet,
cluster and job rules, with the topology, SLO and baselines given the same ways), judged
once a second around the clock and served on `/metrics`: `tuimon_finding` and its text
and onset (tuimon_core.serving.finding_metrics, as the agents and relays serve them), so
Prometheus scrapes them and `tuimon rules`' TuimonFinding pages with the cause. Beside
them, whether Prometheus answered (`tuimon_judge_prometheus_up`, the time of its last
good read) and the nodes judged, so an alert can tell a quiet cluster from a blind judge.

Built as aiohttp's applications are: its state on the application (no module-level
singleton), the read of Prometheus and the judging loop started and stopped by its
cleanup context.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tuimon.model.cluster import ClusterState
from tuimon.model.judge_config import JudgeConfig
from tuimon.model.judgement import Judgement
from tuimon.sources.prometheus import PromOptions, PromSource, prom_watching
from tuimon_core.findings import Finding
from tuimon_core.node_states import STATES
from tuimon_core.serving.finding_metrics import finding_families
from tuimon_core.serving.guard import guard_of
from tuimon_core.serving.metrics import connection_metrics, metrics_response
from tuimon_core.serving.viewer_socket import bearer_auth

log = logging.getLogger(__name__)

JUDGE_EVERY_S = 1.0  # as the app judges: the findings' holds are counted in these passes


@dataclass
class PromJudge:
    """What the headless judge holds: the model Prometheus fills, and its judgement."""

    url: str
    options: PromOptions
    config: JudgeConfig
    name: str = "cluster"
    token: str | None = None
    cluster: ClusterState = field(init=False)
    judgement: Judgement = field(init=False)
    source: PromSource | None = None
    findings: list[Finding] = field(default_factory=list)
    judged_at: float | None = None  # Unix time of the last judgement

    def __post_init__(self) -> None:
        self.cluster = ClusterState(self.name)
        self.judgement = self.config.judgement(self.cluster)

    def judge(self) -> list[Finding]:
        """One pass (its parts fail alone: tuimon.model.guard)."""
        self.findings = self.judgement.update()
        self.judged_at = time.time()
        return self.findings


STATE = web.AppKey("state", PromJudge)
REGISTRY = web.AppKey("registry", CollectorRegistry)


class JudgeCollector(Collector):
    """Built at each scrape from what the judge holds then."""

    def __init__(self, app: web.Application) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        s = self.app[STATE]
        yield from finding_families(s.findings, "the judgement over Prometheus",
                                    s.cluster.names.holder)
        up = GaugeMetricFamily("tuimon_judge_prometheus_up", "1 when the last read of "
                               "Prometheus answered (0: every node unknown, said by the "
                               "source_lost finding)", labels=["url"])
        read = GaugeMetricFamily("tuimon_judge_prometheus_read_seconds",
                                 "When Prometheus last answered (Unix time)", labels=["url"])
        source = s.source
        if source is not None and (source.read_at is not None or source.error is not None):
            up.add_metric([s.url], 1 if source.error is None else 0)
            if source.read_at is not None:
                read.add_metric([s.url], source.read_at)
        nodes = GaugeMetricFamily("tuimon_judge_nodes", "Nodes judged, by state",
                                  labels=["status"])
        counts = Counter(n.status for n in s.cluster.nodes.values())
        for status in STATES:
            nodes.add_metric([status], counts.get(status, 0))
        judged = GaugeMetricFamily("tuimon_judge_judged_seconds",
                                   "When the judgement last ran (Unix time)")
        if s.judged_at is not None:
            judged.add_metric([], s.judged_at)
        yield from (up, read, nodes, judged)
        yield from connection_metrics("tuimon_judge", None, guard_of(self.app))


async def _metrics(request: web.Request) -> web.Response:
    return metrics_response(request.app[REGISTRY])


async def _healthz(request: web.Request) -> web.Response:
    """Alive: this process judges (whether Prometheus answers is on /metrics)."""
    s = request.app[STATE]
    error = s.source.error if s.source is not None else None
    text = f"ok: judging {len(s.cluster.nodes)} nodes; " + (
        f"prometheus not answering: {error}" if error else "prometheus answering")
    return web.Response(text=text + "\n")


async def _judging(state: PromJudge) -> None:
    while True:
        try:
            state.judge()
        except Exception:  # a bug outside the guarded parts: logged, the next pass runs
            log.exception("judging failed")
        await asyncio.sleep(JUDGE_EVERY_S)


async def _watching(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    async with prom_watching(state.url, state.cluster, state.options) as source:
        state.source = source
        task = asyncio.create_task(_judging(state), name="tuimon-judging")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def build_judge_app(state: PromJudge) -> web.Application:
    app = web.Application(middlewares=[bearer_auth(lambda app: app[STATE].token)])
    app[STATE] = state
    registry = CollectorRegistry(auto_describe=True)
    registry.register(JudgeCollector(app))
    app[REGISTRY] = registry
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.cleanup_ctx.append(_watching)
    return app
