"""Hostile peers against the agent, the relay and the viewer: oversized, truncated,
malformed and slow-drip messages. Each closes (or marks) that connection with a reason
and the others are served as before."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agent.protocol import Hello, Sample, encode, encode_map
from agent.sim.fake_nvml import FakeNvml
from tests.conftest import make_agent, receive, serve
from tuimon.model.cluster import ClusterState
from tuimon.relay import Relay, RelayConfig
from tuimon.sources.agent_stream import StreamOptions, watching


async def _closed(ws: aiohttp.ClientWebSocketResponse) -> aiohttp.WSMessage:
    while True:
        msg = await asyncio.wait_for(ws.receive(), 10)
        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                        aiohttp.WSMsgType.ERROR):
            return msg


async def test_agent_oversized_and_truncated_and_slow_drip_clients(
        proc_root: Path, fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    agent = make_agent(proc_root, fake_nvml, interval=0.1)
    async with serve(agent) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(server.make_url("/v1/stream")) as good:
        await receive(good)
        # Oversized: more than the 64 KiB a viewer may send.
        async with s.ws_connect(server.make_url("/v1/stream")) as big:
            await big.send_bytes(b"\x00" * (100 * 1024))
            await _closed(big)
            # 1009, or 1006 when the server hangs up while the client is still sending.
            assert big.close_code in (aiohttp.WSCloseCode.MESSAGE_TOO_BIG,
                                      aiohttp.WSCloseCode.ABNORMAL_CLOSURE)
        assert any("exceeds limit" in r.message for r in caplog.records)
        # Truncated: a msgpack map cut short.
        async with s.ws_connect(server.make_url("/v1/stream")) as cut:
            await cut.send_bytes(encode_map({"v": 1, "t": "subscribe",
                                             "interval": 1.0})[:-3])
            msg = await _closed(cut)
            assert cut.close_code == aiohttp.WSCloseCode.UNSUPPORTED_DATA
            assert "msgpack" in (msg.extra or "")
        assert any("closing stream from" in r.message and "msgpack" in r.message
                   for r in caplog.records)
        # Slow drip: an upgrade request a byte at a time holds nothing up.
        host, port = server.host, server.port
        _, writer = await asyncio.open_connection(host, port)
        request = (f"GET /v1/stream HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\n").encode()
        try:
            seq = None
            for byte in request[:40]:
                writer.write(bytes([byte]))
                await writer.drain()
                message = await receive(good, timeout=2)
                if isinstance(message, Sample):
                    assert seq is None or message.seq > seq
                    seq = message.seq
            assert seq is not None
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def test_relay_refuses_an_oversized_viewer_message_and_serves_the_rest(
        unused_tcp_port_factory) -> None:
    from agent.sim.cluster import SimCluster

    sim = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    async with sim, Relay(RelayConfig(targets=sim.targets, listen="127.0.0.1:0",
                                      interval=0.2)) as relay:
        good = ClusterState()
        url = f"http://127.0.0.1:{relay.port}/v1/stream"
        async with watching([f"127.0.0.1:{relay.port}"], good), \
                aiohttp.ClientSession() as s:
            async with s.ws_connect(url) as big:
                await big.send_bytes(b"\x00" * (100 * 1024))
                await _closed(big)
                assert big.close_code in (aiohttp.WSCloseCode.MESSAGE_TOO_BIG,
                                          aiohttp.WSCloseCode.ABNORMAL_CLOSURE)
            async with s.ws_connect(url) as cut:
                await cut.send_bytes(encode_map({"v": 1, "t": "subscribe"})[:-2])
                await _closed(cut)
                assert cut.close_code == aiohttp.WSCloseCode.UNSUPPORTED_DATA
            node = good.add_target(sim.targets[0])
            deadline = time.monotonic() + 10
            while node.sample is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            seq = node.sample.seq
            while node.sample.seq == seq and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert node.sample.seq > seq and len(relay.state.fanout.viewers) == 1


# -- hostile agents against the viewer -------------------------------------------------------

Behaviour = Callable[[web.WebSocketResponse, web.Request], Awaitable[None]]


@contextlib.asynccontextmanager
async def fake_agents(behaviours: list[Behaviour]) -> AsyncIterator[list[str]]:
    runners, targets = [], []
    for behave in behaviours:
        async def stream(request: web.Request, behave: Behaviour = behave
                         ) -> web.WebSocketResponse:
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            with contextlib.suppress(ConnectionError, RuntimeError, asyncio.CancelledError):
                await behave(ws, request)
            return ws
        app = web.Application()
        app.router.add_get("/v1/stream", stream)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        targets.append(f"127.0.0.1:{port}")
    try:
        yield targets
    finally:
        for runner in runners:
            await runner.cleanup()


def _hello(name: str) -> bytes:
    return encode(Hello(node=name, agent_version="t", boot_id=None, interval=0.2, ts=1.0))


def _sample(seq: int) -> bytes:
    return encode(Sample(seq=seq, ts=time.time(), interval=0.2, gpus=[], host={}))


async def honest(ws: web.WebSocketResponse, _: web.Request) -> None:
    await ws.send_bytes(_hello("honest"))
    for seq in range(10_000):
        await ws.send_bytes(_sample(seq))
        await asyncio.sleep(0.2)


async def oversized(ws: web.WebSocketResponse, _: web.Request) -> None:
    await ws.send_bytes(_hello("oversized"))
    await ws.send_bytes(encode_map({"v": 1, "t": "sample", "seq": 1, "ts": 1.0,
                                    "interval": 0.2, "pad": "x" * 4000,
                                    "storage": {"blob": ["y" * 1000] * 1200}}))
    await asyncio.sleep(30)


async def truncated(ws: web.WebSocketResponse, _: web.Request) -> None:
    await ws.send_bytes(_hello("truncated"))
    await ws.send_bytes(_sample(1)[:-5])
    await asyncio.sleep(30)


async def slow_drip(ws: web.WebSocketResponse, request: web.Request) -> None:
    await ws.send_bytes(_hello("drip"))
    await ws.send_bytes(_sample(1))
    # A binary frame header announcing 4000 bytes, then a byte a second, for ever.
    transport = request.transport
    assert transport is not None
    transport.write(b"\x82\x7e\x0f\xa0")
    for _ in range(60):
        transport.write(b"\x00")
        await asyncio.sleep(1.0)


async def test_viewer_against_hostile_agents() -> None:
    async with fake_agents([honest, oversized, truncated, slow_drip]) as targets:
        cluster = ClusterState()
        async with watching(targets, cluster, StreamOptions(min_backoff=5, max_backoff=10)):
            honest_node, big, cut, drip = (cluster.nodes[t] for t in targets)

            async def until(check: Callable[[], bool], what: str) -> None:
                deadline = time.monotonic() + 15
                while not check():
                    assert time.monotonic() < deadline, f"timed out: {what}"
                    await asyncio.sleep(0.1)

            await until(lambda: "exceeds the limit" in (big.reason or ""), "oversized named")
            await until(lambda: "bad frame" in (cut.reason or ""), "truncated named")
            await until(lambda: drip.status in ("stale", "down")
                        and "no frame for" in (drip.reason or ""), "slow drip stale")
            assert honest_node.status == "up"
            seq = honest_node.sample.seq
            await until(lambda: honest_node.sample.seq > seq, "the honest node goes on")
            assert cluster.protocol_errors >= 2


# -- terminal safety -----------------------------------------------------------------------

EVIL = "evil\x1b]0;pwned\x07\x1b[2J\u202e"


async def evil_names(ws: web.WebSocketResponse, _: web.Request) -> None:
    from agent.protocol import Event

    await ws.send_bytes(encode(Hello(
        node=EVIL, agent_version="t\x1b[31m", boot_id=None, interval=0.2, ts=1.0,
        extra={"ports": [{"id": "mlx5_0:1\x1b[5m", "device": "mlx5\x07"}]})))
    await ws.send_bytes(encode(Event(ts=time.time(), kind="xid", severity="critical",
                                     message=f"XID 79 on {EVIL}", gpu=0, code=79)))
    for seq in range(10_000):
        await ws.send_bytes(encode(Sample(seq=seq, ts=time.time(), interval=0.2, gpus=[],
                                          host={}, extra={"fabric": {"ports": [
                                              {"id": "mlx5_0:1\x1b[5m", "state": 1,
                                               "state_name": "DOWN\x1b[2J"}]}})))
        await asyncio.sleep(0.2)


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or c in "\x7f\u202e"]


async def test_strings_from_the_network_never_reach_the_terminal_raw() -> None:
    """A hostile node name, device name and event message, through the plain readout
    (`--once`, `--plain`), `tuimon status` and the app itself."""
    from tuimon.readout import render
    from tuimon.status import format_text, report

    async with fake_agents([evil_names]) as targets:
        cluster = ClusterState()
        async with watching(targets, cluster):
            node = cluster.add_target(targets[0])
            deadline = time.monotonic() + 10
            while (node.sample is None or not cluster.events) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            text = render(cluster)
            assert "evil\\x1b]0;pwned\\x07" in text and _raw_controls(text) == []
            from tuimon.model.diagnosis import Diagnosis
            from tuimon.model.efficiency import EfficiencyView
            from tuimon.model.storage import StorageView

            eff = EfficiencyView()
            eff.update(cluster)
            findings = Diagnosis().update(cluster, eff, StorageView())
            status = format_text(report(cluster, eff, findings, "critical"))
            assert _raw_controls(status) == [], status

            from tuimon.ui.app import TuimonApp

            app = TuimonApp(cluster, sources=lambda state: [])
            async with app.run_test(size=(160, 40)) as pilot:
                await pilot.pause()
                await pilot.press("enter")  # the node screen: ports, host, events
                await pilot.pause()
                screen = app.export_screenshot()
            assert "pwned" in screen and "\x1b" not in screen and "\x07" not in screen
