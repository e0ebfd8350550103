"""The viewer-to-server half of a stream, shared by the agent and the relay.

Viewers only ever send `subscribe`. Valid msgpack of an unknown type is ignored; a
message that is not valid closes that connection with code 1003 and the reason, and
the server goes on serving everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiohttp import WSCloseCode, WSMsgType, web

from agent.protocol import ProtocolError, Subscribe, decode

log = logging.getLogger(__name__)

MAX_CLIENT_MESSAGE = 64 * 1024


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
