"""The agent's HTTP side: `/v1/stream` (WebSocket), `/metrics`, `/healthz`.

`build_app` returns an aiohttp Application that owns the agent's lifecycle through
`cleanup_ctx` (start sampling, then on shutdown stop it and await it), and closes
every open stream on shutdown, as aiohttp's own examples do.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator

from aiohttp import WSCloseCode, web
from prometheus_client import CollectorRegistry

from agent.hub import StreamClient
from agent.metrics import make_registry
from agent.node import NodeAgent
from tuimon_core.protocol.families import Frame
from tuimon_core.serving.guard import guard_of
from tuimon_core.serving.metrics import metrics_response
from tuimon_core.serving.viewer_socket import MAX_CLIENT_MESSAGE, bearer_auth, read_viewer

AGENT = web.AppKey("agent", NodeAgent)
TOKEN = web.AppKey("token", str)
STREAMS: web.AppKey[weakref.WeakSet[web.WebSocketResponse]] = web.AppKey(
    "streams", weakref.WeakSet)
REGISTRY = web.AppKey("registry", CollectorRegistry)


async def _agent_lifecycle(app: web.Application) -> AsyncIterator[None]:
    agent = app[AGENT]
    await agent.start()
    yield
    await agent.stop()


async def _close_streams(app: web.Application) -> None:
    streams = app[STREAMS]  # bound first: list()'s context would skew the key's type
    for ws in list(streams):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"agent shutting down")


async def _writer(ws: web.WebSocketResponse, client: StreamClient) -> None:
    while not ws.closed:
        data = client.next_bytes()
        if data is None:
            await client.wake.wait()
            continue
        await ws.send_bytes(data)


async def stream(request: web.Request) -> web.StreamResponse:
    agent = request.app[AGENT]
    peer = request.remote or "?"
    client = agent.hub.connect(peer, agent.config.interval)
    if client is None:
        raise web.HTTPServiceUnavailable(
            text=f"503: too many stream clients (limit {agent.hub.max_clients})\n")
    # The hello first in the queue: a sample published while the handshake is under
    # way would otherwise go ahead of it, and a viewer cannot read a sample before it.
    if agent.hello is not None:
        client.offer(Frame(agent.hello))
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=MAX_CLIENT_MESSAGE)
    try:
        await ws.prepare(request)
    except Exception:
        agent.hub.disconnect(client)
        raise
    request.app[STREAMS].add(ws)
    writer = asyncio.create_task(_writer(ws, client), name=f"tuimon-stream-{peer}")
    try:
        await read_viewer(ws, peer, lambda m: client.subscribe(m.interval, m.families,
                                                               m.overview_form), writer)
    finally:
        agent.hub.disconnect(client)
    return ws


async def metrics(request: web.Request) -> web.Response:
    return metrics_response(request.app[REGISTRY])


async def healthz(request: web.Request) -> web.Response:
    agent = request.app[AGENT]
    failures = agent.family_failures()
    body = {
        "status": "ok" if agent.latest is not None else "starting",
        "node": agent.config.node_name,
        "samples": agent.stats.samples,
        "gpus": len(agent.gpu.inventory),
        "gpu_status": agent.gpu.status,
        "failed_collectors": failures,
        "stream_clients": len(agent.hub.clients),
        "pending_connections": guard_of(request.app).pending,
    }
    return web.json_response(body)


def build_app(agent: NodeAgent, *, token: str | None = None) -> web.Application:
    app = web.Application(middlewares=[bearer_auth(lambda app: app.get(TOKEN))],
                          client_max_size=MAX_CLIENT_MESSAGE)
    app[AGENT] = agent
    if token:
        app[TOKEN] = token
    app[STREAMS] = weakref.WeakSet()
    app[REGISTRY] = make_registry(agent, guard_of(app))
    app.router.add_get("/v1/stream", stream)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.cleanup_ctx.append(_agent_lifecycle)
    app.on_shutdown.append(_close_streams)
    return app
