"""The relay against simulated nodes: fan-in, fan-out, subscriptions, relays of relays,
security, and the SLO ledger across kill -9."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.sim.cluster import SimCluster
from tests.conftest import run_tuimon
from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Diagnosis
from tuimon.model.efficiency import BEST_RISE, EfficiencyView
from tuimon.model.job_report import job_report
from tuimon.model.slo import LedgerBurn, Slo
from tuimon.model.step_credit import merge_steps
from tuimon.model.storage import StorageView
from tuimon.relay import Relay, RelayConfig
from tuimon.relay.fanout import FanOut
from tuimon.relay.ledger import SCHEMA_VERSION, Ledger, LedgerError
from tuimon.sources.agent_stream import StreamOptions, watching
from tuimon.status import format_text, report
from tuimon.text.job_text import job_text
from tuimon_core.findings import Finding
from tuimon_core.protocol import Batch, Hello, Sample, Subscribe, decode, encode
from tuimon_core.serving.security import ConfigError

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "relay-token-0123456789abcdef"


async def until(check: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.05)


def relay_config(targets: list[str], **kw: object) -> RelayConfig:
    kw.setdefault("listen", "127.0.0.1:0")
    kw.setdefault("interval", 0.2)
    kw.setdefault("upstream_backoff", (0.1, 0.5))
    return RelayConfig(targets=targets, **kw)  # type: ignore[arg-type]


def up(cluster: ClusterState) -> set[str]:
    return {n.name for n in cluster.nodes.values() if n.status == "up" and n.sample}


async def raw_batches(url: str, subscribe: Subscribe | None, count: int,
                      headers: dict[str, str] | None = None) -> list[tuple[float, Batch]]:
    """(arrival time, batch) as a plain WebSocket client sees them."""
    out = []
    async with aiohttp.ClientSession() as session, session.ws_connect(
            url, headers=headers or {}, max_msg_size=16 << 20) as ws:
        if subscribe is not None:
            await ws.send_bytes(encode(subscribe))
        while len(out) < count:
            msg = await asyncio.wait_for(ws.receive(), 10)
            assert msg.type == aiohttp.WSMsgType.BINARY, msg
            batch = decode(msg.data, max_bytes=16 << 20)
            assert isinstance(batch, Batch)
            out.append((time.monotonic(), batch))
    return out


async def test_fan_in_and_fan_out(unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=6, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    async with sim, Relay(relay_config(sim.targets, name="login1")) as relay:
        assert relay.port
        viewers = [ClusterState(f"viewer {i}") for i in range(3)]
        async with watching([], viewers[0], relays=[f"127.0.0.1:{relay.port}"]), \
                watching([], viewers[1], relays=[f"127.0.0.1:{relay.port}"]), \
                watching([], viewers[2], relays=[f"127.0.0.1:{relay.port}"]):
            names = {m.name for m in sim.members}
            for v in viewers:
                await until(lambda v=v: up(v) == names, what="every node up in every viewer")
            # The relay's own address is not a node; nodes are keyed by their targets.
            assert set(viewers[0].nodes) == set(sim.targets)
            # The samples are the agents' own: same GPU count and fresh sequence numbers.
            node = viewers[1].nodes[sim.targets[2]]
            assert node.gpu_count == 2 and len(node.sample.gpus) == 2
            seq = node.sample.seq
            await until(lambda: node.sample.seq > seq, what="newer samples")
            # One relay connection per node, however many viewers.
            assert len(relay.state.fanout.viewers) == 3
            assert relay.state.fanout.counts()["up"] == 6


async def test_a_snapshot_split_over_several_batches_reaches_the_viewer_whole(
        unused_tcp_port_factory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past 1 MiB owed (about 110 full nodes: a viewer joining a 256-node relay) the relay
    splits what it sends; each part must declare the nodes whose frames it carries, or
    the viewer refuses them as undeclared, for good (it saw 0 nodes up)."""
    import tuimon.relay.viewer_feed as viewer_feed

    monkeypatch.setattr(viewer_feed, "BATCH_BYTES", 4000)  # a frame or two a batch
    sim = SimCluster(nodes=12, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    async with sim, Relay(relay_config(sim.targets, interval=0.5)) as relay:
        url = f"http://127.0.0.1:{relay.port}/v1/stream"
        await until(lambda: relay.state.fanout.counts()["up"] == 12, what="relay sees all")
        batches = await raw_batches(url, None, 3)
        assert len(batches) >= 3  # split
        for _, batch in batches:
            declared = {source for source, _, _ in batch.sources}
            assert {source for source, _ in batch.frames} <= declared
        viewer = ClusterState("viewer")
        async with watching([], viewer, relays=[f"127.0.0.1:{relay.port}"]):
            names = {m.name for m in sim.members}
            await until(lambda: up(viewer) == names, what="every node up in the viewer")


async def test_subscriptions_nodes_families_and_interval(unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    async with sim, Relay(relay_config(sim.targets)) as relay:
        url = f"http://127.0.0.1:{relay.port}/v1/stream"
        await until(lambda: relay.state.fanout.counts()["up"] == 4)
        wanted = "sim-node[001,003]"
        sub = Subscribe(interval=1.0, families=["gpu", "steps"], nodes=[wanted])
        batches = await raw_batches(url, sub, 5)
        sources: set[str] = set()
        for _, batch in batches:
            for source, data in batch.frames:
                sources.add(source)
                message = decode(data)
                if isinstance(message, Sample):
                    assert message.gpus is not None and len(message.gpus) == 2
                    assert message.host is None and "fabric" not in message.extra
        assert sources == {sim.targets[1], sim.targets[3]}, sources
        # Batches after the first come at the subscribed interval, not the relay's 0.2 s.
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(batches[1:])]
        assert min(gaps) >= 0.8, gaps
        # With no subscription, everything at the relay's interval.
        everything = await raw_batches(url, None, 6)
        all_sources = {s for _, b in everything for s, _ in b.frames}
        assert all_sources == set(sim.targets)
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(everything[1:])]
        assert statistics.median(gaps) < 0.5, gaps


async def test_a_slower_viewer_loses_no_training_time(unused_tcp_port_factory) -> None:
    """Coalesced samples carry the sum of the steps they replace."""
    sim = SimCluster(nodes=2, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    async with sim, Relay(relay_config(sim.targets)) as relay:
        url = f"http://127.0.0.1:{relay.port}/v1/stream"
        await until(lambda: relay.state.fanout.counts()["up"] == 2)
        fast = asyncio.create_task(raw_batches(url, Subscribe(families=["steps"]), 16))
        slow = asyncio.create_task(raw_batches(url, Subscribe(interval=2.0,
                                                              families=["steps"]), 3))
        fast_b, slow_b = await asyncio.gather(fast, slow)

    def wall(batches: list[tuple[float, Batch]], start: float, end: float) -> float:
        total = 0.0
        for t, b in batches:
            if not start < t <= end:
                continue
            for _, data in b.frames:
                m = decode(data)
                if isinstance(m, Sample):
                    for job in (m.extra.get("steps") or {}).get("jobs", []):
                        total += sum(r["wall"] for r in job["ranks"])
        return total
    # Over the same span, both viewers were told of the same training time (within one
    # sample at either end).
    start, end = slow_b[1][0], slow_b[2][0]
    slow_wall = wall(slow_b, start, end)
    fast_wall = wall(fast_b, start - 0.1, end - 0.1)
    assert slow_wall > 0
    assert abs(slow_wall - fast_wall) <= 0.35 * slow_wall, (slow_wall, fast_wall)


def test_merge_steps_adds_per_rank() -> None:
    a = {"jobs": [{"id": "j", "world": 2, "ranks": [{"rank": 0, "steps": 1, "wall": 1.0,
                                                      "compute": 0.9, "samples": 8}]}],
         "received": 5, "rejected": 0}
    b = {"jobs": [{"id": "j", "world": 2, "ranks": [{"rank": 0, "steps": 2, "wall": 2.0,
                                                      "compute": 1.5, "samples": 16},
                                                     {"rank": 1, "steps": 1, "wall": 1.0,
                                                      "compute": 1.0, "samples": 8}]}],
         "received": 8, "rejected": 1}
    merged = merge_steps(a, b)
    ranks = {r["rank"]: r for r in merged["jobs"][0]["ranks"]}
    assert ranks[0] == {"rank": 0, "steps": 3, "wall": 3.0, "compute": 2.4, "samples": 24}
    assert ranks[1]["steps"] == 1 and merged["received"] == 8 and merged["rejected"] == 1


async def test_relay_of_relays_and_a_lost_node(unused_tcp_port_factory) -> None:
    sim_a = SimCluster(nodes=3, gpus=1, base_port=unused_tcp_port_factory(), interval=0.25,
                       scenario="healthy", name_prefix="a-node")
    sim_b = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.25,
                       scenario="healthy", name_prefix="b-node")
    async with sim_a, sim_b, Relay(relay_config(sim_a.targets, name="r1")) as r1, \
            Relay(relay_config(sim_b.targets, name="r2")) as r2, \
            Relay(relay_config([], relays=[f"127.0.0.1:{r1.port}", f"127.0.0.1:{r2.port}"],
                               name="top")) as top:
        viewer = ClusterState("through two levels")
        async with watching([], viewer, relays=[f"127.0.0.1:{top.port}"]):
            names = {m.name for m in sim_a.members + sim_b.members}
            await until(lambda: up(viewer) == names, what="all five nodes through two relays")
            assert set(top.state.fanout.sources) == set(sim_a.targets + sim_b.targets)
            await sim_a.stop_node(1)
            lost = viewer.nodes[sim_a.targets[1]]
            await until(lambda: lost.status in ("stale", "down"), what="lost node stale")
            assert "cannot connect" in (lost.reason or "") or "closed" in (lost.reason or "")
            assert up(viewer) == names - {sim_a.members[1].name}
            await sim_a.start_node(1)
            await until(lambda: lost.status == "up", what="node back through two relays")

    # The relay a viewer watches going away is one fault, the relay's: its nodes are
    # unknown (nothing says they are down), one event says so, one finding names it;
    # when it is back, so are they, with one event.
    sim = SimCluster(nodes=3, gpus=1, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    port = unused_tcp_port_factory()
    async with sim:
        r1 = Relay(relay_config(sim.targets, name="r1", listen=f"127.0.0.1:{port}"))
        await r1.start()
        viewer2 = ClusterState("v2")
        relay = f"127.0.0.1:{port}"
        async with watching([], viewer2, relays=[relay],
                            options=StreamOptions(min_backoff=0.2, max_backoff=0.5)):
            await until(lambda: len(up(viewer2)) == 3)
            events_before = len(viewer2.events)
            await r1.stop()
            await until(lambda: all(n.status == "unknown" for n in viewer2.nodes.values()),
                        what="nodes unknown when their relay is lost")
            await asyncio.sleep(1.0)  # and they stay so: not stale, then down
            assert viewer2.counts()["unknown"] == 3 and viewer2.counts()["down"] == 0
            new = list(viewer2.events)[:len(viewer2.events) - events_before]
            assert [e.kind for e in new] == ["relay_lost"], [e.message for e in new]
            assert relay in new[0].message and "3 nodes unknown" in new[0].message
            findings = Diagnosis().update(viewer2, EfficiencyView(), StorageView())
            # (and what the relay judged before it went: kept, here that it has no
            # topology, information)
            assert [f.kind for f in findings if f.severity != "info"] == ["relay_lost"], \
                findings
            assert findings[0].target == relay
            r1 = Relay(relay_config(sim.targets, name="r1", listen=f"127.0.0.1:{port}"))
            await r1.start()
            try:
                await until(lambda: len(up(viewer2)) == 3, what="nodes back with the relay")
                assert viewer2.events[0].kind in ("relay_back", "node_back") and \
                    any(e.kind == "relay_back" for e in list(viewer2.events)[:5])
                assert not viewer2.lost_relays
            finally:
                await r1.stop()


async def test_viewers_looking_closely_at_more_than_an_upstream_takes_never_lose_it(
        unused_tcp_port_factory) -> None:
    """Two viewers each opening 150 nodes' detail at a top relay want 300 together; the
    leaf takes 256 in one subscription and closes on more. The top relay asks for a fair
    share of each viewer's, so its upstream stays up and no node goes stale."""
    sim = SimCluster(nodes=300, gpus=1, base_port=unused_tcp_port_factory(), interval=1.0,
                     scenario="healthy")
    async with sim, Relay(relay_config(sim.targets, name="leaf")) as leaf, \
            Relay(relay_config([], relays=[f"127.0.0.1:{leaf.port}"], name="top")) as top, \
            aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{top.port}/v1/stream"
        viewers = []
        for v in range(2):
            ws = await session.ws_connect(url, max_msg_size=16 << 20)
            detail = sim.targets[v * 150:(v + 1) * 150]
            await ws.send_bytes(encode(Subscribe(detail=detail, overview_form=2)))
            viewers.append(ws)
        watcher = ClusterState("third viewer")
        async with watching([], watcher, relays=[f"127.0.0.1:{top.port}"]):
            names = {m.name for m in sim.members}
            await until(lambda: up(watcher) == names, timeout=20,
                        what="every node through two relays")
            await until(lambda: any(len(f.detail) > 200 for f in leaf.state.fanout.viewers),
                        what="the top relay's detail at the leaf")
            seen = {n.target: n.sample.seq for n in watcher.nodes.values() if n.sample}
            await asyncio.sleep(2.5)
            assert all(n.status == "up" for n in watcher.nodes.values())
            assert all(watcher.nodes[t].sample.seq > seq for t, seq in seen.items())
        asked = [f.detail for f in leaf.state.fanout.viewers]
        assert asked and all(len(d) <= 256 for d in asked)
        # Each viewer kept its share: 128 of its 150.
        wide = max(asked, key=len)
        for v in range(2):
            assert len(wide & set(sim.targets[v * 150:(v + 1) * 150])) == 128
        for ws in viewers:
            await ws.close()


async def test_two_relays_claiming_one_node_is_a_finding_naming_both() -> None:
    """A leaf that claims another leaf's node first used to win silently (the real
    leaf's frames dropped with a log line): the viewer now says so, naming both."""
    from tests.test_hostile import fake_agents
    from tuimon.model.diagnosis import Diagnosis
    from tuimon.model.storage import StorageView

    def leaf(name: str) -> Any:
        async def behave(ws: Any, _: Any) -> None:
            while True:
                hello = Hello(node="gpu001", agent_version=name, boot_id=None, interval=0.2,
                              ts=time.time())
                await ws.send_bytes(encode(Batch(ts=time.time(), frames=[
                    ("gpu001:9477", encode(hello))], sources=[("gpu001:9477", "up", None)])))
                await asyncio.sleep(0.2)
        return behave

    async with fake_agents([leaf("first")]) as (first,), \
            fake_agents([leaf("second")]) as (second,):
        cluster = ClusterState()
        async with watching([], cluster, relays=[first]):
            await until(lambda: "gpu001:9477" in cluster.nodes, what="the first claim")
            async with watching([], cluster, relays=[second]):
                await until(lambda: bool(cluster.relay_problems.get(second)),
                            what="the second claim refused")
        text = next(iter(cluster.relay_problems[second].values()))
        assert first in text and second in text and "gpu001:9477" in text
        eff = EfficiencyView()
        eff.update(cluster)
        findings = Diagnosis().update(cluster, eff, StorageView())
        assert any(f.kind == "relay_refused" and first in f.message and second in f.message
                   for f in findings)


async def test_token_and_bind_rules(unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=1, gpus=1, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy", token=TOKEN)
    with pytest.raises(ConfigError, match="without a token"):
        Relay(relay_config(sim.targets, listen="0.0.0.0:0"))
    async with sim, Relay(relay_config(sim.targets, token=TOKEN,
                                       upstream_token=TOKEN)) as relay:
        url = f"http://127.0.0.1:{relay.port}/v1/stream"
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as err:
                await session.ws_connect(url)
            assert err.value.status == 401
            async with session.get(f"http://127.0.0.1:{relay.port}/metrics") as resp:
                assert resp.status == 401
        viewer = ClusterState()
        async with watching([], viewer, StreamOptions(token=TOKEN),
                            relays=[f"127.0.0.1:{relay.port}"]):
            await until(lambda: len(up(viewer)) == 1, what="node through an authenticated relay")
        # A relay without the agents' token shows why each node is missing.
        async with Relay(relay_config(sim.targets)) as relay2:
            viewer = ClusterState()
            async with watching([], viewer, relays=[f"127.0.0.1:{relay2.port}"]):
                target = sim.targets[0]
                await until(lambda: "401" in (getattr(viewer.nodes.get(target), "reason", "")
                                              or ""), what="401 passed on")


async def test_a_bad_viewer_is_closed_and_others_go_on(unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    async with sim, Relay(relay_config(sim.targets)) as relay:
        url = f"http://127.0.0.1:{relay.port}/v1/stream"
        good = ClusterState()
        async with watching([], good, relays=[f"127.0.0.1:{relay.port}"]), \
                aiohttp.ClientSession() as session:
            await until(lambda: len(up(good)) == 2)
            async with session.ws_connect(url) as ws:
                await ws.send_bytes(b"\xc1 not msgpack")
                msg = await asyncio.wait_for(ws.receive(), 5)
                while msg.type == aiohttp.WSMsgType.BINARY:
                    msg = await asyncio.wait_for(ws.receive(), 5)
                assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1003
                assert "msgpack" in msg.extra
            async with session.ws_connect(url) as ws:
                await ws.send_bytes(encode(Subscribe(nodes=["bad[list"])))
                msg = await asyncio.wait_for(ws.receive(), 5)
                while msg.type == aiohttp.WSMsgType.BINARY:
                    msg = await asyncio.wait_for(ws.receive(), 5)
                assert msg.type == aiohttp.WSMsgType.CLOSE and "host list" in msg.extra
            seq = good.nodes[sim.targets[0]].sample.seq
            await until(lambda: good.nodes[sim.targets[0]].sample.seq > seq)


# -- the ledger --------------------------------------------------------------------------


def test_ledger_sums_minutes_and_reports_windows(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    ledger = Ledger(tmp_path / "l.db", clock=lambda: now)
    for i in range(120):  # two hours, 10 % of the time lost
        ledger.add("job", now - 7200 + 60 * i, 60.0, 54.0)
    assert ledger.flush()
    s = ledger.summary(now)["job"]
    assert s["consumed_h"] == pytest.approx(0.2)
    assert s["observed_h"] == pytest.approx(2.0)
    assert s["error_ratio"]["1h"] == pytest.approx(0.1)
    assert s["error_ratio"]["5m"] == pytest.approx(0.1)
    assert s["since"] == (now - 7200) // 60 * 60
    # Buckets add up across flushes, in the same minute.
    ledger.add("job", now - 30, 10.0, 10.0)
    ledger.flush()
    ledger.add("job", now - 30, 10.0, 0.0)
    assert ledger.buckets("job")[-1][1:] == (70.0, 64.0)  # not yet written
    assert ledger.summary(now)["job"]["observed_h"] == pytest.approx((7200 + 20) / 3600)
    ledger.close()
    with Ledger(tmp_path / "l.db") as again:
        assert again.buckets("job")[-1][1:] == (80.0, 64.0)


def test_a_ledger_of_the_first_layout_is_brought_up_to_date_losing_no_minute(
        tmp_path: Path) -> None:
    """A ledger written before the waits were kept (layout 0: buckets and totals only)
    is opened in place: every minute counts as before, its loss as `other`, and the
    minutes from now on say what they waited on. A newer relay's file is refused."""
    path = tmp_path / "l.db"
    now = 1_800_000_000.0
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE buckets (job TEXT NOT NULL, minute INTEGER NOT NULL, "
        "total_s REAL NOT NULL, effective_s REAL NOT NULL, PRIMARY KEY (job, minute)) "
        "WITHOUT ROWID;"
        "CREATE TABLE totals (source TEXT NOT NULL, job TEXT NOT NULL, since REAL NOT NULL,"
        " wall REAL NOT NULL, compute REAL NOT NULL, at REAL NOT NULL, "
        "PRIMARY KEY (source, job)) WITHOUT ROWID;")
    old.executemany("INSERT INTO buckets VALUES (?, ?, ?, ?)",
                    [("job", int(now // 60) - 120 + i, 60.0, 54.0) for i in range(60)])
    old.commit()
    old.close()
    with Ledger(path, clock=lambda: now) as ledger:
        ledger.add("job", now - 30, 60.0, 30.0, {"comm": 20.0, "data": 6.0, "x-new": 1.0})
        s = ledger.summary(now)["job"]
        assert s["observed_h"] == pytest.approx(61 / 60)
        assert s["spent_h"] == pytest.approx({"comm": 20 / 3600, "data": 6 / 3600,
                                              "other": (360 + 4) / 3600})
        assert sum(s["spent_h"].values()) == pytest.approx(s["consumed_h"])
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.execute("PRAGMA user_version=7")
    db.close()
    with pytest.raises(LedgerError, match="newer relay"):
        Ledger(path)
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    db.close()
    Ledger(path).close()  # the refusal released the file's lock


def test_the_ledger_keeps_the_jobs_best_ten_minutes_across_restarts(tmp_path: Path) -> None:
    """Per-GPU throughput = samples / rank-seconds over ten consecutive whole minutes: a
    faster stretch of nine minutes, or one broken by a silent minute, or the minute still
    being counted, is not a best."""
    path = tmp_path / "l.db"
    now = [1_800_000_000.0]
    start = now[0] - 3600

    def minute(i: int, per_gpu: float) -> None:  # 8 ranks, 60 s each
        ledger.add("job", start + 60 * i + 30, 60.0, 54.0, samples=per_gpu * 480,
                   rank_s=480.0)

    ledger = Ledger(path, clock=lambda: now[0])
    for i in range(19):
        minute(i, 2.0)
    for i in range(20, 29):
        minute(i, 9.0)  # nine minutes only, silent ones on either side
    for i in range(30, 40):
        minute(i, 3.0)  # ten whole minutes, after a silent one
    for i in range(40, 59):
        minute(i, 2.5)
    ledger.flush()
    now[0] = start + 60 * 59 + 30
    minute(59, 50.0)  # the minute still being counted: 50..59 would make 7.25
    ledger.flush()
    assert ledger.summary()["job"]["best_per_gpu"] == pytest.approx(3.0)
    assert ledger.summary()["job"]["best_at"] == start + 60 * 40
    # A job of ten minutes exactly: its best once its last minute is whole, though it
    # sends nothing more. A rank claiming a thousand samples a microsecond is no best.
    for i in range(50, 60):
        ledger.add("short", start + 60 * i + 30, 60.0, 54.0, samples=4.0 * 480, rank_s=480.0)
        ledger.add("evil", start + 60 * i + 30, 60.0, 54.0, samples=1e15, rank_s=1e-300)
    ledger.flush()
    assert "best_per_gpu" not in ledger.summary()["short"]
    now[0] = start + 60 * 60 + 30
    ledger.flush()
    summary = ledger.summary()
    assert summary["short"]["best_per_gpu"] == pytest.approx(4.0)
    # Minute 59 is whole now: its window makes 7.25, but a best rises at most BEST_RISE
    # times what it was a window before (3.0): a minute that claims twenty times the
    # job's pace cannot make the job read half its speed for the rest of the run.
    assert summary["job"]["best_per_gpu"] == pytest.approx(3.0 * BEST_RISE)
    assert "best_per_gpu" not in summary["evil"]
    decoded = decode(encode(Batch(ts=now[0], budget=summary)))  # every budget on the wire
    assert isinstance(decoded, Batch) and decoded.budget is not None
    assert set(decoded.budget) == {"job", "short", "evil"}
    ledger.close()
    with Ledger(path, clock=lambda: now[0]) as again:  # the file's minutes, the same rule
        assert again.summary()["job"]["best_per_gpu"] == pytest.approx(3.0 * BEST_RISE)
        assert again.summary()["short"]["best_per_gpu"] == pytest.approx(4.0)


def test_ledger_prunes_after_retention(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    ledger = Ledger(tmp_path / "l.db", keep_days=30, clock=lambda: now)
    ledger.add("job", now - 31 * 86400, 60.0, 60.0)
    ledger.add("job", now - 29 * 86400, 60.0, 60.0)
    ledger.flush()
    assert ledger.prune() == 1
    assert len(ledger.buckets("job")) == 1


def test_ledger_full_disk_is_a_clear_error_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    ledger = Ledger(path, max_bytes=64 * 1024)  # SQLITE_FULL, as a full disk gives
    now = 1_800_000_000.0
    for i in range(5000):
        ledger.add(f"job-{i % 50}", now + 60 * (i // 50), 60.0, 50.0)
    assert not ledger.flush()
    assert ledger.error and str(path) in ledger.error and "full" in ledger.error
    summary = ledger.summary(now + 100 * 60)
    assert summary["job-0"]["error"] == ledger.error
    # What could not be written is still counted, and the file is sound.
    assert summary["job-0"]["observed_h"] == pytest.approx(100 / 60)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    ledger._db.execute("PRAGMA max_page_count=100000")  # space again
    assert ledger.flush() and ledger.error is None
    assert sum(t for _, t, _ in ledger.buckets("job-7")) == pytest.approx(100 * 60.0)


def test_viewer_shows_the_ledger_budget() -> None:
    slo = Slo(0.90, 720)
    burn = LedgerBurn(slo, {"consumed_h": 60.0, "error_ratio": {"5m": 0.5, "30m": 0.5,
                                                                "1h": 0.5, "6h": 0.5}})
    assert slo.remaining_hours(burn.consumed_hours) == pytest.approx(12.0)
    assert burn.burn_rates(0)["1h"] == pytest.approx(5.0)
    assert ("page", "6h", "30m", pytest.approx(6.0)) not in burn.firing(0)
    assert any(f[0] == "page" for f in LedgerBurn(slo, {"error_ratio": {
        "1h": 1.0, "5m": 1.0}}).firing(0))
    cluster = ClusterState()
    cluster.apply_budget({"llm": {"consumed_h": 60.0, "error_ratio": {}}})
    eff = EfficiencyView(slo)
    eff.update(cluster)
    assert isinstance(eff.jobs["llm"].burn, LedgerBurn)
    assert eff.jobs["llm"].burn.consumed_hours == 60.0
    # The run's best ten minutes, from the ledger, is the yardstick of a viewer that has
    # not counted ten minutes itself (2,400 samples/s on 800 GPUs against 4 a GPU).
    cluster.apply_budget({"llm": {"consumed_h": 60.0, "best_per_gpu": 4.0}})
    eff.update(cluster)
    job = eff.jobs["llm"]
    job.world = 800
    assert eff.efficiency(job, 2400.0) == (pytest.approx(0.75), "its best 10 min")


async def test_a_relay_away_counts_the_run_time_it_missed_from_the_agents_totals(
        tmp_path: Path, unused_tcp_port_factory) -> None:
    """kill -9 of the relay while the job runs, four seconds away, then back: the ledger
    holds the whole run, the minutes it was away included (from the agents' cumulative
    step totals, not more than the time that passed), and viewers are told how much was
    recovered so, with its loss booked as the kinds the ranks reported meanwhile (this
    job's ranks wait on nothing but their collectives: all of it `comm`, none `other`),
    said in `status`, `status --job` and the job screen alike."""
    ledger_path = tmp_path / "ledger.db"
    sim = SimCluster(nodes=2, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    port = unused_tcp_port_factory()
    options = StreamOptions(min_backoff=0.1, max_backoff=0.3)
    async with sim:
        relay = await _start_relay(sim.targets, port, ledger_path)
        try:
            viewer = ClusterState()
            async with watching([], viewer, options, relays=[f"127.0.0.1:{port}"]):
                await until(lambda: "llm-pretrain" in viewer.budgets, timeout=20,
                            what="budget from the relay")
                counted_from = time.time()  # the relay counts the job by now
                await asyncio.sleep(2.0)
            relay.send_signal(signal.SIGKILL)
            await asyncio.wait_for(relay.wait(), 30)
            killed = time.time()
            await asyncio.sleep(4.0)  # the job runs on; nobody counts it
            relay = await _start_relay(sim.targets, port, ledger_path)
            viewer = ClusterState()
            async with watching([], viewer, options, relays=[f"127.0.0.1:{port}"]):
                await until(lambda: (viewer.budgets.get("llm-pretrain") or {}).get(
                    "recovered_h"), timeout=20, what="the recovered time in the budget")
                recovered = viewer.budgets["llm-pretrain"]["recovered_h"] * 3600
                booked = viewer.budgets["llm-pretrain"]["recovered_spent_h"]
                back = time.time()
                eff = EfficiencyView()
                eff.update(viewer)
                job_lines = job_text(job_report(eff, "llm-pretrain", []), plain=True)
                status_lines = format_text(report(viewer, eff, [], "ok"))
                await asyncio.sleep(1.0)
                end = time.time()
        finally:
            if relay.returncode is None:
                relay.terminate()
                await asyncio.wait_for(relay.wait(), 30)
    # Away from the kill (less the last flush, at most 0.5 s, before it) to the first
    # sample after the restart: four seconds and the relay's start.
    assert 4.0 <= recovered <= back - killed + 1.0, (recovered, back - killed)
    # The loss of the missed seconds (the step time the ranks spent in their collectives)
    # booked as `comm`, as their totals say, not as `other`.
    assert booked.get("comm", 0) > 0 and booked.get("other", 0) == 0, booked
    said = "the relay missed, counted from the agents' totals; its loss"
    assert said in job_lines and "booked as the ranks reported it: comm 100%" in job_lines
    assert said in status_lines and "comm 100%" in status_lines
    with Ledger(ledger_path) as after:
        stored = sum(t for _, t, _ in after.buckets("llm-pretrain"))
    # Every second the job ran since the relay first counted it, the six away included
    # (the last flush before the terminate may be short of the end by its 0.5 s).
    assert end - counted_from - 1.0 <= stored, (stored, end - counted_from)
    assert "credited" in ledger_path.with_suffix(".stderr").read_text()


async def test_viewers_before_and_after_a_relay_outage_read_the_same_hour(
        tmp_path: Path, unused_tcp_port_factory) -> None:
    """One viewer watched before the relay went away and stayed (reconnecting); another
    opened after it came back. Both say the same 1h SLI, over the same seconds: the
    hour the job's nodes counted, which neither viewer's own count covers, not two
    different counts (a leaf's fault in the middle makes any mix-up show)."""
    ledger_path = tmp_path / "ledger.db"
    sim = SimCluster(nodes=2, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="spine-imbalance", fault_at=12.0, nodes_per_leaf=1)
    port = unused_tcp_port_factory()
    options = StreamOptions(min_backoff=0.1, max_backoff=0.3)
    async with sim:
        relay = await _start_relay(sim.targets, port, ledger_path)
        try:
            before = ClusterState()
            async with watching([], before, options, relays=[f"127.0.0.1:{port}"]):
                eff_a = EfficiencyView()
                for _ in range(30):  # it watches through the fault's onset
                    eff_a.update(before)
                    await asyncio.sleep(0.5)
                relay.send_signal(signal.SIGKILL)
                await asyncio.wait_for(relay.wait(), 30)
                await asyncio.sleep(3.0)
                relay = await _start_relay(sim.targets, port, ledger_path)
                after = ClusterState()
                async with watching([], after, options, relays=[f"127.0.0.1:{port}"]):
                    eff_b = EfficiencyView()
                    await until(lambda: "llm-pretrain" in after.budgets, timeout=20,
                                what="the budget after the outage")
                    for _ in range(6):
                        eff_a.update(before)
                        eff_b.update(after)
                        await asyncio.sleep(0.5)
                    hour_a = eff_a.jobs["llm-pretrain"].sli_window(3600, eff_a.now)
                    hour_b = eff_b.jobs["llm-pretrain"].sli_window(3600, eff_b.now)
        finally:
            if relay.returncode is None:
                relay.terminate()
                await asyncio.wait_for(relay.wait(), 30)
    assert hour_a[0] is not None and hour_b[0] is not None
    assert abs(hour_a[0] - hour_b[0]) <= 0.01, (hour_a, hour_b)
    assert abs(hour_a[1] - hour_b[1]) <= 2.0, (hour_a, hour_b)
    # The nodes' hour (the whole run so far), not the second viewer's few seconds.
    assert hour_b[1] > 15, hour_b


async def test_status_job_through_a_relay_answers_efficiency_from_the_runs_best(
        tmp_path: Path, unused_tcp_port_factory) -> None:
    """A quick check over SSH during a run: `status --relay R --job NAME` answers "did
    efficiency drop?" at once, against the job's best ten minutes as the relay's ledger
    counted them (here 25 samples/s a GPU, twelve minutes ago), not "no baseline yet"
    because this one-shot has watched seconds."""
    ledger_path = tmp_path / "ledger.db"
    start = time.time() - 13 * 60
    with Ledger(ledger_path, clock=lambda: start + 12 * 60) as seed:
        for i in range(12):
            seed.add("llm-pretrain", start + 60 * i + 30, 60.0, 54.0, {"comm": 6.0},
                     samples=25.0 * 240, rank_s=240.0)
        seed.flush()
    sim = SimCluster(nodes=2, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    port = unused_tcp_port_factory()
    async with sim:
        relay = await _start_relay(sim.targets, port, ledger_path)
        try:
            await asyncio.sleep(2.0)
            _, out = await run_tuimon("status", "--relay", f"127.0.0.1:{port}", "--job",
                                      "llm-pretrain", "--json")
            _, text = await run_tuimon("status", "--relay", f"127.0.0.1:{port}", "--job",
                                       "llm-pretrain")
        finally:
            relay.terminate()
            await asyncio.wait_for(relay.wait(), 30)
    doc = json.loads(out)
    assert doc["efficiency"]["against"] == "its best 10 min", out
    thr = doc["samples_per_s"]
    assert doc["efficiency"]["value"] == pytest.approx(thr / (4 * 25.0), rel=1e-3), out
    assert re.search(r"efficiency 0\.\d\d vs its best 10 min", text), text
    assert "no baseline yet" not in text


async def _start_relay(targets: list[str], port: int, ledger: Path,
                       *extra: str) -> asyncio.subprocess.Process:
    # stderr to a file, not a pipe: an unread pipe that fills stops the relay mid-write,
    # and asyncio's wait() waits for the pipe's end as well as the process's.
    with open(ledger.with_suffix(".stderr"), "ab") as err:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agent", "relay", *targets, "--listen",
            f"127.0.0.1:{port}", "--ledger", str(ledger), "--flush-every", "0.5",
            "--interval", "0.2", "--log-level", "warning", *extra, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.DEVNULL, stderr=err)


async def test_ledger_survives_kill_9_and_viewers_see_the_runs_budget(
        tmp_path: Path, unused_tcp_port_factory) -> None:
    ledger_path = tmp_path / "ledger.db"
    # 60 h of the budget already spent earlier in the run (target 0.90 over 720 h: 72 h):
    # 41 h waiting in collectives while a port of gpu042 was congested, 12 h on data, 5 h
    # on checkpoints, and 2 h stopped when gpu042 was lost, as a relay counted them.
    start = time.time() - 26 * 86400  # 600 h of it, ending a day ago
    clock = [start]
    seed = Ledger(ledger_path, clock=lambda: clock[0])
    lost = {"comm": 41 / 598 * 3600, "data": 12 / 598 * 3600, "checkpoint": 5 / 598 * 3600}

    def hour(i: int) -> None:  # one hour of the run, reported at its end
        clock[0] = start + 3600 * (i + 1) - 1
        seed.add("llm-pretrain", clock[0], 3600.0, 3600.0 - sum(lost.values()), lost)

    congested = Finding("warning", "congestion", "gpu042 mlx5_0:1: congestion",
                        node="gpu042", port="mlx5_0:1", score=0.9)
    for i in range(298):
        hour(i)
    seed.attribute(lambda job: [congested])
    seed.close()
    seed = Ledger(ledger_path, clock=lambda: clock[0])  # a relay that saw the stop
    hour(298)
    clock[0] += 7200
    seed.note_stops(clock[0], lambda job: "node lost gpu042")
    seed.add("llm-pretrain", clock[0], 1.0, 1.0)  # back after hours 299 and 300
    for i in range(301, 600):
        hour(i)
    seed.attribute(lambda job: [congested])
    seed.close()
    sim = SimCluster(nodes=2, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    port = unused_tcp_port_factory()
    async with sim:
        relay = await _start_relay(sim.targets, port, ledger_path)
        try:
            viewer = ClusterState()
            async with watching([], viewer, StreamOptions(min_backoff=0.1, max_backoff=0.3),
                                relays=[f"127.0.0.1:{port}"]):
                await until(lambda: "llm-pretrain" in viewer.budgets, timeout=20,
                            what="budget from the relay")
                eff = EfficiencyView(Slo(0.90, 720))
                eff.update(viewer)
                left = eff.slo.remaining_hours(eff.jobs["llm-pretrain"].burn.consumed_hours)
                assert 11.5 < left <= 12.0, left  # the run's budget, not this session's
                # ...and what it was spent on, as status says it.
                text = format_text(report(viewer, eff, [], "ok"))
                assert "of 72 h left (spent on comm 41.0 h, data 12.0 h, checkpoint 5.0 h, " \
                    "stopped 2.0 h)" in text, text
                # ...and what each kind was put down to over the run (the job's screen).
                doc = job_report(eff, "llm-pretrain", [])
                assert [r["kind"] for r in doc["spent"]] == ["comm", "data", "checkpoint",
                                                             "stopped"]
                assert doc["run_causes"]["comm"][0] == {
                    "cause": "congestion gpu042 mlx5_0:1", "hours": pytest.approx(41.0),
                    "share": 1.0}
                assert doc["run_causes"]["stopped"][0]["cause"] == "node lost gpu042"
                first = viewer.budgets["llm-pretrain"]["since"]
                assert first <= start + 3600  # its first hour, reported at its end
                await asyncio.sleep(3.0)  # live steps reach the ledger
                killed_at = time.time()
                relay.send_signal(signal.SIGKILL)
                await asyncio.wait_for(relay.wait(), 30)
            with Ledger(ledger_path) as after:
                live = [b for b in after.buckets("llm-pretrain")
                        if b[0] * 60 >= killed_at - 600]
            stored = sum(t for _, t, _ in live)
            # About 3 s of training were reported; at most one flush (0.5 s) is lost.
            assert stored >= 2.0, live
            relay = await _start_relay(sim.targets, port, ledger_path)
            viewer = ClusterState()
            async with watching([], viewer, StreamOptions(min_backoff=0.1, max_backoff=0.3),
                                relays=[f"127.0.0.1:{port}"]):
                await until(lambda: "llm-pretrain" in viewer.budgets, timeout=20)
                again = viewer.budgets["llm-pretrain"]
                assert again["since"] == first
                assert again["observed_h"] >= 600 + stored / 3600 - 1e-6
                # The live minutes' waiting (the simulated ranks wait in collectives) is
                # in the ledger after the kill, beside the seeded hours.
                assert again["spent_h"]["comm"] > 41.0 and \
                    again["spent_h"]["data"] == pytest.approx(12.0)
                assert sum(again["spent_h"].values()) == pytest.approx(again["consumed_h"])
        finally:
            if relay.returncode is None:
                relay.terminate()
                await asyncio.wait_for(relay.wait(), 30)
        assert relay.returncode in (0, -signal.SIGTERM), \
            ledger_path.with_suffix(".stderr").read_text()


def test_relay_command_refuses_bad_settings(tmp_path: Path) -> None:
    import subprocess

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agent", "relay", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=30,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = run("gpu[001-002]", "--listen", "0.0.0.0:19999", "--no-ledger")
    assert out.returncode == 2 and "without a token" in out.stderr
    out = run("gpu[001-", "--no-ledger")
    assert out.returncode == 2 and "bad host list" in out.stderr
    bad = tmp_path / "ledger.db"
    bad.write_bytes(b"this is not a database" * 100)
    out = run("gpu001", "--ledger", str(bad))
    assert out.returncode == 2 and str(bad) in out.stderr


def test_hello_only_sources_are_not_lost() -> None:
    """A viewer that connects sees hellos before samples of the same node."""
    from tuimon.relay.fanout import FanOut
    from tuimon.relay.viewer_feed import ViewerFeed
    from tuimon_core.protocol.families import Frame

    fan = FanOut()
    hello = Hello(node="n1", agent_version="t", boot_id=None, interval=1.0, ts=1.0)
    fan.apply_message("n1:9477", hello, encode(hello))
    sample = Sample(seq=1, ts=2.0, interval=1.0, gpus=[], host={})
    fan.apply_message("n1:9477", sample, encode(sample))
    feed = ViewerFeed("test", 0.5)
    fan.attach(feed)
    (data,) = feed.take(3.0, "r", None, 0)
    batch = decode(data, max_bytes=16 << 20)
    kinds = [type(decode(d)).__name__ for _, d in batch.frames]
    assert kinds == ["Hello", "Sample"] and batch.sources == [("n1:9477", "up", None)]
    assert isinstance(Frame(sample).message, Sample)


async def test_a_bad_agent_is_that_nodes_problem(unused_tcp_port_factory) -> None:
    """Through the relay, a sample with a wrong value marks that node only (the viewer
    checks what the relay forwards), and garbage marks the node stale at the relay."""
    from aiohttp import web

    good = Hello(node="good", agent_version="t", boot_id=None, interval=0.2, ts=1.0)
    bad = Hello(node="bad", agent_version="t", boot_id=None, interval=0.2, ts=1.0)

    def agent(hello: Hello, sample_bytes: bytes):  # type: ignore[no-untyped-def]
        async def stream(request: web.Request) -> web.WebSocketResponse:
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            await ws.send_bytes(encode(hello))
            with contextlib.suppress(ConnectionError, RuntimeError):
                while not ws.closed:
                    await ws.send_bytes(sample_bytes)
                    await asyncio.sleep(0.2)
            return ws
        app = web.Application()
        app.router.add_get("/v1/stream", stream)
        return app

    from tuimon_core.protocol import encode_map

    ok = encode(Sample(seq=1, ts=time.time(), interval=0.2, gpus=[{"temp": 50.0}], host={}))
    hot = encode_map({"v": 1, "t": "sample", "seq": 1, "ts": time.time(), "interval": 0.2,
                      "gpus": [{"temp": "hot"}], "host": {}})
    runners = []
    targets = []
    for hello, data in ((good, ok), (bad, hot), (good, b"\xc1garbage")):
        runner = web.AppRunner(agent(hello, data), access_log=None)
        await runner.setup()
        port = unused_tcp_port_factory()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        targets.append(f"127.0.0.1:{port}")
    try:
        async with Relay(relay_config(targets)) as relay:
            viewer = ClusterState()
            async with watching([], viewer, relays=[f"127.0.0.1:{relay.port}"]):
                await until(lambda: targets[0] in viewer.nodes
                            and viewer.nodes[targets[0]].sample is not None)
                await until(lambda: "sample.gpus[0].temp" in (
                    (viewer.nodes.get(targets[1]) and viewer.nodes[targets[1]].reason) or ""),
                    what="the bad value named in the viewer")
                await until(lambda: "bad frame" in (
                    (viewer.nodes.get(targets[2]) and viewer.nodes[targets[2]].reason) or ""),
                    what="garbage named")
                assert viewer.nodes[targets[0]].status == "up"
                assert relay.state.fanout.stats.bad_frames >= 1
    finally:
        for runner in runners:
            await runner.cleanup()


# -- the ledger and time (docs/security.md, "time") --------------------------------------


def test_two_relays_cannot_share_one_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path), pytest.raises(LedgerError, match="in use by another relay"):
        Ledger(path)
    with Ledger(path):  # released with the first
        pass


def test_a_second_relay_through_a_symlink_or_a_hard_link_is_refused(tmp_path: Path) -> None:
    """The lock is the file's own, not its name's: the same ledger reached by another
    path (a symlink, a hard link) is one ledger in use."""
    path = tmp_path / "ledger.db"
    (tmp_path / "other").mkdir()
    link = tmp_path / "other" / "alias.db"
    with Ledger(path):
        link.symlink_to(path)
        with pytest.raises(LedgerError, match="in use by another relay"):
            Ledger(link)
        hard = tmp_path / "other" / "hard.db"
        os.link(path, hard)
        with pytest.raises(LedgerError, match="in use by another relay"):
            Ledger(hard)


def test_a_clock_jump_then_new_minutes_never_empty_the_ledger(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A running relay whose clock jumps 40 days ahead writes a minute there; its next
    hourly prune would find history older than the retention and one minute within it.
    It does not take the history: the wall clock moved 40 days while an hour passed."""
    now = [1_800_000_000.0]
    mono = [100.0]
    with Ledger(tmp_path / "l.db", clock=lambda: now[0], monotonic=lambda: mono[0]) as ledger:
        for i in range(600):
            ledger.add("job", now[0] - 36000 + 60 * i, 60.0, 54.0)
        ledger.flush()
        now[0] += 40 * 86400
        mono[0] += 3600
        ledger.add("job", now[0], 60.0, 60.0)
        ledger.flush()
        assert ledger.prune() == 0
        assert len(ledger.buckets("job")) == 601
    assert any("moved +959.0 h apart" in r.message for r in caplog.records)


def test_a_relay_down_for_days_still_prunes(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """Maintenance: ten jobs for nine days, two days of nothing, one job for 29 days:
    what is older than the retention goes, and no one is told to check a clock."""
    start = 1_800_000_000.0
    path = tmp_path / "l.db"
    with Ledger(path, clock=lambda: start) as ledger:
        for day in range(9):
            for job in range(10):
                ledger.add(f"job{job}", start + day * 86400, 60.0, 60.0)
    back = start + 11 * 86400
    with Ledger(path, clock=lambda: back) as ledger:
        for day in range(29):
            ledger.add("job0", back + day * 86400, 60.0, 60.0)
        ledger.flush()
    later = back + 29 * 86400
    with Ledger(path, keep_days=30, clock=lambda: later) as ledger:
        assert ledger.prune() == 90
        assert len(ledger.buckets("job0")) == 29
    assert not any("check the clock" in r.message for r in caplog.records)
    # Steady operation prunes too: a minute past the retention, next to the rest.
    now = 1_800_000_000.0
    with Ledger(tmp_path / "l2.db", keep_days=1, clock=lambda: now) as ledger:
        for i in range(1500):
            ledger.add("job", now - 86400 - 120 + 60 * i, 60.0, 60.0)
        ledger.flush()
        assert ledger.prune() == 2


def test_a_relay_clock_far_ahead_never_empties_the_ledger(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    now = 1_800_000_000.0
    with Ledger(tmp_path / "l.db", clock=lambda: now) as ledger:
        for i in range(60):
            ledger.add("job", now - 3600 + 60 * i, 60.0, 54.0)
    ahead = now + 40 * 86400  # a relay started 40 days ahead on the same file
    with Ledger(tmp_path / "l.db", clock=lambda: ahead) as ledger:
        assert ledger.prune() == 0
        assert len(ledger.buckets("job")) == 60
    assert any("not pruning" in r.message and "check the clock" in r.message
               for r in caplog.records)


def test_minutes_are_the_relays_and_a_future_minute_counts_nowhere(tmp_path: Path) -> None:
    now = 1_800_000_000.0
    ledger = Ledger(tmp_path / "l.db", clock=lambda: now)
    fanout = FanOut(on_steps=ledger.add, clock=lambda: 100.0, wall=lambda: now)
    ten_years = now + 10 * 365 * 86400  # an agent whose clock is a decade ahead
    steps = {"jobs": [{"id": "job", "world": 1, "ranks": [
        {"rank": 0, "steps": 1, "wall": 1.0, "compute": 0.5}]}]}
    fanout.apply_message("n1:9477", Sample(seq=1, ts=ten_years, interval=1.0,
                                           extra={"steps": steps}))
    ledger.flush()
    assert [b[0] for b in ledger.buckets("job")] == [int(now // 60)]  # the relay's minute
    # A bucket already in the file from the future is in no window, not in all of them.
    ledger.add("job", ten_years, 3600.0, 0.0)
    ledger.flush()
    s = ledger.summary(now)["job"]
    assert s["observed_h"] == pytest.approx(1.0 / 3600)
    assert s["error_ratio"]["5m"] == pytest.approx(0.5)
    ledger.close()


def test_the_ledger_counts_a_nodes_seconds_once() -> None:
    """The same (job, rank) from two sources counts once; claims never exceed the time
    that passed."""
    credited: list[tuple[str, float, float]] = []
    mono = [100.0]
    fanout = FanOut(on_steps=lambda job, ts, t, e, *more: credited.append((job, t, e)),
                    clock=lambda: mono[0], wall=lambda: 1e9)
    steps = {"jobs": [{"id": "job", "world": 2, "ranks": [
        {"rank": 0, "steps": 1, "wall": 1.0, "compute": 0.9}]}]}
    for seq in range(1, 11):
        mono[0] += 1.0
        for source in ("n1:9477", "n2:9477"):  # n2 says it is rank 0 too
            fanout.apply_message(source, Sample(seq=seq, ts=0.0, interval=1.0,
                                                extra={"steps": steps}))
    # One rank of the two reports: the run's seconds, a second a second, counted once.
    assert sum(t for _, t, _ in credited) == pytest.approx(10 * 1.0)
    assert fanout.credit.duplicates == 10
    # A day claimed in one sample counts what the allowance holds, not a day.
    credited.clear()
    mono[0] += 1.0
    fanout.apply_message("n1:9477", Sample(seq=11, ts=0.0, interval=1.0, extra={"steps": {
        "jobs": [{"id": "job", "world": 2, "ranks": [
            {"rank": 0, "steps": 1, "wall": 86400.0, "compute": 0.0}]}]}}))
    assert credited[0][1] <= 15.0


def test_a_damaged_ledger_is_a_clear_error_or_its_bad_rows_set_aside(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A text where a number is kept, a blob for a job or a cause, an infinite sum: the
    relay starts, skips those rows (moved aside, said once with their count) and sums
    the rest. A symlink loop, or a path that is a device, is a usage error, and no lock
    file is made beside a device."""
    path = tmp_path / "ledger.db"
    t0 = 1_800_000_000.0
    with Ledger(path, clock=lambda: t0) as ledger:
        for minute in range(5):
            ledger.add("llm", t0 - 300 + 60 * minute, 60.0, 54.0, {"comm": 6.0})
        ledger.attribute(lambda job: [])
    with sqlite3.connect(path) as db:
        db.execute("UPDATE buckets SET total_s = 'lots' WHERE minute = ?",
                   (int((t0 - 300) // 60),))
        db.execute("INSERT INTO buckets (job, minute, total_s, effective_s, samples, rank_s) "
                   "VALUES (?, ?, 60, 60, 0, 0)", (b"\xff\x00blob", int(t0 // 60)))
        db.execute("INSERT INTO buckets (job, minute, total_s, effective_s, samples, rank_s) "
                   "VALUES ('llm', ?, 9e999, 0, 0, 0)", (int(t0 // 60) - 10,))
        db.execute("INSERT INTO causes VALUES ('llm', ?, 'comm', ?, 10.0)",
                   (int(t0 // 3600), b"\x00cause"))
        db.execute("INSERT INTO totals VALUES ('n1', 'llm', 'then', 1.0, 1.0, 1.0, 1, 1, "
                       "'{not json')")
        # A damaged_ table an older layout made, without the columns added since.
        db.execute("CREATE TABLE damaged_totals AS SELECT source, job, since, wall, "
                   "compute, at, ranks, run_ranks FROM totals WHERE 0")
    with caplog.at_level("ERROR"), Ledger(path, clock=lambda: t0) as again:
        summary = again.summary(t0)
    assert set(summary) == {"llm"}
    assert summary["llm"]["observed_h"] * 3600 == pytest.approx(4 * 60.0)
    said = [r.getMessage() for r in caplog.records if "wrong kind" in r.getMessage()]
    assert sorted(m.split(" of ")[1].split(" ")[0] for m in said) == [
        "buckets", "causes", "totals"], said
    assert any("3 row(s) of buckets" in m for m in said), said
    with sqlite3.connect(path) as db:  # kept aside, not lost
        assert db.execute("SELECT COUNT(*) FROM damaged_buckets").fetchone()[0] == 3
    # Opened again: nothing more to set aside, nothing said.
    caplog.clear()
    with caplog.at_level("ERROR"), Ledger(path, clock=lambda: t0):
        pass
    assert not [r for r in caplog.records if "wrong kind" in r.getMessage()]

    loop = tmp_path / "loop.db"
    loop.symlink_to(tmp_path / "loop2.db")
    (tmp_path / "loop2.db").symlink_to(loop)
    with pytest.raises(LedgerError, match="cannot resolve"):
        Ledger(loop)
    device = tmp_path / "device.db"
    device.symlink_to("/dev/null")
    existed = os.path.exists("/dev/null.lock")
    with pytest.raises(LedgerError, match="not a regular file"):
        Ledger(device)
    assert os.path.exists("/dev/null.lock") == existed
    out = subprocess.run([sys.executable, "-m", "tuimon.cli", "relay", "gpu001", "--ledger",
                          str(loop)], cwd=ROOT, capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2 and "cannot resolve" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
