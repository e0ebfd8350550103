"""Hostile peers against the agent, the relay and the viewer: oversized, truncated,
malformed and slow-drip messages. Each closes (or marks) that connection with a reason
and the others are served as before."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agent.sim.fake_nvml import FakeNvml
from tests.conftest import make_agent, receive, serve
from tuimon.model.cluster import ClusterState
from tuimon.relay import Relay, RelayConfig
from tuimon.sources.agent_stream import StreamOptions, watching
from tuimon_core.protocol import Hello, Sample, Subscribe, encode, encode_map


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
        async with watching([], good, relays=[f"127.0.0.1:{relay.port}"]), \
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
            deadline = time.monotonic() + 10
            while (sim.targets[0] not in good.nodes or good.nodes[sim.targets[0]].sample is None) \
                    and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            node = good.nodes[sim.targets[0]]
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


async def subscriber(ws: web.WebSocketResponse, _: web.Request) -> None:
    """A peer that says hello, then sends what only a viewer sends."""
    await ws.send_bytes(_hello("subscriber"))
    await ws.send_bytes(encode(Subscribe(nodes=["honest"], families=["gpu"], interval=1.0)))
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
    async with fake_agents([honest, oversized, truncated, slow_drip, subscriber]) as targets:
        cluster = ClusterState()
        async with watching(targets, cluster, StreamOptions(min_backoff=5, max_backoff=10)):
            honest_node, big, cut, drip, sub = (cluster.nodes[t] for t in targets)

            async def until(check: Callable[[], bool], what: str) -> None:
                deadline = time.monotonic() + 15
                while not check():
                    assert time.monotonic() < deadline, f"timed out: {what}"
                    await asyncio.sleep(0.1)

            await until(lambda: "exceeds the limit" in (big.reason or ""), "oversized named")
            await until(lambda: "bad frame" in (cut.reason or ""), "truncated named")
            # Not taken as the node's own frame (it marked the node up and went on to the
            # relay's viewers): refused and named.
            await until(lambda: "only a viewer sends" in (sub.reason or ""), "subscribe named")
            assert sub.status != "up"
            await until(lambda: drip.status in ("stale", "down")
                        and "no frame for" in (drip.reason or ""), "slow drip stale")
            assert honest_node.status == "up"
            seq = honest_node.sample.seq
            await until(lambda: honest_node.sample.seq > seq, "the honest node goes on")
            assert cluster.protocol_errors >= 2


# -- terminal safety -----------------------------------------------------------------------

EVIL = "evil\x1b]0;pwned\x07\x1b[2J\u202e"


async def evil_names(ws: web.WebSocketResponse, _: web.Request) -> None:
    from tuimon_core.protocol import Event

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


# -- spoofing: a target that speaks for others (docs/security.md, "trust") ---------------


def _spoofer(victims: list[str]) -> Behaviour:
    from tests.hostile_peer import spoof_batch

    async def behave(ws: web.WebSocketResponse, _: web.Request) -> None:
        while True:
            await ws.send_bytes(encode(spoof_batch(victims)))
            await asyncio.sleep(0.2)
    return behave


async def _until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.1)


async def test_a_target_cannot_speak_for_other_nodes(unused_tcp_port_factory) -> None:
    from agent.sim.cluster import SimCluster

    sim = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    async with sim, fake_agents([_spoofer([*sim.targets, "ghost:9477"])]) as (spoofer,):
        # As a plain target (an agent): its batches are refused, nothing it says lands.
        cluster = ClusterState()
        async with watching([*sim.targets, spoofer], cluster):
            await _until(lambda: "not configured as a relay" in (
                cluster.nodes[spoofer].reason or ""), "the spoofer refused with a reason")
            await asyncio.sleep(1.0)
            for t in sim.targets:
                node = cluster.nodes[t]
                assert node.status == "up" and node.hello.agent_version != "spoof"
                assert all((g.get("temp") or 0) < 99 for g in node.gpu_values())
            assert "ghost:9477" not in cluster.nodes and cluster.budgets == {}
        # Configured as a relay: it may carry what it declares, but never a node the
        # viewer watches directly; and its claims are bounded like anyone's.
        cluster = ClusterState()
        async with watching(sim.targets, cluster, relays=[spoofer]):
            await _until(lambda: "ghost:9477" in cluster.nodes, "the relay's own node")
            await asyncio.sleep(1.0)
            for t in sim.targets:
                node = cluster.nodes[t]
                assert node.status == "up" and node.hello.agent_version != "spoof", t
                assert node.reason is None


async def test_a_spoofing_upstream_cannot_burn_the_ledger(tmp_path: Path,
                                                          unused_tcp_port_factory) -> None:
    from tuimon.relay.ledger import Ledger

    async with fake_agents([_spoofer(["ghost-a:9477", "ghost-b:9477"])]) as (spoofer,):
        started = time.monotonic()
        path = tmp_path / "ledger.db"
        async with Relay(RelayConfig(relays=[spoofer], listen="127.0.0.1:0", ledger=path,
                                     interval=0.2, flush_every=0.5,
                                     upstream_backoff=(0.1, 0.5))) as relay:
            await _until(lambda: {"ghost-a:9477", "ghost-b:9477"} <= set(
                relay.state.fanout.sources), "the ghosts carried")
            await asyncio.sleep(3.0)
        elapsed = time.monotonic() - started
        with Ledger(path) as ledger:
            stored = sum(t for _, t, _ in ledger.buckets("llm-pretrain"))
        # Each ghost claims a day per batch, five batches a second; what counts is at
        # most the time that passed (and a rank's first allowance), not 480 h.
        assert 0 < stored <= elapsed + 15.0 + 1.0, stored
        # The same spoofer as a plain agent target writes nothing at all.
        path2 = tmp_path / "ledger2.db"
        async with Relay(RelayConfig(targets=[spoofer], listen="127.0.0.1:0", ledger=path2,
                                     interval=0.2, flush_every=0.5,
                                     upstream_backoff=(0.1, 0.5))) as relay:
            await _until(lambda: "not configured as a relay" in (
                relay.state.fanout.sources[spoofer].reason or ""), "refused with a reason")
        with Ledger(path2) as ledger:
            assert ledger.buckets("llm-pretrain") == []


# -- slow clients and file descriptors ----------------------------------------------------


def test_slow_clients_cannot_starve_an_agent_of_descriptors(proc_root: Path,
                                                            tmp_path: Path) -> None:
    """An agent limited to 256 descriptors, 400 clients that never finish their request:
    /healthz and /metrics keep answering, the slow ones are closed, nothing floods the
    log."""
    import os
    import resource
    import subprocess
    import sys
    import urllib.request

    from tests.tmux import ROOT

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    log_path = tmp_path / "agent.log"
    with log_path.open("wb") as log_file:
        agent = subprocess.Popen(
            [sys.executable, "-m", "agent", "run", "--listen", f"127.0.0.1:{port}",
             "--root", str(proc_root), "--no-steps", "--interval", "1"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log_file,
            stderr=subprocess.STDOUT, preexec_fn=low_limit)
    slow: list[socket.socket] = []

    def get(path: str) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as resp:
            return resp.status
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                assert get("/healthz") == 200
                break
            except OSError:
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.2)
        request = (f"GET /v1/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n").encode()
        for _ in range(400):
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            c.setblocking(False)
            slow.append(c)
        answered = []
        started = time.monotonic()
        for tick in range(14):  # past the 10 s header timeout
            for c in slow:  # a byte each, every second
                with contextlib.suppress(OSError):
                    c.send(request[tick:tick + 1])
            t0 = time.monotonic()
            assert get("/healthz") == 200 and get("/metrics") == 200
            answered.append(time.monotonic() - t0)
            time.sleep(max(0.0, started + tick + 1 - time.monotonic()))
        assert max(answered) < 2.0, answered
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as resp:
            metrics = resp.read().decode()
        closed = {line.split("reason=")[1].split('"')[1]: float(line.rsplit(" ", 1)[1])
                  for line in metrics.splitlines()
                  if line.startswith("tuimon_agent_connections_closed_unadmitted_total")}
        assert closed["evicted"] > 0 and closed["timed_out"] > 0, closed
    finally:
        for c in slow:
            c.close()
        agent.terminate()
        agent.wait(timeout=10)
    text = log_path.read_text()
    assert "Traceback" not in text and len(text) < 20_000, text[-3000:]


# -- one set of hostile names through every surface --------------------------------------


def _printable_lines(text: str) -> bool:
    return all(c.isprintable() for line in text.split("\n") for c in line)


async def test_every_surface_escapes_the_same_hostile_names(
        proc_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The agent's own outside strings (node name, NVML, sysfs and mount names, a job
    name from the step socket) and a hostile peer's, through the wire, `/metrics`, the
    relay's labels, `tuimon-agent once` and the logs."""
    from agent.cli import format_once, once_report
    from agent.files import FileTree
    from agent.metrics import make_registry, render
    from agent.node import AgentConfig, NodeAgent
    from agent.reporter import StepReporter
    from agent.sim.fake_nvml import FakeGpu
    from tests.hostile_peer import EVIL, FORGED_JOB, names
    from tests.trees import ib_port, write

    caplog.set_level(logging.INFO)
    ib_port(proc_root, "mlx5\x1b]0;ib\x07")
    (proc_root / "data\x1b[2J").mkdir()
    write(proc_root / "proc/self/mounts", "/dev/sda1 /data\x1b[2J xfs rw 0 0\n")
    nvml = FakeNvml([FakeGpu(0, name="H100\x1b]52;c;eA==\x07")])
    sock = str(tmp_path / "steps.sock")
    agent = NodeAgent(AgentConfig(node_name=EVIL, root=str(proc_root), interval=0.2,
                                  steps_socket=sock, watch_xid=False),
                      files=FileTree(proc_root), nvml_loader=lambda: nvml)
    await agent.start(sampling=False)
    try:
        StepReporter(FORGED_JOB, 0, 1, socket_path=sock).report(0.5, 0.4)
        await asyncio.sleep(0.05)
        await agent.sample_once()
        sample = await agent.sample_once()
        from tuimon_core.protocol import Event

        agent.emit_event(Event(time.time(), "xid", "critical", f"XID 79 on {EVIL}", gpu=0))
        from tests.test_protocol import _strings

        sent = _strings(sample.to_wire()) + _strings(agent.hello.to_wire())
        assert all(s.isprintable() for s in sent), [s for s in sent if not s.isprintable()]
        text = format_once(once_report(agent, sample))
        metrics = render(make_registry(agent)).decode()
    finally:
        await agent.stop()
    assert _printable_lines(text) and "evil\\x1b]0;pwned-title" in text
    assert _printable_lines(metrics), [ln for ln in metrics.split("\n")
                                       if not _printable_lines(ln)]
    assert 'job="train\\\\x0aOK: nodes 999 up"' in metrics
    assert "mlx5\\\\x1b]0;ib\\\\x07" in metrics and 'mount="/data\\\\x1b[2J"' in metrics

    # A hostile peer upstream of a relay: its names reach the relay's labels cleaned.
    async def hostile(ws: web.WebSocketResponse, _: web.Request) -> None:
        await names(ws)

    config = RelayConfig(listen="127.0.0.1:0", ledger=tmp_path / "l.db", budget_every=0.2,
                         interval=0.2)
    async with fake_agents([hostile]) as (target,), \
            Relay(dataclasses.replace(config, targets=[target])) as relay, \
            aiohttp.ClientSession() as s:
        deadline = time.monotonic() + 15
        while not relay.state.budget and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        async with s.get(f"http://127.0.0.1:{relay.port}/metrics") as resp:
            relay_metrics = await resp.text()
    assert 'job="train\\\\x0aOK: nodes 999 up"' in relay_metrics, relay_metrics
    assert _printable_lines(relay_metrics)
    logged = [r.getMessage() for r in caplog.records]
    assert any("evil\\x1b]0;pwned" in m for m in logged), logged
    assert all(_printable_lines(m) for m in logged), [m for m in logged
                                                      if not _printable_lines(m)]


# -- host-list bombs ---------------------------------------------------------------------

BOMB = ",".join(f"n{i}[1-99999]" for i in range(150))  # 1.9 KB: 15 million names


def test_host_lists_are_counted_before_they_are_expanded(tmp_path: Path) -> None:
    from tuimon.model.view_state import parse_topology_conf
    from tuimon.sources.targets import TargetError, expand_hostlist, parse_targets

    started = time.monotonic()
    for attempt in (lambda: parse_targets([BOMB]),
                    lambda: expand_hostlist("a[1-99999]b[1-99999]"),
                    lambda: parse_topology_conf(f"SwitchName=s1 Nodes={BOMB}\n"),
                    lambda: parse_targets([f"g{i}[1-99999]" for i in range(3)])):
        with pytest.raises(TargetError, match="more than 100000"):
            attempt()
    assert time.monotonic() - started < 1.0  # counted, not built


async def test_a_host_list_bomb_in_a_subscribe_is_refused_at_once(
        unused_tcp_port_factory) -> None:
    from agent.sim.cluster import SimCluster
    from tuimon_core.protocol import Subscribe

    sim = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    async with sim, Relay(RelayConfig(targets=sim.targets, listen="127.0.0.1:0",
                                      interval=0.2)) as relay:
        good = ClusterState()
        async with watching([], good, relays=[f"127.0.0.1:{relay.port}"]), \
                aiohttp.ClientSession() as s:
            await _until(lambda: sim.targets[0] in good.nodes
                         and good.nodes[sim.targets[0]].sample is not None, "served")
            async with s.ws_connect(f"http://127.0.0.1:{relay.port}/v1/stream") as bomb:
                started = time.monotonic()
                await bomb.send_bytes(encode(Subscribe(nodes=[BOMB])))
                msg = await _closed(bomb)
                assert time.monotonic() - started < 2.0
                assert bomb.close_code == aiohttp.WSCloseCode.UNSUPPORTED_DATA
                assert "more than 100000" in (msg.extra or "")
            seq = good.nodes[sim.targets[0]].sample.seq
            await _until(lambda: good.nodes[sim.targets[0]].sample.seq > seq, "goes on")


# -- Prometheus labels to the terminal and the log ---------------------------------------

EVIL_LABEL = "evil\x1b]0;pwned\x07\x1b[2J\nFAKE: ok"


def _evil_answer() -> bytes:
    """Every query answered with 80 GPUs of one node named by escapes: its frames are
    refused (64 GPUs at most), and the refusal names the node."""
    import json

    series = [{"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": str(i),
                          "Hostname": EVIL_LABEL, "instance": f"{EVIL_LABEL}:9400",
                          "job": "dcgm"}, "value": [1.0, "50"]} for i in range(80)]
    return json.dumps({"status": "success", "data": {"resultType": "vector",
                                                     "result": series}}).encode()


async def test_a_refused_prometheus_node_reaches_no_terminal_or_log_raw(
        tmp_path: Path) -> None:
    """`status --prometheus` and `tuimon prom --once` say the node's frame was refused
    and name it, escaped, on stdout and stderr; the app's log file likewise."""
    from tests.conftest import run_tuimon
    from tests.test_bounds import _prom_server
    from tuimon.app_log import log_to_file

    runner, url = await _prom_server([_evil_answer()])
    try:
        outputs = [await run_tuimon("status", "--prometheus", url, timeout=60),
                   await run_tuimon("prom", url, "--once", timeout=60)]
    finally:
        await runner.cleanup()
    for _, text in outputs:
        assert "refused" in text and "evil" in text, text
        assert "\x1b" not in text and "\x07" not in text, repr(text)
        assert "\nFAKE: ok" not in text
    log = tmp_path / "tuimon.log"
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        log_to_file(str(log))
        logging.getLogger("tuimon.sources.prometheus").warning(
            "prometheus data for %s refused: %s", EVIL_LABEL, "reason")
        try:
            raise ValueError(EVIL_LABEL)
        except ValueError:
            logging.getLogger("t").exception("a bug on %s", EVIL_LABEL)
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            handler.close()
            root.removeHandler(handler)
    written = log.read_text()
    assert "\x1b" not in written and "\x07" not in written, repr(written)
    assert "\nFAKE: ok" not in written and "Traceback" in written


# -- the relay's judgement against hostile peers --------------------------------------------


def _impersonator(victim: str) -> Behaviour:
    """An agent that says it is `victim`, its GPU failed and burning, its port down."""
    async def behave(ws: web.WebSocketResponse, _: web.Request) -> None:
        await ws.send_bytes(_hello(victim))
        for seq in range(1, 10_000):
            await ws.send_bytes(encode(Sample(
                seq=seq, ts=time.time(), interval=0.2,
                gpus=[{"temp": 99.0, "util": 1.0, "failed": "GPU is lost",
                       "clock_events": ["hw_thermal_slowdown"]}], host={},
                extra={"fabric": {"ports": [{"id": "mlx5_0:1", "state": 1,
                                             "state_name": "DOWN"}]}})))
            await asyncio.sleep(0.2)
    return behave


def _accuser(victims: list[str], job: str, world: int) -> Behaviour:
    """An agent of its own name that blames others: critical findings whose text names
    them, and the steps of every rank of their job, each step far faster than theirs (to
    make them the stragglers), with a world far larger than the job's."""
    async def behave(ws: web.WebSocketResponse, _: web.Request) -> None:
        await ws.send_bytes(_hello("intruder"))
        for seq in range(1, 10_000):
            findings = [{"severity": "critical", "kind": "xid",
                         "message": f"{v} GPU 0 fell off the bus", "gpu": 0} for v in victims]
            ranks = [{"rank": r, "steps": 5, "wall": 0.2, "compute": 0.01, "samples": 64}
                     for r in range(world)]
            await ws.send_bytes(encode(Sample(
                seq=seq, ts=time.time(), interval=0.2, gpus=[], host={},
                extra={"findings": findings,
                       "steps": {"jobs": [{"id": job, "world": world * 64,
                                           "ranks": ranks}]}})))
            await asyncio.sleep(0.2)
    return behave


async def test_hostile_agents_cannot_stop_a_judging_relay_or_make_it_page_about_others(
        unused_tcp_port_factory) -> None:
    """Four healthy simulated nodes and, beside them under one judging relay (with a
    topology), agents that send oversized and truncated frames, escapes in every name,
    a victim's name with a failed GPU, relay batches speaking for the victims, and
    critical findings and the fastest steps of the victims' job. The relay goes on
    judging once a second; every victim stays up under its own agent; nothing it holds,
    and nothing its /metrics pages on, names a victim."""
    from agent.sim.cluster import SimCluster
    from tuimon.model.judge_config import JudgeConfig

    sim = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    victims = [m.name for m in sim.members]
    world = len(victims) * 2
    hostile = [oversized, truncated, evil_names, _impersonator(victims[0]),
               _spoofer(sim.targets), _accuser(victims, sim.job_name, world)]
    topology = {m.name: sim.leaf_of(m.index) for m in sim.members}
    async with sim, fake_agents(hostile) as bad:
        config = RelayConfig(targets=[*sim.targets, *bad], listen="127.0.0.1:0",
                             interval=0.2, upstream_backoff=(0.1, 0.5),
                             judge=JudgeConfig(topology=topology))
        async with Relay(config) as relay:
            fan = relay.state.fanout
            judge = fan.judge
            await _until(lambda: judge.judged_at is not None, "a first judgement")
            await asyncio.sleep(12.0)  # longer than any rule's hold
            first = judge.judged_at
            await _until(lambda: (judge.judged_at or 0) > (first or 0), "judging goes on")
            for target, name in zip(sim.targets, victims):
                node = judge.cluster.nodes[target]
                assert node.status == "up" and node.name == name, (target, node.reason)
            about = [f for f in fan.findings if f.severity != "info"
                     and (f.node in victims or set(f.nodes) & set(victims))]
            assert about == [], about
            # Its own, kept, under its own name: text that names another node is put
            # under the name it came from, so a page's first words are never a victim's.
            blamed = [f for f in fan.findings if f.node == "intruder" and f.kind == "xid"]
            assert blamed and all(f.message.startswith("intruder: ") for f in blamed), blamed
            async with aiohttp.ClientSession() as http, \
                    http.get(f"http://127.0.0.1:{relay.port}/metrics") as r:
                metrics = await r.text()
    paged = [line for line in metrics.splitlines() if line.startswith("tuimon_finding{")
             and any(f'node="{v}"' in line for v in victims)]
    assert paged == [], paged
