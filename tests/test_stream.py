"""The agent's stream, /metrics and /healthz over real loopback sockets."""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.sim.fake_nvml import FakeGpu, FakeNvml
from tests.conftest import make_agent, receive, serve
from tuimon_core.protocol import Event, Hello, Sample, Subscribe, decode, encode


async def test_client_gets_hello_then_samples_at_the_interval(proc_root: Path,
                                                              fake_nvml: FakeNvml) -> None:
    agent = make_agent(proc_root, fake_nvml, interval=0.2)
    async with serve(agent) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(server.make_url("/v1/stream")) as ws:
        hello = await receive(ws)
        assert isinstance(hello, Hello)
        assert hello.node == "node-a" and len(hello.gpus) == 8
        assert hello.interval == 0.2 and hello.boot_id
        arrivals, seqs = [], []
        while len(seqs) < 6:
            msg = await receive(ws)
            if isinstance(msg, Sample):
                arrivals.append(time.monotonic())
                seqs.append(msg.seq)
                assert len(msg.gpus) == 8 and msg.host["mem_total"] > 0
        assert seqs == sorted(seqs) and len(set(seqs)) == 6
        gaps = [b - a for a, b in itertools.pairwise(arrivals)]
        # Steady cadence (the median gap is the interval); a loaded CI machine may delay
        # one delivery, never drift the schedule.
        assert 0.1 < sorted(gaps)[len(gaps) // 2] < 0.35, gaps
        assert max(gaps) < 1.0


async def test_subscribe_slows_the_stream_and_filters_families(proc_root: Path,
                                                               fake_nvml: FakeNvml) -> None:
    agent = make_agent(proc_root, fake_nvml, interval=0.1)
    async with serve(agent) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(server.make_url("/v1/stream")) as ws:
        assert isinstance(await receive(ws), Hello)
        await ws.send_bytes(encode(Subscribe(interval=0.3, families=["host"])))
        await asyncio.sleep(0.35)  # let frames queued before the subscription drain
        while True:
            msg = await receive(ws)
            if isinstance(msg, Sample) and msg.gpus is None:
                break
        seqs = [msg.seq]
        while len(seqs) < 6:
            msg = await receive(ws)
            assert isinstance(msg, Sample)
            assert msg.gpus is None and msg.host is not None
            seqs.append(msg.seq)
        # Families are applied when a frame is sent, the interval when it is queued: a
        # sample queued just before the subscription took effect may come through (a
        # loaded machine saw [1, 3, 6, 9]); every later one is a third.
        assert all(b - a == 3 for a, b in itertools.pairwise(seqs[2:])), seqs


async def test_xid_event_arrives_as_an_event_frame_within_a_second(
        proc_root: Path, fake_nvml: FakeNvml) -> None:
    agent = make_agent(proc_root, fake_nvml, interval=0.5)
    async with serve(agent) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(server.make_url("/v1/stream")) as ws:
        assert isinstance(await receive(ws), Hello)
        t0 = time.monotonic()
        fake_nvml.inject_xid(2, 79)
        while True:
            msg = await receive(ws, timeout=1.0)
            if isinstance(msg, Event):
                break
        assert time.monotonic() - t0 < 1.0
        assert (msg.kind, msg.gpu, msg.code, msg.severity) == ("xid", 2, 79, "critical")
        assert "fallen off the bus" in msg.message
        # The XID is counted in the GPU's values too, from the next read on (a read
        # already under way when it arrived may not have it yet).
        samples = []
        while len(samples) < 2:
            msg = await receive(ws)
            if isinstance(msg, Sample):
                samples.append(msg)
        assert samples[-1].gpus[2]["xid_total"] == 1 and samples[-1].gpus[2]["last_xid"] == 79


async def test_gpu_lost_mid_run_marks_it_failed_and_the_others_go_on(
        proc_root: Path, fake_nvml: FakeNvml) -> None:
    agent = make_agent(proc_root, fake_nvml, interval=0.1)
    async with serve(agent) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(server.make_url("/v1/stream")) as ws:
        await receive(ws)
        fake_nvml.gpus[4].lost = True
        seen_event = False
        while True:
            msg = await receive(ws)
            if isinstance(msg, Event) and msg.kind == "gpu_failed":
                seen_event = msg.gpu == 4
            if isinstance(msg, Sample) and msg.gpus[4].get("failed"):
                break
        assert msg.gpus[4]["failed"] == "GPU is lost"
        assert [g.get("temp") is not None for g in msg.gpus] == [True] * 4 + [False] + [True] * 3
        if not seen_event:
            # The event and the first failed sample come from the same read.
            assert agent.events_total.get("gpu_failed") == 1


async def test_inventory_change_resends_hello(proc_root: Path, fake_nvml: FakeNvml) -> None:
    agent = make_agent(proc_root, fake_nvml, interval=0.1)
    async with serve(agent) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(server.make_url("/v1/stream")) as ws:
        await receive(ws)
        fake_nvml.gpus.append(FakeGpu(8))
        said = {}
        while True:
            msg = await receive(ws)
            if isinstance(msg, Event):
                said[msg.kind] = msg.message
            if isinstance(msg, Hello):
                break
        # What changed, not only how many there are now.
        assert said["inventory_changed"] == "inventory changed: GPU 8 (00000000:98:00.0) new", \
            said
        assert len(msg.gpus) == 9
        sample = await receive(ws)
        assert isinstance(sample, Sample) and len(sample.gpus) == 9


async def test_fifty_clients_at_once(proc_root: Path, fake_nvml: FakeNvml) -> None:
    agent = make_agent(proc_root, fake_nvml, interval=0.2)
    async with serve(agent) as server, aiohttp.ClientSession() as s:
        sockets = [await s.ws_connect(server.make_url("/v1/stream")) for _ in range(50)]
        try:
            assert len(agent.hub.clients) == 50

            async def two_samples(ws: aiohttp.ClientWebSocketResponse) -> list[int]:
                assert isinstance(await receive(ws), Hello)
                seqs = []
                while len(seqs) < 2:
                    msg = await receive(ws)
                    if isinstance(msg, Sample):
                        seqs.append(msg.seq)
                return seqs

            results = await asyncio.gather(*(two_samples(ws) for ws in sockets))
            assert all(len(r) == 2 for r in results)
        finally:
            for ws in sockets:
                await ws.close()
        await asyncio.sleep(0.1)
        assert len(agent.hub.clients) == 0


def _raw_ws_connect(port: int, path: str = "/v1/stream") -> socket.socket:
    """A client that completes the WebSocket handshake and then never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert b" 101 " in head.split(b"\r\n")[0]
    return sock


async def test_stalled_client_loses_oldest_frames_not_agent_memory(proc_root: Path) -> None:
    # 64 GPUs make frames of ~30 KB, so the socket buffers fill within seconds.
    fake = FakeNvml([FakeGpu(i) for i in range(64)])
    agent = make_agent(proc_root, fake, interval=0.05, queue_frames=8)
    async with serve(agent) as server:
        stalled = await asyncio.to_thread(_raw_ws_connect, server.port)
        async with aiohttp.ClientSession() as s, \
                s.ws_connect(server.make_url("/v1/stream")) as healthy:
            deadline = time.monotonic() + 30
            while agent.hub.dropped_total < 20 and time.monotonic() < deadline:
                msg = await receive(healthy)  # the healthy client keeps up meanwhile
            assert agent.hub.dropped_total >= 20, "stalled client never dropped frames"
            stalled_client = max(agent.hub.clients, key=lambda c: c.dropped)
            assert len(stalled_client.queue) <= 8
            assert all(c.dropped == 0 for c in agent.hub.clients if c is not stalled_client)
            assert isinstance(msg, (Sample, Hello, Event))
        # Once it reads again it is told how many frames it lost.
        stalled.setblocking(False)
        buffer = b""
        dropped = []
        deadline = time.monotonic() + 10
        while not dropped and time.monotonic() < deadline:
            try:
                buffer += stalled.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.02)
                continue
            payloads, buffer = _split_ws_frames(buffer)
            for payload in payloads:
                message = decode(payload)
                if isinstance(message, Sample) and message.dropped:
                    dropped.append(message.dropped)
        stalled.close()
        assert dropped and dropped[0] >= 20


def _split_ws_frames(data: bytes) -> tuple[list[bytes], bytes]:
    """Unmasked server-to-client WebSocket frames: complete payloads, and the rest."""
    out = []
    while len(data) >= 2:
        length, offset = data[1] & 0x7F, 2
        if length == 126:
            if len(data) < 4:
                break
            length, offset = int.from_bytes(data[2:4], "big"), 4
        elif length == 127:
            if len(data) < 10:
                break
            length, offset = int.from_bytes(data[2:10], "big"), 10
        if len(data) < offset + length:
            break
        if data[0] & 0x0F == 0x2:
            out.append(data[offset:offset + length])
        data = data[offset + length:]
    return out, data


async def test_malformed_client_message_closes_that_stream_only(proc_root: Path,
                                                                fake_nvml: FakeNvml) -> None:
    agent = make_agent(proc_root, fake_nvml, interval=0.1)
    async with serve(agent) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(server.make_url("/v1/stream")) as good, \
            s.ws_connect(server.make_url("/v1/stream")) as bad:
        await receive(bad)
        await bad.send_bytes(b"\xc1 definitely not msgpack")
        while True:
            msg = await asyncio.wait_for(bad.receive(), 5)
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                break
        assert bad.close_code == aiohttp.WSCloseCode.UNSUPPORTED_DATA
        assert "msgpack" in (msg.extra or "")
        await receive(good)
        assert isinstance(await receive(good), (Sample, Event))
        # A text frame is refused the same way.
        async with s.ws_connect(server.make_url("/v1/stream")) as texty:
            await receive(texty)
            await texty.send_str("hello?")
            while not texty.closed:
                await asyncio.wait_for(texty.receive(), 5)
            assert texty.close_code == aiohttp.WSCloseCode.UNSUPPORTED_DATA


async def test_metrics_parse_with_prometheus_own_parser(proc_root: Path,
                                                        fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[6].unsupported.add("nvmlDeviceGetPowerUsage")
    agent = make_agent(proc_root, fake_nvml, interval=0.1)
    async with serve(agent) as server, aiohttp.ClientSession() as s:
        await asyncio.sleep(0.35)
        async with s.get(server.make_url("/metrics")) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    util = families["tuimon_gpu_utilization_ratio"]
    assert util.type == "gauge"
    by_gpu = {s.labels["gpu"]: s for s in util.samples}
    assert len(by_gpu) == 8
    assert by_gpu["3"].labels == {"node": "node-a", "gpu": "3", "uuid": fake_nvml.gpus[3].uuid}
    assert by_gpu["3"].value == 0.9
    power = {s.labels["gpu"]: s.value for s in families["tuimon_gpu_power_watts"].samples}
    assert power["0"] == 600.0
    assert "6" not in power  # unreadable is absent, not 0
    energy = families["tuimon_gpu_energy_joules"]
    assert energy.type == "counter"
    assert energy.samples[0].name == "tuimon_gpu_energy_joules_total"
    assert families["tuimon_host_memory_total_bytes"].samples[0].value == 16384000 * 1024
    assert families["tuimon_agent_samples"].samples[0].value >= 2


async def test_healthz_reports_state(proc_root: Path) -> None:
    agent = make_agent(proc_root, None, interval=0.1)
    async with serve(agent) as server, aiohttp.ClientSession() as s:
        await asyncio.sleep(0.25)
        async with s.get(server.make_url("/healthz")) as resp:
            body = await resp.json()
    assert body["status"] == "ok" and body["gpus"] == 0
    assert "NVML Shared Library Not Found" in body["gpu_status"]


async def test_collector_failure_and_recovery_are_events(proc_root: Path,
                                                         fake_nvml: FakeNvml) -> None:
    agent = make_agent(proc_root, fake_nvml, interval=0.1)
    async with serve(agent) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(server.make_url("/v1/stream")) as ws:
        await receive(ws)
        saved = {}
        for name in ("stat", "loadavg", "meminfo", "uptime"):
            path = proc_root / "proc" / name
            saved[name] = path.read_text()
            path.unlink()
        while True:
            msg = await receive(ws)
            if isinstance(msg, Event) and msg.kind == "collector_failed":
                break
        assert msg.source == "host" and "missing" in msg.message
        for name, text in saved.items():
            (proc_root / "proc" / name).write_text(text)
        while True:
            msg = await receive(ws)
            if isinstance(msg, Event) and msg.kind == "collector_recovered":
                break
        assert msg.source == "host"


@pytest.mark.parametrize("interval", [0.05])
async def test_cadence_holds_when_reads_are_slow(proc_root: Path, interval: float) -> None:
    slow = FakeNvml(2)
    real_refresh = slow.refresh

    def slow_refresh(gpu):  # type: ignore[no-untyped-def]
        time.sleep(0.0005)  # a sluggish driver: ~20 ms a sample in all
        real_refresh(gpu)

    slow.refresh = slow_refresh  # type: ignore[method-assign]
    agent = make_agent(proc_root, slow, interval=interval)
    await agent.start()
    try:
        await asyncio.sleep(1.0)
    finally:
        await agent.stop()
    # Monotonic deadlines: about 1 s / interval samples, no drift from the read time.
    assert 12 <= agent.stats.samples <= 22, agent.stats.samples


@pytest.mark.parametrize("code,severity", [(79, "critical"), (140, "critical"),
                                           (121, "warning"), (13, "warning")])
async def test_an_xid_event_and_the_nodes_finding_say_the_same_severity(
        proc_root: Path, fake_nvml: FakeNvml, code: int, severity: str) -> None:
    """One list of critical XIDs: the event the agent sends and the finding its rules
    hold name the same XID alike (121 and 140 differed: a critical event, a warning
    finding)."""
    from tuimon_core.findings_family import findings_from_wire

    agent = make_agent(proc_root, fake_nvml, interval=0.2)
    async with serve(agent) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(server.make_url("/v1/stream")) as ws:
        assert isinstance(await receive(ws), Hello)
        fake_nvml.inject_xid(1, code)
        event, finding = None, None
        while event is None or finding is None:
            msg = await receive(ws, timeout=5.0)
            if isinstance(msg, Event) and msg.kind == "xid":
                event = msg
            elif isinstance(msg, Sample) and msg.extra.get("findings"):
                found = [f for f in findings_from_wire(msg.extra["findings"], "n")
                         if f.kind == "xid"]
                finding = found[0] if found else None
    assert event.severity == finding.severity == severity, (event, finding)


def test_an_inventory_change_says_which_link_port_or_mount_moved() -> None:
    """An NVLink down, a port gone, a port's rate fallen, a file system unmounted, the
    GPUDirect module unloaded: each named with what it was and is; a GPU that leaves is
    named by its bus id, not as the last index (NVML's indexes close up); one line however
    much changed."""
    import dataclasses

    from agent.inventory_change import MAX_SAID, inventory_change
    from tuimon_core.protocol import GpuInfo

    gpus = [GpuInfo(i, f"GPU-{i}", "NVIDIA H100", 80 << 30, 700.0, f"0000:{i:02x}:00.0",
                    1.98e9, 2.6e9, nvlinks=18, nvlinks_total=18) for i in range(4)]
    ports = [{"id": "mlx5_0:1", "up": 1, "rate_text": "400 Gb/sec (4X NDR)"},
             {"id": "mlx5_1:1", "up": 1, "rate_text": "400 Gb/sec (4X NDR)"}]
    fs = [{"id": "/lustre/scratch", "fstype": "lustre", "source": "mgs@o2ib:/scratch"}]
    before = Hello("gpu001", "1", None, 1.0, 0.0, gpus,
                   extra={"ports": ports, "filesystems": fs, "gpudirect": "nvidia_peermem"})
    after = Hello("gpu001", "1", None, 1.0, 0.0, [dataclasses.replace(gpus[0], nvlinks=16)],
                  extra={"ports": [{**ports[0], "rate_text": "200 Gb/sec (4X HDR)"}],
                         "filesystems": []})
    assert inventory_change(before, after) == (
        "GPUDirect nvidia_peermem -> none; GPU 1 (0000:01:00.0) gone; GPU 2 (0000:02:00.0) "
        "gone; GPU 3 (0000:03:00.0) gone; GPU 0 (0000:00:00.0) NVLinks 18 -> 16; "
        "port mlx5_1:1 gone; and 2 more")
    # GPU 1 leaves NVML: 2 and 3 become 1 and 2; the one that went is named.
    left = Hello("gpu001", "1", None, 1.0, 0.0,
                 [gpus[0]] + [dataclasses.replace(g, index=g.index - 1) for g in gpus[2:]],
                 extra=before.extra)
    assert inventory_change(before, left) == (
        "GPU 1 (0000:01:00.0) gone; GPU 1 (0000:02:00.0) index 2 -> 1; "
        "GPU 2 (0000:03:00.0) index 3 -> 2")
    many = Hello("gpu001", "1", None, 1.0, 0.0, gpus,
                 extra={"ports": [{"id": f"p{i}"} for i in range(20)], "filesystems": fs,
                        "gpudirect": "nvidia_peermem"})
    assert inventory_change(before, many).endswith(f"and {20 + 2 - MAX_SAID} more")


async def test_an_unwatched_agent_judges_but_makes_no_overview_until_a_client_comes(
        proc_root: Path, fake_nvml: FakeNvml) -> None:
    """Scraped by Prometheus alone, the agent still judges every sample (its findings are
    on /metrics) but builds no overview nobody reads; a stream client that connects gets
    the overview and the findings from its first sample on."""
    agent = make_agent(proc_root, fake_nvml, interval=0.1)
    async with serve(agent) as server, aiohttp.ClientSession() as s:
        while agent.stats.samples < 3:
            await asyncio.sleep(0.05)
        assert agent.latest is not None
        assert "findings" in agent.latest.extra and "overview" not in agent.latest.extra
        async with s.ws_connect(server.make_url("/v1/stream")) as ws:
            assert isinstance(await receive(ws), Hello)
            sample = await receive(ws)
            while not isinstance(sample, Sample):
                sample = await receive(ws)
            assert "overview" in sample.extra and "findings" in sample.extra
            assert "overview" in agent.latest.extra


async def test_a_slowed_stream_has_the_overview_built_only_for_the_samples_it_takes(
        proc_root: Path, fake_nvml: FakeNvml) -> None:
    """A client that asked for every third sample reads the overview in each it gets;
    the two samples between, which no client takes, are judged without one."""
    agent = make_agent(proc_root, fake_nvml, interval=0.1)
    built: dict[int, bool] = {}  # each sample the loop made: whether it has an overview
    sample_once = agent.sample_once

    async def seen(**kwargs: Any) -> Sample:
        sample = await sample_once(**kwargs)
        built[sample.seq] = "overview" in sample.extra
        return sample

    agent.sample_once = seen  # type: ignore[method-assign]
    async with serve(agent) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(server.make_url("/v1/stream")) as ws:
        assert isinstance(await receive(ws), Hello)
        await ws.send_bytes(encode(Subscribe(interval=0.3)))
        got: list[Sample] = []
        while len(got) < 5:
            msg = await receive(ws)
            if isinstance(msg, Sample) and msg.seq % 3 == 0:
                got.append(msg)
        assert all("overview" in m.extra and "findings" in m.extra for m in got)
        last = got[-1].seq
        between = [built[n] for n in range(last - 8, last) if n % 3 and n in built]
        assert len(between) >= 4 and not any(between), built
        assert "findings" in agent.latest.extra  # type: ignore[union-attr]


async def test_the_hello_goes_first_though_a_sample_comes_during_the_handshake(
        proc_root: Path, fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client is counted from its request on; a sample published while its WebSocket
    handshake is under way must not reach it before the hello it is read by."""
    from aiohttp import web

    agent = make_agent(proc_root, fake_nvml, interval=60.0)
    handshake = web.WebSocketResponse.prepare

    async def sample_during_handshake(self: web.WebSocketResponse, request: web.Request):  # type: ignore[no-untyped-def]
        await agent.sample_once()
        return await handshake(self, request)

    monkeypatch.setattr(web.WebSocketResponse, "prepare", sample_during_handshake)
    async with serve(agent) as server, aiohttp.ClientSession() as s, \
            s.ws_connect(server.make_url("/v1/stream")) as ws:
        assert isinstance(await receive(ws), Hello)
        assert isinstance(await receive(ws), Sample)
