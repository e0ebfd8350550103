"""Serving Prometheus metrics: a registry's exposition as a response, and the connection
guard's counts as metric families, for the agent's, the relay's and the headless judge's
custom collectors."""

from __future__ import annotations

from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tuimon_core.serving.exposition import render
from tuimon_core.serving.guard import ConnectionGuard


def connection_metrics(prefix: str, node: str | None, guard: ConnectionGuard) -> Iterator[Metric]:
    """The connection guard's counts (tuimon_core.serving.guard), for the agent and the relay."""
    labels = ["node"] if node is not None else []
    values = [node] if node is not None else []
    pending = GaugeMetricFamily(f"{prefix}_pending_connections",
                                "Connections that have not yet sent an admitted request",
                                labels=labels)
    pending.add_metric(values, guard.pending)
    yield pending
    closed = CounterMetricFamily(
        f"{prefix}_connections_closed_unadmitted",
        "Connections closed before an admitted request: evicted (too many pending) or "
        "timed_out (no request in time)", labels=[*labels, "reason"])
    closed.add_metric([*values, "evicted"], guard.evicted)
    closed.add_metric([*values, "timed_out"], guard.timed_out)
    yield closed


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """`GET /metrics`: the registry's collectors, built now, in the text format."""
    return web.Response(body=render(registry), headers={
        "Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
