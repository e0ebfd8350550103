"""A connection to one agent's `/v1/stream`, kept up with backoff and jitter.

Each `AgentStream` runs as its own task: a slow, dead or misbehaving agent only ever
delays itself. Decoded messages go to the model's `apply_*` methods; what went wrong
(connection refused, bad frame, 401) goes to `mark_stale` with a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp

from agent.protocol import Event, Hello, ProtocolError, Sample, Subscribe, decode, encode
from tuimon.model.cluster import ClusterState

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StreamOptions:
    token: str | None = None
    ssl_context: ssl.SSLContext | None = None
    subscribe: Subscribe | None = None
    # Called with (target, frame bytes) for every frame, before decoding (--record).
    recorder: Callable[[str, bytes], None] | None = None
    min_backoff: float = 0.5
    max_backoff: float = 30.0
    # No frame for this many sample intervals: the node is stale.
    stale_after_intervals: float = 3.0


class AgentStream:
    def __init__(self, target: str, cluster: ClusterState, session: aiohttp.ClientSession,
                 options: StreamOptions | None = None) -> None:
        self.target = target
        self.cluster = cluster
        self.session = session
        self.options = options or StreamOptions()
        self.attempts = 0
        cluster.add_target(target)

    @property
    def url(self) -> str:
        scheme = "wss" if self.options.ssl_context else "ws"
        return f"{scheme}://{self.target}/v1/stream"

    async def run(self) -> None:
        backoff = self.options.min_backoff
        while True:
            self.attempts += 1
            try:
                got_frames = await self._connect_once()
                if got_frames:
                    backoff = self.options.min_backoff
                reason = "connection closed by the agent"
            except asyncio.CancelledError:
                raise
            except aiohttp.WSServerHandshakeError as exc:
                reason = ("wrong or missing token (401)" if exc.status == 401
                          else f"handshake refused: HTTP {exc.status}")
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                reason = _describe(exc)
            except ProtocolError as exc:
                reason = f"bad frame: {exc.reason}"
            self.cluster.mark_stale(self.target, reason)
            # Full jitter: thousands of viewers must not reconnect in lockstep.
            await asyncio.sleep(random.uniform(backoff / 2, backoff))
            backoff = min(self.options.max_backoff, backoff * 2)

    async def _connect_once(self) -> bool:
        headers = {"Authorization": f"Bearer {self.options.token}"} if self.options.token else {}
        got = False
        async with self.session.ws_connect(
                self.url, headers=headers, ssl=self.options.ssl_context or True,
                heartbeat=30.0, timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
                max_msg_size=1 << 20) as ws:
            if self.options.subscribe is not None:
                await ws.send_bytes(encode(self.options.subscribe))
            interval = 1.0
            while True:
                timeout = max(5.0, interval * self.options.stale_after_intervals)
                try:
                    msg = await ws.receive(timeout=timeout)
                except asyncio.TimeoutError:
                    self.cluster.mark_stale(self.target, f"no frame for {timeout:.0f} s")
                    continue
                if msg.type == aiohttp.WSMsgType.BINARY:
                    if self.options.recorder is not None:
                        self.options.recorder(self.target, msg.data)
                    message = decode(msg.data)
                    got = True
                    if isinstance(message, Hello):
                        interval = message.interval
                        self.cluster.apply_hello(self.target, message)
                    elif isinstance(message, Sample):
                        self.cluster.apply_sample(self.target, message)
                    elif isinstance(message, Event):
                        self.cluster.apply_event(self.target, message)
                elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                                  aiohttp.WSMsgType.CLOSED):
                    return got
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    raise aiohttp.ClientError(str(ws.exception()))


@contextlib.asynccontextmanager
async def watching(targets: list[str], cluster: ClusterState,
                   options: StreamOptions | None = None) -> AsyncIterator[None]:
    """One AgentStream task per target for the life of the block, then cancelled and
    awaited: what every viewer (app, readout, status, tests) does with its agents."""
    for t in targets:
        cluster.add_target(t)
    # No pool limit: each agent holds one long-lived connection, and aiohttp's default
    # of 100 would leave every agent past the hundredth waiting for a free slot.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [asyncio.create_task(AgentStream(t, cluster, session, options).run(),
                                     name=f"tuimon-stream-{t}") for t in targets]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def _describe(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
