"""A connection to one agent's `/v1/stream`, kept up with backoff and jitter.

Each `AgentStream` runs as its own task: a slow, dead or misbehaving agent only ever
delays itself. Decoded messages go to a sink (the viewer's `ClusterState`, or a relay's
fan-out); what went wrong (connection refused, bad frame, 401) goes to `mark_stale` with
a reason.

The target may also be a relay: its `batch` messages carry many nodes' frames, each under
its source name, and are applied as if each node had been watched directly. The relay's
own address is then not a node, and when the relay is lost every node it carried is
marked stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from agent.protocol import (
    MAX_BATCH_BYTES,
    MAX_MESSAGE_BYTES,
    Batch,
    Event,
    Hello,
    ProtocolError,
    Sample,
    Subscribe,
    decode,
    encode,
)

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
    # Check every value of every sample (viewers); a relay checks the envelope and step
    # sums only and forwards the bytes to viewers that check the rest.
    deep_checks: bool = True


class StreamSink(Protocol):
    """Where a stream's frames go: `ClusterState` in viewers, the fan-out in relays."""

    def add_target(self, target: str) -> Any: ...
    def forget_target(self, target: str) -> None: ...
    def apply_message(self, target: str, message: Hello | Sample | Event | None,
                      raw: bytes = b"") -> None: ...
    def mark_stale(self, target: str, reason: str) -> None: ...
    def note_protocol_error(self, target: str, reason: str) -> None: ...
    def apply_source_state(self, source: str, state: str, reason: str | None) -> None: ...
    def apply_budget(self, budget: dict[str, dict[str, Any]]) -> None: ...


class AgentStream:
    def __init__(self, target: str, cluster: StreamSink, session: aiohttp.ClientSession,
                 options: StreamOptions | None = None) -> None:
        self.target = target
        self.cluster = cluster
        self.session = session
        self.options = options or StreamOptions()
        self.attempts = 0
        # Nodes this target carried, when it turned out to be a relay.
        self.sources: set[str] = set()
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
                reason = describe_error(exc)
            except ProtocolError as exc:
                reason = f"bad frame: {exc.reason}"
                log.warning("closing the stream from %s: %s", self.target, reason)
            self._lost(reason)
            # Full jitter: thousands of viewers must not reconnect in lockstep.
            await asyncio.sleep(random.uniform(backoff / 2, backoff))
            backoff = min(self.options.max_backoff, backoff * 2)

    async def _connect_once(self) -> bool:
        headers = {"Authorization": f"Bearer {self.options.token}"} if self.options.token else {}
        got = False
        async with self.session.ws_connect(
                self.url, headers=headers, ssl=self.options.ssl_context or True,
                heartbeat=30.0, timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
                max_msg_size=MAX_BATCH_BYTES) as ws:
            interval = 1.0
            if self.options.subscribe is not None:
                await ws.send_bytes(encode(self.options.subscribe))
                interval = max(interval, self.options.subscribe.interval or 0.0)
            while True:
                timeout = max(5.0, interval * self.options.stale_after_intervals)
                try:
                    msg = await ws.receive(timeout=timeout)
                except asyncio.TimeoutError:
                    self._lost(f"no frame for {timeout:.0f} s")
                    continue
                if msg.type == aiohttp.WSMsgType.BINARY:
                    try:
                        message = decode(msg.data, max_bytes=MAX_BATCH_BYTES,
                                         deep=self.options.deep_checks)
                        if len(msg.data) > MAX_MESSAGE_BYTES and not isinstance(message,
                                                                                 Batch):
                            raise ProtocolError(
                                f"a node's message of {len(msg.data)} bytes exceeds the "
                                f"limit of {MAX_MESSAGE_BYTES}")
                    except ProtocolError as exc:
                        # Say so now: closing can wait seconds on a peer that does
                        # not read.
                        if self.sources:
                            self._lost(f"bad frame: {exc.reason}")
                        else:
                            self.cluster.note_protocol_error(self.target, exc.reason)
                        raise
                    got = True
                    if isinstance(message, Batch):
                        self._apply_batch(message)
                        continue
                    if self.options.recorder is not None:
                        self.options.recorder(self.target, msg.data)
                    if isinstance(message, Hello):
                        interval = message.interval
                    self.cluster.apply_message(self.target, message, msg.data)
                elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                                  aiohttp.WSMsgType.CLOSED):
                    return got
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    raise aiohttp.ClientError(str(ws.exception()))


    def _apply_batch(self, batch: Batch) -> None:
        if not self.sources:
            self.cluster.forget_target(self.target)  # a relay, not a node
        for source, data in batch.frames:
            self.sources.add(source)
            try:
                message = decode(data, deep=self.options.deep_checks)
            except ProtocolError as exc:
                # One node's bad frame is that node's problem, not the relay's.
                log.warning("bad frame for %s from relay %s: %s", source, self.target,
                            exc.reason)
                self.cluster.note_protocol_error(source, exc.reason)
                continue
            if self.options.recorder is not None:
                self.options.recorder(source, data)
            if isinstance(message, Batch):
                self.cluster.note_protocol_error(source, "a batch inside a batch")
                continue
            self.cluster.apply_message(source, message, data)
        # States after frames: a state is as of the batch's sending, newer than any frame
        # in it (a node that said hello and then sent garbage is stale, not up).
        for source, state, reason in batch.sources:
            self.sources.add(source)
            self.cluster.apply_source_state(source, state, reason)
        if batch.budget:
            self.cluster.apply_budget(batch.budget)

    def _lost(self, reason: str) -> None:
        if not self.sources:
            self.cluster.mark_stale(self.target, reason)
            return
        for source in self.sources:
            self.cluster.mark_stale(source, f"relay {self.target}: {reason}")


@contextlib.asynccontextmanager
async def watching(targets: list[str], cluster: StreamSink,
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


def describe_error(exc: BaseException) -> str:
    """A connection failure in words for the node's reason column."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
