"""A connection to one agent's `/v1/stream`, kept up with backoff and jitter.

Each `AgentStream` runs as its own task: a slow, dead or misbehaving agent only ever
delays itself. Decoded messages go to a sink (the viewer's `ClusterState`, or a relay's
fan-out); what went wrong (connection refused, bad frame, 401) goes to `mark_stale` with
a reason.

A target configured as a relay (`relays=` in `watching`, `--relay` on the command line)
sends `batch` messages that carry many nodes' frames, each under its source name; they
are applied as if each node had been watched directly. The relay's own address is then
not a node, and when the relay is lost every node it carried is marked stale.

Trust (docs/security.md): an agent speaks only for itself, so a target not configured as
a relay that sends batches is refused. A relay speaks only for the nodes it declared (the
sources it announces states for), never for a node the viewer watches directly or that
another relay already carries, and only for the nodes the viewer subscribed to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from tuimon_core.hostlist import expand_hostlists
from tuimon_core.overview import OVERVIEW_FAMILIES, has_overview
from tuimon_core.protocol import (
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
from tuimon_core.protocol.overview_layout import OVERVIEW_FORM
from tuimon_core.protocol.text import clean
from tuimon_core.timing import STALE_AFTER_INTERVALS, STALE_AT_LEAST_S

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 2.0  # at most this long for a peer to answer our close
# What one relay may declare to a viewer (or to a relay of relays): nodes, and the bytes
# of their names. A relay that declares more (a hostile one declaring thousands of new
# names a second) has the rest refused, and is told as a finding, in bounded memory.
MAX_RELAY_SOURCES = 65536
MAX_RELAY_NAME_CHARS = 4 << 20
MAX_REFUSED_KEPT = 4096  # refused names remembered (logged once each); the rest counted


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
    stale_after_intervals: float = STALE_AFTER_INTERVALS
    # Check every value of every sample (viewers); a relay checks the envelope and step
    # sums only and forwards the bytes to viewers that check the rest.
    deep_checks: bool = True
    # Take each node's overview and findings (tuimon_core.overview) instead of its full
    # samples, except for the nodes the viewer looks at closely (the sink's
    # `detail_targets`) and agents that predate overviews (their hello says so).
    overview: bool = False


class StreamSink(Protocol):
    """Where a stream's frames go: `ClusterState` in viewers, the fan-out in relays."""

    def add_target(self, target: str) -> Any: ...
    def claim(self, source: str, relay: str) -> bool: ...
    def forget_target(self, target: str) -> None: ...
    def apply_message(self, target: str, message: Hello | Sample | Event | None,
                      raw: bytes = b"") -> None: ...
    def mark_stale(self, target: str, reason: str) -> None: ...
    def note_protocol_error(self, target: str, reason: str) -> None: ...
    def apply_source_state(self, source: str, state: str, reason: str | None) -> None: ...
    def apply_budget(self, budget: dict[str, dict[str, Any]], source: str = "") -> None: ...
    def apply_judgement(self, judgement: dict[str, Any], relay: str) -> None: ...
    def note_relay_problem(self, relay: str, key: str, text: str | None) -> None: ...
    def forget_relay_problems(self, relay: str) -> None: ...
    def relay_lost(self, relay: str, sources: set[str] | frozenset[str],
                   reason: str) -> None: ...
    def relay_back(self, relay: str) -> None: ...
    def owner_of(self, source: str) -> str | None: ...


class TrustError(ProtocolError):
    """A peer that speaks for what it may not (a batch from an agent, a relay's frame for
    a node it did not declare)."""


class AgentStream:
    def __init__(self, target: str, cluster: StreamSink, session: aiohttp.ClientSession,
                 options: StreamOptions | None = None, *, relay: bool = False) -> None:
        self.target = target
        self.cluster = cluster
        self.session = session
        self.options = options or StreamOptions()
        self.relay = relay
        self.attempts = 0
        # Nodes this relay declared and the viewer let it carry.
        self.sources: set[str] = set()
        self.declared: set[str] = set()
        self._declared_chars = 0
        self.refused: dict[str, str] = {}  # source -> why its frames were refused
        self.refused_more = 0  # refused beyond MAX_REFUSED_KEPT, counted only
        self._logged: set[tuple[str, str]] = set()  # (source, reason) said in the log
        self._names: dict[str, str] = {}  # source -> the node name its hello gave
        # What to subscribe to, beyond options.subscribe's interval and nodes: the
        # families (None: all), whether this node is looked at closely (agents), which of
        # a relay's nodes are (relays), and whether the agent predates overviews.
        self._families: frozenset[str] | None = (
            frozenset(OVERVIEW_FAMILIES) if self.options.overview else
            None if self.options.subscribe is None or self.options.subscribe.families is None
            else frozenset(self.options.subscribe.families))
        self._managed = False  # families set by the caller (a relay's demand)
        self._detail = False
        # The nodes wanted whole (a relay sends those of them it carries, as it declares
        # them: a node screen opened before its relay declared the node still gets it).
        self._detail_wanted: frozenset[str] = frozenset()
        self._legacy = False
        self._away = False  # a relay that was lost and has not sent a batch since
        self._ws: aiohttp.ClientWebSocketResponse[bool] | None = None
        self._sent: Subscribe | None = None
        self._sending: set[asyncio.Task[None]] = set()
        subscribe = self.options.subscribe
        self._wanted: frozenset[str] | None = (
            frozenset(expand_hostlists(subscribe.nodes))
            if relay and subscribe is not None and subscribe.nodes is not None else None)
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
                reason = f"connection closed by the {'relay' if self.relay else 'agent'}"
            except asyncio.CancelledError:
                raise
            except aiohttp.WSServerHandshakeError as exc:
                reason = ("wrong or missing token (401)" if exc.status == 401
                          else f"handshake refused: HTTP {exc.status}")
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                reason = describe_error(exc)
            except TrustError as exc:
                reason = f"refused: {exc.reason}"
                log.warning("closing the stream from %s: %s", self.target, reason)
            except ProtocolError as exc:
                reason = f"bad frame: {exc.reason}"
                log.warning("closing the stream from %s: %s", self.target, reason)
            except Exception as exc:
                # Whatever went wrong (a bug in a check or a view), this node's stream is
                # started again; the other streams never saw it.
                reason = clean(f"internal error: {type(exc).__name__}: {exc}"[:200])
                log.exception("stream from %s failed; reconnecting", self.target)
            self._lost(reason)
            # Full jitter: thousands of viewers must not reconnect in lockstep.
            await asyncio.sleep(random.uniform(backoff / 2, backoff))
            backoff = min(self.options.max_backoff, backoff * 2)

    async def _connect_once(self) -> bool:
        headers = {"Authorization": f"Bearer {self.options.token}"} if self.options.token else {}
        ws = await self.session.ws_connect(
            self.url, headers=headers, ssl=self.options.ssl_context or True,
            heartbeat=30.0, timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
            max_msg_size=MAX_BATCH_BYTES)
        try:
            return await self._read(ws)
        finally:
            self._ws = None
            # aiohttp's close waits for the peer's close frame, reading on as long as
            # anything arrives: a peer that keeps sending would hold it for ever. Cut
            # short, close() aborts the connection.
            with contextlib.suppress(asyncio.TimeoutError, aiohttp.ClientError, OSError):
                await asyncio.wait_for(ws.close(), CLOSE_WAIT_S)

    async def _read(self, ws: aiohttp.ClientWebSocketResponse[bool]) -> bool:
        got = False
        interval = 1.0
        self._legacy = False  # until its hello says (it may have been upgraded meanwhile)
        if self.relay:  # connected again: what it does now is judged anew
            self.cluster.forget_relay_problems(self.target)
        self._sent = self.subscription()
        if self._sent is not None:
            await ws.send_bytes(encode(self._sent))
            interval = max(interval, self._sent.interval or 0.0)
        self._ws = ws
        while True:
            timeout = max(STALE_AT_LEAST_S, interval * self.options.stale_after_intervals)
            try:
                msg = await ws.receive(timeout=timeout)
            except asyncio.TimeoutError:
                self._lost(f"no frame for {timeout:.0f} s")
                continue
            if msg.type == aiohttp.WSMsgType.BINARY:
                try:
                    message = decode(msg.data, max_bytes=MAX_BATCH_BYTES,
                                     deep=self.options.deep_checks)
                    if len(msg.data) > MAX_MESSAGE_BYTES and not isinstance(message, Batch):
                        raise ProtocolError(
                            f"a node's message of {len(msg.data)} bytes exceeds the "
                            f"limit of {MAX_MESSAGE_BYTES}")
                    if isinstance(message, Subscribe):
                        raise ProtocolError("sent a subscribe, which only a viewer sends")
                    if message is not None and isinstance(message, Batch) != self.relay:
                        raise TrustError(
                            f"{self.target} sent relay batches but is not configured as a "
                            f"relay (if it is one: --relay {self.target})"
                            if not self.relay else
                            f"{self.target} is configured as a relay but sent a node's own "
                            "frames (if it is an agent, give it as a plain target)")
                except ProtocolError as exc:
                    # Say so now, before the connection is closed.
                    if isinstance(exc, TrustError):
                        self._lost(f"refused: {exc.reason}")
                    elif self.sources:
                        self._lost(f"bad frame: {exc.reason}")
                    else:
                        self.cluster.note_protocol_error(self.target, exc.reason)
                    raise
                got = True
                if isinstance(message, Batch):
                    if self._away:  # the relay answers again
                        self._away = False
                        self.cluster.relay_back(self.target)
                    self._apply_batch(message)
                    continue
                if self.options.recorder is not None:
                    self.options.recorder(self.target, msg.data)
                if isinstance(message, Hello):
                    interval = message.interval
                    self._note_hello(message)
                self.cluster.apply_message(self.target, message, msg.data)
            elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                              aiohttp.WSMsgType.CLOSED):
                return got
            elif msg.type == aiohttp.WSMsgType.ERROR:
                raise aiohttp.ClientError(str(ws.exception()))

    # -- what to ask for -------------------------------------------------------------

    def subscription(self) -> Subscribe | None:
        """The subscribe message for what this stream wants now."""
        base = self.options.subscribe
        if not self.options.overview and not self._managed:
            return base  # a plain subscription, as configured
        families = self._families
        if not self.relay and (self._detail or self._legacy):
            families = None  # every value: looked at closely, or no overview to take
        return Subscribe(interval=base.interval if base else None,
                         families=None if families is None else sorted(families),
                         nodes=base.nodes if base else None,
                         detail=sorted(self._detail_wanted & self.sources) if self.relay and
                         self.options.overview else None,
                         overview_form=OVERVIEW_FORM)

    def set_families(self, families: frozenset[str] | None) -> None:
        """Ask for these families from now on (None: all); a relay's demand from its
        viewers."""
        self._families = families
        self._managed = True
        self._resubscribe()

    def set_detail(self, targets: frozenset[str]) -> None:
        """The viewer's nodes looked at closely changed (ClusterState.set_detail)."""
        if self.relay:
            self._detail_wanted = frozenset(targets)
        else:
            self._detail = self.target in targets
        self._resubscribe()

    def _note_hello(self, hello: Hello) -> None:
        legacy = not has_overview(hello)
        if legacy != self._legacy:
            self._legacy = legacy
            self._resubscribe()

    def _resubscribe(self) -> None:
        sub = self.subscription()
        ws = self._ws
        if sub is None or sub == self._sent or ws is None or ws.closed:
            return  # the next connection sends what is wanted then
        self._sent = sub
        task = asyncio.get_running_loop().create_task(self._send(ws, encode(sub)))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, ws: aiohttp.ClientWebSocketResponse[bool], data: bytes) -> None:
        with contextlib.suppress(aiohttp.ClientError, OSError, ConnectionError):
            await ws.send_bytes(data)

    def _apply_batch(self, batch: Batch) -> None:
        if not self.sources and not self.declared:
            self.cluster.forget_target(self.target)  # a relay, not a node
        # A relay declares the nodes it carries by announcing their states; frames for
        # anything else are refused. States come after frames (below), but declarations
        # first: a node's first batch carries both.
        for source, _state, _reason in batch.sources:
            self._declare(source)
        for source, data in batch.frames:
            if not self._may_carry(source):
                continue
            try:
                message = decode(data, deep=self.options.deep_checks)
            except Exception as exc:
                # One node's bad frame is that node's problem, not the relay's (and a
                # check that fails on it, a bug, is that node's internal error).
                why = exc.reason if isinstance(exc, ProtocolError) else clean(
                    f"internal error: {type(exc).__name__}: {exc}"[:200])
                self._note_bad(source, why, exc)
                continue
            if isinstance(message, (Batch, Subscribe)):
                what = "a batch inside a batch" if isinstance(message, Batch) else \
                    "a subscribe inside a batch (only a viewer sends one)"
                self.cluster.note_protocol_error(source, what)
                continue
            if isinstance(message, Hello):
                if not self._wanted_name(source, message.node):
                    continue
                self._names[source] = message.node
            if self.options.recorder is not None:
                self.options.recorder(source, data)
            self._apply(source, message, data)
        # States after frames: a state is as of the batch's sending, newer than any frame
        # in it (a node that said hello and then sent garbage is stale, not up).
        for source, state, reason in batch.sources:
            if self._may_carry(source):
                self.cluster.apply_source_state(source, state, reason)
        if batch.budget:
            self.cluster.apply_budget(batch.budget, self.target)
        if batch.judgement is not None:
            self.cluster.apply_judgement(batch.judgement, self.target)
        self.cluster.note_relay_problem(
            self.target, "judgement", None if batch.judgement_error is None else
            f"relay {self.target} sent a judgement this viewer cannot read: "
            f"{batch.judgement_error}; it judges the nodes itself")
        self.cluster.note_relay_problem(
            self.target, "budget", None if batch.budget_error is None else
            f"relay {self.target} sent a budget this viewer cannot read: "
            f"{batch.budget_error}; the run's budget is not shown from it")

    def _apply(self, source: str, message: Hello | Sample | Event | None,
               data: bytes) -> None:
        """One node's frame from a relay, alone: whatever goes wrong with it (a bug in a
        view or the model) is that node's internal error, never the whole relay's
        connection and every node it carries."""
        try:
            self.cluster.apply_message(source, message, data)
        except Exception as exc:
            self._note_bad(source, clean(f"internal error: {type(exc).__name__}: {exc}"[:200]),
                           exc)

    def _note_bad(self, source: str, reason: str, exc: Exception) -> None:
        """A node's frame refused or failed: that node marked; logged once a source and
        reason (N broken nodes behind a relay must not write N tracebacks a second)."""
        key = (source, reason)
        if key not in self._logged and len(self._logged) < MAX_REFUSED_KEPT:
            self._logged.add(key)
            if isinstance(exc, ProtocolError):
                log.warning("bad frame for %s from relay %s: %s", source, self.target, reason)
            else:
                log.error("frame for %s from relay %s failed", source, self.target,
                          exc_info=exc)
        if isinstance(exc, ProtocolError):
            self.cluster.note_protocol_error(source, reason)
        else:
            self.cluster.mark_stale(source, reason)

    def _declare(self, source: str) -> None:
        if source in self.declared:
            return
        if len(self.declared) >= MAX_RELAY_SOURCES or \
                self._declared_chars + len(source) > MAX_RELAY_NAME_CHARS:
            self.cluster.note_relay_problem(
                self.target, "too many sources",
                f"relay {self.target} declared more nodes than one relay may carry "
                f"({MAX_RELAY_SOURCES} nodes, {MAX_RELAY_NAME_CHARS >> 20} MiB of names): "
                "the rest are refused")
            return
        self.declared.add(source)
        self._declared_chars += len(source)

    def _may_carry(self, source: str) -> bool:
        if source in self.sources:
            return True
        if source in self.refused:
            return False
        why = None
        if source not in self.declared:
            why = "not declared by the relay (no state announced for it)"
        elif self._wanted is not None and source not in self._wanted \
                and source.rsplit(":", 1)[0] not in self._wanted:
            # Its hello's name may still match the subscription: decided on the hello.
            return True
        elif not self.cluster.claim(source, self.target):
            owner = self.cluster.owner_of(source)
            why = (f"carried by relay {owner}" if owner else "watched directly")
            # Two relays that claim one node: a misconfigured tree, or a relay speaking
            # for nodes it does not carry. Neither is silently believed.
            self.cluster.note_relay_problem(
                self.target, f"claims {source}",
                f"relays {owner} and {self.target} both claim {source}: {self.target}'s "
                f"frames for it are refused" if owner else
                f"relay {self.target} claims {source}, which this viewer watches directly: "
                "its frames for it are refused")
        if why is not None:
            self._refuse(source, why)
            return False
        self._carry(source)
        return True

    def _carry(self, source: str) -> None:
        self.sources.add(source)
        if source in self._detail_wanted:
            self._resubscribe()  # wanted whole before the relay declared it

    def _wanted_name(self, source: str, node: str) -> bool:
        """Only the nodes the viewer subscribed to (by source, host or node name)."""
        if self._wanted is None or source in self.sources:
            return True
        if node in self._wanted and self.cluster.claim(source, self.target):
            self._carry(source)
            return True
        self._refuse(source, f"not among the nodes this viewer subscribed to (its hello "
                             f"says {node})")
        return False

    def _refuse(self, source: str, why: str) -> None:
        """Its frames are not applied; said once a source, in bounded memory."""
        if len(self.refused) >= MAX_REFUSED_KEPT:
            self.refused_more += 1
            return
        self.refused[source] = why
        log.warning("relay %s may not speak for %s: %s", self.target, source, why)

    def _lost(self, reason: str) -> None:
        if not self.sources:
            self.cluster.mark_stale(self.target, reason)
            return
        # One fault, the relay's: its nodes are not known to be down.
        self._away = True
        self.cluster.relay_lost(self.target, frozenset(self.sources), reason)


@contextlib.asynccontextmanager
async def watching(targets: list[str], cluster: StreamSink,
                   options: StreamOptions | None = None,
                   relays: list[str] | tuple[str, ...] = ()
                   ) -> AsyncIterator[dict[str, AgentStream]]:
    """One AgentStream task per target (agents) and per relay for the life of the block,
    then cancelled and awaited: what every viewer (app, readout, status, tests) and the
    relay itself do with their upstreams. Yields the streams by target. A sink that
    says which nodes it looks at closely (`add_detail_listener`) has each stream told
    when that changes."""
    relays = [r for r in relays if r not in targets]
    for t in [*targets, *relays]:
        cluster.add_target(t)
    # No pool limit: each agent holds one long-lived connection, and aiohttp's default
    # of 100 would leave every agent past the hundredth waiting for a free slot.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        streams = {t: AgentStream(t, cluster, session, options, relay=t in relays)
                   for t in [*targets, *relays]}

        def detail_changed(wanted: frozenset[str]) -> None:
            for stream in streams.values():
                stream.set_detail(wanted)

        listen = getattr(cluster, "add_detail_listener", None)
        if listen is not None:
            listen(detail_changed)
        tasks = [asyncio.create_task(s.run(), name=f"tuimon-stream-{t}")
                 for t, s in streams.items()]
        try:
            yield streams
        finally:
            if listen is not None:
                cluster.remove_detail_listener(detail_changed)  # type: ignore[attr-defined]
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def describe_error(exc: BaseException) -> str:
    """A connection failure in words for the node's reason column (`connection refused`,
    not Python's `Connect call failed ('10.0.0.5', 9477)`)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        err = exc.os_error
        errno_ = getattr(err, "errno", None)
        if errno_ and errno_ > 0:
            return f"cannot connect: {os.strerror(errno_).lower()}"
        text = str(getattr(err, "strerror", None) or err)
        if "Connect call failed" in text:
            return "cannot connect: connection refused"
        return f"cannot connect: {text}"
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
