"""What the agent and the relay share on their server side: the bearer-token check, and
the viewer-to-server half of a stream.

Viewers only ever send `subscribe`. Valid msgpack of an unknown type is ignored; a
message that is not valid closes that connection with code 1003 and the reason, and
the server goes on serving everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.typedefs import Middleware

from tuimon_core.protocol import ProtocolError, Subscribe, decode
from tuimon_core.protocol.text import clean
from tuimon_core.serving.guard import guard_of
from tuimon_core.serving.security import token_matches

log = logging.getLogger(__name__)

MAX_CLIENT_MESSAGE = 64 * 1024
# Paths that need the token; /healthz stays open for load balancers and quick checks.
PROTECTED = ("/v1/", "/metrics")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bearer_auth(token_of: Callable[[web.Application], str | None]) -> Middleware:
    """Middleware: 401 on protected paths unless `Authorization: Bearer <token>` matches
    (constant time); the peer and path are logged, never the token."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        token = token_of(request.app)
        if (token and request.path.startswith(PROTECTED)
                and not token_matches(request.headers.get("Authorization"), token)):
            log.warning("rejected %s %s from %s: missing or wrong token", request.method,
                        request.path, clean(request.remote or "?"))
            raise web.HTTPUnauthorized(
                text="401: missing or wrong bearer token\n",
                headers={"WWW-Authenticate": 'Bearer realm="tuimon"'})
        # Past the token: no longer a pending connection (tuimon_core.serving.guard's guard).
        guard_of(request.app).admit(request.transport)
        return await handler(request)
    return auth


async def read_viewer(ws: web.WebSocketResponse, peer: str,
                      on_subscribe: Callable[[Subscribe], None],
                      writer: asyncio.Task[None]) -> None:
    """Read the viewer's messages until it goes; then cancel and await its writer.

    `on_subscribe` may raise ProtocolError to refuse a subscription it cannot serve.
    """
    try:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                try:
                    message = decode(msg.data, max_bytes=MAX_CLIENT_MESSAGE)
                    if isinstance(message, Subscribe):
                        on_subscribe(message)
                except ProtocolError as exc:
                    log.warning("closing stream from %s: %s", peer, exc.reason)
                    await ws.close(code=WSCloseCode.UNSUPPORTED_DATA,
                                   message=exc.reason[:120].encode())
                    break
            elif msg.type == WSMsgType.TEXT:
                log.warning("closing stream from %s: text message on a binary protocol", peer)
                await ws.close(code=WSCloseCode.UNSUPPORTED_DATA,
                               message=b"protocol v1 is binary msgpack")
                break
            elif msg.type == WSMsgType.ERROR:
                log.warning("stream from %s failed: %s", peer, ws.exception())
                break
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, RuntimeError):
            await writer
