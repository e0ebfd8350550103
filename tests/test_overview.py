"""The overview path (issue #12): each node's agent summarises and judges itself, viewers of
the whole cluster take those few hundred bytes a node, and only the node a viewer opens
comes whole; relays forward overviews as the agents' own bytes, stacked or not; agents
that predate overviews keep working through full frames."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json

import aiohttp
import msgpack
import pytest
from aiohttp import WSMsgType, web

from agent.sim.cluster import SimCluster
from tests.seeded import seeded_cluster
from tests.test_relay import relay_config, until, up
from tuimon.model.cluster import ClusterState
from tuimon.model.map_kinds import FABRIC_MAP, GPU_MAP
from tuimon.relay import Relay
from tuimon.sources.agent_stream import StreamOptions, watching
from tuimon_core.heat_levels import FABRIC_METRICS, GPU_METRICS
from tuimon_core.overview import OVERVIEW_FAMILIES, build_overview
from tuimon_core.protocol import ProtocolError, Sample, Subscribe, decode, encode, encode_map
from tuimon_core.protocol.families import keep_families
from tuimon_core.protocol.overview_layout import level_run, levels_of

OVERVIEW = StreamOptions(overview=True, min_backoff=0.1, max_backoff=0.3)


def _stripped(sample: Sample) -> Sample:
    """The same sample as an agent that predates overviews sends it."""
    extra = {k: v for k, v in sample.extra.items() if k not in ("overview", "findings")}
    return dataclasses.replace(sample, extra=extra)


async def test_the_agents_overview_draws_the_same_cells_as_its_full_sample() -> None:
    """Every cell of both maps, every metric, every node: the levels the agent sent are
    the ones the viewer computes from the full sample (a faulty seeded cluster, so failed,
    throttled and congested cells are among them)."""
    agents, _ = await seeded_cluster(nodes=16, gpus=8)
    legacy = ClusterState("legacy")
    for n in agents.nodes.values():
        legacy.apply_hello(n.target, n.hello)
        legacy.apply_sample(n.target, _stripped(n.sample))
    assert all(n.overview is not None for n in agents.nodes.values())
    for target, node in agents.nodes.items():
        other = legacy.nodes[target]
        assert node.overview is node.sample.extra["overview"]  # the agent's, not rebuilt
        for kind in (GPU_MAP, FABRIC_MAP):
            for metric in kind.metrics:
                assert kind.levels(node, metric) == kind.levels(other, metric), \
                    (target, kind.key, metric.key)
                assert len(kind.levels(node, metric)) == kind.cell_count(node)
        assert node.overview.get("busy") == other.overview.get("busy")


async def test_the_cells_of_an_agent_without_overviews_follow_each_new_sample() -> None:
    """The viewer computes such a node's levels from its sample when a map draws them:
    the next sample's cells are the next sample's, for the metric drawn before and for
    one drawn first now."""
    agents, _ = await seeded_cluster(nodes=4, gpus=8)
    node = next(iter(agents.nodes.values()))
    legacy = ClusterState("legacy")
    legacy.apply_hello(node.target, node.hello)
    legacy.apply_sample(node.target, _stripped(node.sample))
    other = legacy.nodes[node.target]
    busy, temp = GPU_MAP.metrics[0], GPU_MAP.metrics[2]
    before = GPU_MAP.levels(other, busy)
    hotter = copy.deepcopy(_stripped(node.sample))
    for g in hotter.gpus or ():
        g.update(sm_active=0.0, gr_active=0.0, util=0.0, temp=95.0)
    legacy.apply_sample(node.target, hotter)
    assert before != [0] * len(before)
    assert GPU_MAP.levels(other, busy) == [0] * len(before)
    assert GPU_MAP.levels(other, temp) == [8] * len(before)
    packed = build_overview(node.hello, hotter)["gpu_levels"]  # as an agent would send it
    assert GPU_MAP.levels(other, busy) == levels_of(level_run(packed, 0))


async def test_each_metric_draws_the_same_cells_from_only_the_fields_it_reads() -> None:
    """A source that asks only what the map on screen draws (tuimon prom) asks for a
    metric's `reads`: with only those fields (and `failed`), every GPU and port of a
    faulty seeded cluster is drawn as from its whole sample."""
    agents, _ = await seeded_cluster(nodes=16, gpus=8)
    seen = 0
    for node in agents.nodes.values():
        infos = node.hello.gpus
        ports = {p["id"]: p for p in node.hello.extra.get("ports") or ()}
        cells = [(g, infos[i], GPU_METRICS) for i, g in enumerate(node.sample.gpus)]
        cells += [(p, ports.get(p["id"]), FABRIC_METRICS)
                  for p in node.sample.extra["fabric"]["ports"]]
        for values, info, metrics in cells:
            for metric in metrics:
                only = {k: v for k, v in values.items() if k in metric.reads | {"failed"}}
                assert metric.level(only, info) == metric.level(values, info), \
                    (node.name, metric.key, values)
                seen += metric.level(values, info) > 0
    assert seen > 500  # levels above the lowest, not a cluster of empty cells


async def test_an_overview_frame_is_a_small_fraction_of_the_full_frame() -> None:
    cluster, _ = await seeded_cluster(nodes=4, gpus=8)
    for node in cluster.nodes.values():
        wire = node.sample.to_wire()
        full = len(encode_map(wire))
        small = len(encode_map(keep_families(dict(wire), frozenset(OVERVIEW_FAMILIES))))
        assert small * 10 < full, (small, full)


def test_build_overview_keeps_shared_file_systems_only_and_says_what_is_missing() -> None:
    from tuimon_core.protocol import Hello

    hello = Hello(node="n", agent_version="x", boot_id=None, interval=1.0, ts=0.0)
    sample = Sample(seq=1, ts=0.0, interval=1.0, gpus=None, extra={"storage": {
        "filesystems": [{"id": "/lustre", "fstype": "lustre", "read_bytes_s": 2.4},
                        {"id": "/", "fstype": "ext4", "read_bytes_s": 9.0}]}})
    ov = build_overview(hello, sample)
    assert "gpu_levels" not in ov and "ports" not in ov  # absent, not empty: nothing read
    assert ov["fs_rows"] == [["/lustre", "lustre", 2, None, None, None, None]]


def test_levels_and_busy_travel_as_bytes_and_read_back_as_levels() -> None:
    from tuimon_core.heat_levels import FAILED, NO_DATA
    from tuimon_core.protocol.overview_layout import busy_percents as busy_values

    assert levels_of(bytes([0, 1, 2, 10])) == [NO_DATA, FAILED, 0, 8]
    assert busy_values(bytes([97, 255, 0])) == bytes([97, 0])


def test_the_level_blobs_hold_the_maps_metrics_in_the_documented_order() -> None:
    # The agent packs GPU_METRICS in their order and the viewer reads the n-th run as the
    # n-th metric: the published order (docs/protocol.md) must be that order.
    from tuimon_core.heat_levels import FABRIC_METRICS, GPU_METRICS
    from tuimon_core.protocol.fields import FS_COLUMNS
    from tuimon_core.protocol.overview_layout import FABRIC_LEVEL_ORDER, GPU_LEVEL_ORDER, FsRow

    assert FsRow._fields == FS_COLUMNS  # a row's columns are the name table's

    assert tuple(m.key for m in GPU_METRICS) == GPU_LEVEL_ORDER
    assert tuple(m.key for m in FABRIC_METRICS) == FABRIC_LEVEL_ORDER


async def _node_with(overview: dict[str, object]) -> object:
    """A two-GPU node whose overview is this one, as a viewer decoded it."""
    cluster, _ = await seeded_cluster(nodes=1, gpus=2, samples=1)
    data = msgpack.packb({"v": 1, "t": "sample", "seq": 9, "ts": 1.0, "interval": 1.0,
                          "overview": overview})
    sample = decode(data)
    assert isinstance(sample, Sample)
    node = next(iter(cluster.nodes.values()))
    node.overview = sample.extra["overview"]
    return node


async def test_a_newer_agents_extra_metrics_are_skipped_and_an_older_ones_are_no_data(
) -> None:
    from tuimon_core.heat_levels import NO_DATA

    util, mem = GPU_MAP.metrics[0], GPU_MAP.metrics[1]
    # Eight metrics: the six this viewer knows, then two it does not.
    newer = await _node_with({"gpu_levels": bytes([8]) + bytes([5, 6]) + bytes([7, 8]) +
                        bytes([2, 2]) * 6})
    assert GPU_MAP.levels(newer, util) == [3, 4]
    assert GPU_MAP.levels(newer, mem) == [5, 6]
    # One metric: util only; the rest read as no data, not as someone else's levels.
    older = await _node_with({"gpu_levels": bytes([1, 5, 6])})
    assert GPU_MAP.levels(older, util) == [3, 4]
    assert GPU_MAP.levels(older, mem) == [NO_DATA, NO_DATA]


async def test_once_json_shows_the_overview_as_numbers_with_named_ports() -> None:
    # `tuimon-agent once --json` is read by people and scripts: levels as lists of
    # numbers per metric name, busy percents, ports named, file systems as maps.
    from tuimon_core.overview import hello_port_ids
    from tuimon_core.protocol.overview_layout import readable

    cluster, _ = await seeded_cluster(nodes=1, gpus=2, samples=2)
    node = next(iter(cluster.nodes.values()))
    ov = node.sample.extra["overview"]
    ports = hello_port_ids(node.hello)
    shown = readable(ov, ports)
    assert set(shown["gpu"]) == {"util", "mem", "temp", "power", "clock", "health"}
    assert shown["gpu"]["util"] == GPU_MAP.levels(node, GPU_MAP.metrics[0])
    assert shown["fabric"]["util"] == FABRIC_MAP.levels(node, FABRIC_MAP.metrics[0])
    assert shown["ports"] == ports and len(shown["wait"]) == len(ports)
    assert all(isinstance(b, int) and 0 <= b <= 100 for b in shown["busy"])
    assert shown["fs"] and all(f.keys() >= {"id", "fstype", "read", "write"}
                               for f in shown["fs"])
    assert "gpu_levels" not in shown and "fs_rows" not in shown
    json.dumps(shown)  # what --json prints


def test_a_whole_sample_from_before_the_overviews_is_not_kept_as_current() -> None:
    """An agent may send its first sample whole, before it hears that the viewer wants
    overviews: the overview after it leaves the node without a whole sample (its
    screen would show it as current), but an open node's screen keeps its own."""
    whole = Sample(1, 0.0, 1.0, gpus=[{"util": 0.5}])
    viewer = ClusterState("viewer")
    for target in ("a:1", "b:1"):
        viewer.apply_sample(target, whole)
        assert viewer.nodes[target].detail is whole
    viewer.detail_targets = frozenset({"b:1"})  # b's screen is open
    overview = Sample(2, 1.0, 1.0, extra={"overview": build_overview(None, whole)})
    for target in ("a:1", "b:1"):
        viewer.apply_sample(target, overview)
    assert viewer.nodes["a:1"].detail is None and viewer.nodes["b:1"].detail is whole
    # Whole samples wanted (a readout), the GPU collector failing: no GPUs, no overview.
    viewer.apply_sample("c:1", whole)
    viewer.apply_sample("c:1", Sample(2, 1.0, 1.0, host={"cpu_util": 0.5}))
    assert viewer.nodes["c:1"].detail is whole


async def test_a_viewer_takes_overviews_and_only_the_open_node_whole(
        unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=3, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    viewer = ClusterState("viewer")
    async with sim, watching(sim.targets, viewer, OVERVIEW):
        names = {m.name for m in sim.members}
        await until(lambda: up(viewer) == names, what="every node up")
        await until(lambda: all(n.sample.seq > 2 for n in viewer.nodes.values()),
                    what="a few samples")
        for node in viewer.nodes.values():
            assert node.sample.gpus is None and "overview" in node.sample.extra
            assert node.detail is None and node.conditions == []
        # The agents were asked for exactly the overview families.
        for m in sim.members:
            assert [c.families for c in m.agent.hub.clients] == [frozenset(OVERVIEW_FAMILIES)]
        opened = sim.targets[1]
        viewer.set_detail({opened})  # the node screen opens
        node = viewer.nodes[opened]
        await until(lambda: node.detail is not None, what="every value of the open node")
        seq = node.detail.seq
        await until(lambda: node.detail.seq > seq + 1, what="the open node keeps updating")
        assert node.detail.gpus[0].keys() >= {"util", "temp", "power", "mem_used"}
        assert node.detail.host is not None and "fabric" in node.detail.extra
        assert all(n.detail is None for t, n in viewer.nodes.items() if t != opened)
        viewer.set_detail(set())  # closed: back to the overview
        await until(lambda: node.sample.gpus is None and node.detail is None,
                    what="the node back on its overview")


async def test_through_a_relay_the_viewer_gets_the_agents_own_overview_bytes(
        unused_tcp_port_factory) -> None:
    """The relay slices the agent's frame: the overview a viewer decodes is byte for byte
    the agent's, and the relay asks each agent only for what its viewers want."""
    sim = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    async with sim, Relay(relay_config(sim.targets)) as relay:
        viewer = ClusterState("viewer")
        async with watching([], viewer, OVERVIEW, relays=[f"127.0.0.1:{relay.port}"]):
            names = {m.name for m in sim.members}
            await until(lambda: up(viewer) == names, what="every node up")
            target = sim.targets[0]
            member = sim.members[0]
            node = viewer.nodes[target]
            await until(lambda: node.sample.seq > 3, what="a few samples")
            # Relay and agent agree on the bytes of the overview of the same sample.
            source = relay.state.fanout.sources[target]
            forwarded = source.sample.encoded(frozenset(OVERVIEW_FAMILIES))
            agent_wire = msgpack.unpackb(source.sample.raw)
            assert msgpack.unpackb(forwarded)["overview"] == agent_wire["overview"]
            assert "gpus" not in msgpack.unpackb(forwarded)
            assert node.sample.gpus is None
            for m in sim.members:
                assert [c.families for c in m.agent.hub.clients] == \
                    [frozenset(OVERVIEW_FAMILIES)]
            # The node screen opens: that node's agent alone is asked for everything.
            viewer.set_detail({target})
            await until(lambda: node.detail is not None and node.detail.seq > 2,
                        what="every value of the open node, through the relay")
            assert [c.families for c in member.agent.hub.clients] == [None]
            assert all([c.families for c in m.agent.hub.clients] ==
                       [frozenset(OVERVIEW_FAMILIES)] for m in sim.members[1:])
            seq = node.detail.seq
            await until(lambda: node.detail.seq >= seq + 2, what="1 Hz or better, whole")
            viewer.set_detail(set())
            await until(lambda: [c.families for c in member.agent.hub.clients] ==
                        [frozenset(OVERVIEW_FAMILIES)], what="the agent back to overviews")


async def test_relays_stack_and_a_drill_down_reaches_through_both(
        unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    async with sim, Relay(relay_config(sim.targets[:2], name="a")) as a, \
            Relay(relay_config(sim.targets[2:], name="b")) as b, \
            Relay(relay_config([], relays=[f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"],
                               name="top")) as top:
        viewer = ClusterState("viewer")
        async with watching([], viewer, OVERVIEW, relays=[f"127.0.0.1:{top.port}"]):
            names = {m.name for m in sim.members}
            await until(lambda: up(viewer) == names, timeout=15, what="all nodes via the tree")
            target = sim.targets[3]
            node = viewer.nodes[target]
            await until(lambda: node.overview is not None and node.sample.seq > 2,
                        what="overviews through two relays")
            assert node.sample.gpus is None
            viewer.set_detail({target})
            await until(lambda: node.detail is not None, timeout=15,
                        what="every value of the open node through two relays")
            assert [c.families for c in sim.members[3].agent.hub.clients] == [None]
            assert [c.families for c in sim.members[0].agent.hub.clients] == \
                [frozenset(OVERVIEW_FAMILIES)]


# -- viewers that predate the compact form --------------------------------------------------


async def _overviews(url: str, form: int | None, count: int) -> dict[int, dict[str, object]]:
    """seq -> the overview as sent (unchecked wire), for a plain client subscribed to the
    overview families with this `overview_form` (None: a viewer that predates it)."""
    out: dict[int, dict[str, object]] = {}
    async with aiohttp.ClientSession() as session, session.ws_connect(
            url, max_msg_size=16 << 20) as ws:
        await ws.send_bytes(encode(Subscribe(families=list(OVERVIEW_FAMILIES),
                                             overview_form=form)))
        while len(out) < count:
            msg = await asyncio.wait_for(ws.receive(), 10)
            wire = msgpack.unpackb(msg.data)
            frames = [f for _, f in wire.get("frames", [])] if wire["t"] == "batch" else \
                [msg.data]
            for frame in frames:
                sample = msgpack.unpackb(frame)
                if sample["t"] == "sample" and "overview" in sample and sample["seq"] > 1:
                    out[sample["seq"]] = sample["overview"]
    return out


def _cells(overview: dict[str, object]) -> dict[str, object]:
    """What a viewer draws from an overview of either form, read through the codec."""
    sample = decode(msgpack.packb({"v": 1, "t": "sample", "seq": 1, "ts": 1.0,
                                   "interval": 1.0, "overview": overview}))
    assert isinstance(sample, Sample)
    ov = sample.extra["overview"]
    return {k: ov.get(k) for k in ("gpu_levels", "fabric_levels", "fs_rows", "busy", "wait")}


async def test_a_viewer_that_predates_the_compact_form_is_sent_the_first(
        unused_tcp_port_factory) -> None:
    """Agents and relays can be upgraded before their viewers: a viewer that does not ask
    for overview form 2 is sent form 1 (maps, and the port names), by the agent and by a
    relay, and what it draws is what a form-2 viewer draws from the same sample."""
    sim = SimCluster(nodes=2, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="healthy")
    async with sim, Relay(relay_config(sim.targets)) as relay:
        member = sim.members[0]
        ports = [p["id"] for p in member.agent.hello.extra["ports"]]
        assert ports, "the simulator's nodes have fabric ports"
        for url in (f"ws://{sim.targets[0]}/v1/stream", f"ws://127.0.0.1:{relay.port}/v1/stream"):
            old, new = await asyncio.gather(_overviews(url, None, 6), _overviews(url, 2, 6))
            for ov in old.values():
                assert set(ov) >= {"gpu", "fabric", "ports", "fs", "busy", "wait"}, url
                assert not set(ov) & {"gpu_levels", "fabric_levels", "fs_rows"}, url
                assert list(ov["gpu"]) == ["util", "mem", "temp", "power", "clock", "health"]
                assert ov["fs"] and all(isinstance(f, dict) and "id" in f for f in ov["fs"])
                if ov["ports"] != ports:  # through the relay: any of its two nodes
                    assert len(ov["ports"]) == len(ports)
            for ov in new.values():
                assert "gpu_levels" in ov and "gpu" not in ov and "ports" not in ov, url
            same = [seq for seq in old if seq in new]
            assert same, f"{url}: the two viewers saw no sample in common"
            for seq in same:
                assert _cells(old[seq]) == _cells(new[seq]), (url, seq)


# -- agents that predate overviews --------------------------------------------------------


async def _old_agent(port: int, got: list[Subscribe]) -> web.AppRunner:
    """An agent of before overviews: a hello without the families, full samples without
    overview or findings, and a family filter that drops only the keys it knows."""
    cluster, _ = await seeded_cluster(nodes=1, gpus=2, samples=2)
    node = next(iter(cluster.nodes.values()))
    hello = node.hello.to_wire()
    hello["families"] = ["gpu", "host", "fabric", "storage", "steps", "events"]
    sample = _stripped(node.sample).to_wire()

    async def stream(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_bytes(msgpack.packb(hello))
        families: list[str] | None = None

        async def send() -> None:
            seq = 0
            while not ws.closed:
                seq += 1
                wire = copy.deepcopy(sample)
                wire["seq"] = seq
                if families is not None:
                    for family, key in (("gpu", "gpus"), ("host", "host"),
                                        ("fabric", "fabric"), ("storage", "storage")):
                        if family not in families:
                            wire.pop(key, None)
                await ws.send_bytes(msgpack.packb(wire))
                await asyncio.sleep(0.2)

        task = asyncio.create_task(send())
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                sub = decode(msg.data)
                assert isinstance(sub, Subscribe)
                got.append(sub)
                families = sub.families
        task.cancel()
        return ws

    app = web.Application()
    app.router.add_get("/v1/stream", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def test_an_agent_without_overviews_is_taken_whole_and_summarised_by_the_viewer(
        unused_tcp_port) -> None:
    got: list[Subscribe] = []
    runner = await _old_agent(unused_tcp_port, got)
    try:
        viewer = ClusterState("viewer")
        target = f"127.0.0.1:{unused_tcp_port}"
        async with watching([target], viewer, OVERVIEW):
            node = viewer.nodes[target]
            await until(lambda: node.detail is not None and node.overview is not None,
                        what="full samples and an overview made here")
            # Asked for overviews first, then (its hello lacking them) for everything.
            assert got[0].families == sorted(OVERVIEW_FAMILIES) and got[-1].families is None
            assert node.conditions is None  # the viewer judges this node itself
            made = build_overview(node.hello, node.detail)["gpu_levels"]
            assert GPU_MAP.levels(node, GPU_MAP.metrics[0]) == levels_of(level_run(made, 0))
    finally:
        await runner.cleanup()


async def test_a_relay_summarises_and_judges_an_agent_without_overviews(
        unused_tcp_port_factory) -> None:
    port = unused_tcp_port_factory()
    got: list[Subscribe] = []
    runner = await _old_agent(port, got)
    target = f"127.0.0.1:{port}"
    try:
        async with Relay(relay_config([target])) as relay:
            viewer = ClusterState("viewer")
            async with watching([], viewer, OVERVIEW, relays=[f"127.0.0.1:{relay.port}"]):
                await until(lambda: target in viewer.nodes, what="the node via the relay")
                node = viewer.nodes[target]
                await until(lambda: node.overview is not None and node.sample.seq > 2,
                            what="an overview the relay made")
                assert node.sample.gpus is None  # the viewer still takes only overviews
                assert node.conditions == []  # judged by the relay's rules
                assert got[-1].families is None  # the relay takes the old agent whole
    finally:
        await runner.cleanup()


# -- hostile overviews ----------------------------------------------------------------------


@pytest.mark.parametrize(("overview", "where"), [
    ({"gpu_levels": bytes([0])}, "sample.overview.gpu_levels"),
    ({"gpu_levels": b""}, "sample.overview.gpu_levels"),
    ({"gpu_levels": bytes([2, 3, 4, 5])}, "sample.overview.gpu_levels"),
    ({"gpu_levels": bytes([1, 3, 11])}, "sample.overview.gpu_levels"),
    ({"gpu_levels": bytes([1]) + bytes(65)}, "sample.overview.gpu_levels"),
    ({"gpu_levels": bytes([12, 12])}, "sample.overview.gpu_levels"),
    ({"fabric_levels": [3, 2, 2, 2]}, "sample.overview.fabric_levels"),
    ({"fs_rows": [["/x", "nfs4", 1, 2, 3, 4]]}, "sample.overview.fs_rows[0]"),
    ({"fs_rows": [[7, "nfs4", 1, 2, 3, 4, 5]]}, "sample.overview.fs_rows[0]"),
    ({"fs_rows": [["/x", "nfs4", float("nan"), 2, 3, 4, 5]]},
     "sample.overview.fs_rows[0].read"),
    ({"fs_rows": [["/x", "nfs4", 1, True, 3, 4, 5]]}, "sample.overview.fs_rows[0].write"),
    ({"fs_rows": [["/x", "y" * 5000, 1, 2, 3, 4, 5]]}, "sample.overview.fs_rows[0].fstype"),
    ({"fs_rows": [["/x", "nfs4", 1, 2, [3], 4, 5]]}, "sample.overview.fs_rows[0].md_ops"),
    ({"fs_rows": {"/x": 1}}, "sample.overview.fs_rows"),
    ({"fs": [{"id": "/x", "read": True}]}, "sample.overview.fs[0]"),
    ({"gpu": {"util": bytes([3, 12])}}, "sample.overview.gpu"),
    ({"gpu": {"util": [3, 4]}}, "sample.overview.gpu"),
    ({"gpu": {"util": bytes(65)}}, "sample.overview.gpu"),
    ({"fabric": {"util": "xx"}}, "sample.overview.fabric"),
    ({"busy": bytes([101])}, "sample.overview.busy"),
    ({"busy": [50]}, "sample.overview.busy"),
    ({"wait": [float("nan")]}, "sample.overview.wait"),
    ({"ports": [7]}, "sample.overview.ports"),
    ({"fs": [{"read": 1}]}, "sample.overview.fs[0]"),
    ({"fabric": {"errors": bytes([11])}}, "sample.overview.fabric"),
    ({"busy": bytes([254])}, "sample.overview.busy"),
    ({"wait": [3, -1]}, "sample.overview.wait"),
    ({"wait": [3, True]}, "sample.overview.wait"),
    ({"fs": [{"id": "/home", "read": float("inf")}]}, "sample.overview.fs[0].read"),
    ({"fs": [{"id": "/home", "read": [1, {}]}]}, "sample.overview.fs[0].read"),
    ({"fs": [{"id": "/home", "fstype": "x" * 5000}]}, "sample.overview.fs[0].fstype"),
    ("lots", "sample.overview"),
])
def test_a_bad_overview_is_refused_with_where(overview: object, where: str) -> None:
    data = msgpack.packb({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                          "overview": overview})
    with pytest.raises(ProtocolError) as err:
        decode(data)
    assert where in err.value.reason


def test_an_overviews_file_systems_are_cleaned_on_the_way_in() -> None:
    data = msgpack.packb({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                          "overview": {"fs": [
                              {"id": "/scratch\x1b[2J", "fstype": "lustre", "read": 5},
                              {"id": "/home", "fstype": "nfs4", "read": 1.5,
                               "\x1b]0;x\x07new": "\x9bvalue"}]}})
    sample = decode(data)
    assert isinstance(sample, Sample)
    first, second = sample.extra["overview"]["fs_rows"]  # the first form, made rows
    assert first[0] == "/scratch\\x1b[2J" and first[2] == 5
    assert second == ["/home", "nfs4", 1.5, None, None, None, None]  # the odd key dropped
    rows = msgpack.packb({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                          "overview": {"fs_rows": [["/s\x1b[2J", "lustre", 5, 0, 1.0, 9, 4],
                                                   ["/h", "nfs4", 1, 2, 3, 4, 5, "later"]]}})
    sample = decode(rows)
    assert isinstance(sample, Sample)
    assert [r[0] for r in sample.extra["overview"]["fs_rows"]] == ["/s\\x1b[2J", "/h"]
    rows = msgpack.packb({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                          "overview": {"fs_rows": [["/h", "nfs4", 1, 2, 3, 4, 5, "later"]]}})
    sample = decode(rows)
    assert isinstance(sample, Sample)  # a newer agent's extra column is left out
    assert sample.extra["overview"]["fs_rows"] == [["/h", "nfs4", 1, 2, 3, 4, 5]]


@pytest.mark.parametrize("extra", [
    {"overview": {"fs": [{"id": "/x", b"k": 1}]}},
    {"overview": {b"gpu": 1}},
    {"host": {b"k": 1}},
    {"gpus": [{b"k": 1}]},
    {"fabric": {"ports": [{"id": "p", b"k": 1}]}},
    {b"k": 1},
])
def test_a_binary_map_key_is_refused_not_a_crash(extra: dict[object, object]) -> None:
    # msgpack lets a peer send a map key as a binary: every check that reads keys as
    # strings must refuse it with a reason, never raise something a reader dies of.
    data = msgpack.packb({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                          **extra}, use_bin_type=True)
    for deep in (True, False):
        try:
            decode(data, deep=deep)
        except ProtocolError as exc:
            assert exc.reason
        # deep=False (a relay) may pass what it does not read: its viewers check it


def test_a_small_frame_with_an_extension_type_is_refused() -> None:
    data = msgpack.packb({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                          "overview": {"busy": msgpack.ExtType(5, b"\x01")}})
    with pytest.raises(ProtocolError, match="not a valid msgpack"):
        decode(data)


def test_a_nodes_findings_are_cleaned_and_cannot_name_another_node() -> None:
    from tuimon_core.findings_family import findings_from_wire

    data = msgpack.packb({"v": 1, "t": "sample", "seq": 1, "ts": 1.0, "interval": 1.0,
                          "overview": {"ports": ["mlx5_0:1\x1b]0;pwned\x07"]},
                          "findings": [{"severity": "critical", "kind": "xid",
                                        "message": "\x1b[2J gpu999 GPU 0 XID 79",
                                        "node": "gpu999", "gpu": 0}]})
    sample = decode(data)
    assert isinstance(sample, Sample)
    assert "\x1b" not in sample.extra["overview"]["ports"][0]
    (finding,) = findings_from_wire(sample.extra["findings"], "gpu003")
    assert finding.node == "gpu003" and finding.where == "gpu003 GPU 0"
    assert "\x1b" not in finding.message


def test_the_relays_envelope_read_finds_each_familys_bytes() -> None:
    wire = {"v": 1, "t": "sample", "seq": 5, "ts": 1.0, "interval": 1.0,
            "gpus": [{"util": 0.5}], "overview": {"busy": b"\x32"}, "findings": [],
            "steps": {"jobs": []}}
    from tuimon_core.protocol.codec import sample_spans

    data = msgpack.packb(wire)
    sample = decode(data, deep=False)
    assert isinstance(sample, Sample) and sample.keys == tuple(wire)
    assert sample.gpus is None and "overview" not in sample.extra  # not built
    spans = sample_spans(data)  # found only when a relay must slice the frame
    assert spans is not None and tuple(spans) == tuple(wire)
    for key, (start, end) in spans.items():
        assert msgpack.unpackb(b"\x81" + data[start:end]) == {key: wire[key]}
    big = msgpack.packb({**wire, "host": {"pad": "x" * 4000}})  # past the small size
    stepped = decode(big, deep=False)
    assert isinstance(stepped, Sample) and stepped.spans is not None and stepped.host is None
    assert encode(Subscribe(detail=["a:1"])) != encode(Subscribe())


def test_a_relay_that_checks_frames_whole_still_forwards_them_by_slicing() -> None:
    """The judging relay decodes every frame whole; a viewer that asked for fewer
    families still gets the agent's own bytes of those it keeps, sliced, not the frame
    unpacked and encoded again (which cost the relay a re-encoding per frame)."""
    from tuimon.relay.sample_frame import SampleFrame
    from tuimon_core.protocol import unpack
    from tuimon_core.protocol.families import FAMILY_KEYS

    wire = {"v": 1, "t": "sample", "seq": 5, "ts": 1.0, "interval": 1.0,
            "gpus": [{"util": 0.5}], "host": {"load1": 2.0}, "findings": [],
            "steps": {"jobs": []}}
    data = msgpack.packb(wire)
    sample = decode(data)  # deep, as the judging relay reads
    assert isinstance(sample, Sample) and sample.keys == tuple(wire)
    frame = SampleFrame(sample, data)
    assert frame.encoded(None) is data  # every family: the bytes as they came
    host_only = frame.encoded(frozenset({"host"}))
    assert sample.spans is not None  # found to slice, not unpacked
    family_of = {key: family for family, key in FAMILY_KEYS.items()}
    assert unpack(host_only) == {k: v for k, v in wire.items()
                                 if family_of.get(k, "host") == "host"}


async def test_the_relays_metrics_page_on_what_its_nodes_found(unused_tcp_port_factory) -> None:
    """A GPU falls off the bus: the agent's conditions reach the relay, whose /metrics
    exports the finding (one scrape of the relay covers the cluster)."""
    import aiohttp

    sim = SimCluster(nodes=2, gpus=2, base_port=unused_tcp_port_factory(), interval=0.25,
                     scenario="xid-79", fault_at=0.0, nodes_per_leaf=1)
    async with sim, Relay(relay_config(sim.targets)) as relay:
        failed = sim.truth()["components"][0].split(" GPU ")[0]
        url = f"http://127.0.0.1:{relay.port}/metrics"
        text = ""

        async def scrape() -> str:
            async with aiohttp.ClientSession() as session, session.get(url) as resp:
                return await resp.text()

        for _ in range(100):
            text = await scrape()
            if f'component="{failed} GPU' in text:
                break
            await asyncio.sleep(0.1)
        # The GPU itself is named (the node also counts one GPU fewer than its bus has:
        # a finding of its own).
        line = next(x for x in text.splitlines() if x.startswith("tuimon_finding{")
                    and f'component="{failed} GPU' in x)
        assert 'severity="critical"' in line and f'node="{failed}"' in line
        # Where the relay read it: an agent can name itself as any node, not as any
        # address the relay connects to.
        target = next(t for t, m in zip(sim.targets, sim.members) if m.name == failed)
        assert f'source="{target}"' in line


def test_who_runs_on_a_node_is_in_its_overview_bounded_and_cleaned() -> None:
    """The overview names the node's Slurm jobs, pods and users (and the training jobs
    reporting steps) once each, so a viewer's filter finds a job id on every node; from a
    peer, a list too long is refused with where, and escapes in a name are cleaned."""
    procs = [{"pid": 1, "job": "812345", "user": "ana", "namespace": "ml", "pod": "trainer-0"},
             {"pid": 2, "job": "812345", "user": "ana"}]
    sample = Sample(1, 0.0, 1.0, gpus=[{"util": 0.5, "processes": procs}],
                    extra={"steps": {"jobs": [{"id": "llm-pretrain", "world": 8}]}})
    assert build_overview(None, sample)["who"] == ["812345", "ml/trainer-0", "ana",
                                                   "llm-pretrain"]
    bad = Sample(1, 0.0, 1.0, extra={"overview": {"who": [f"job{i}" for i in range(33)]}})
    with pytest.raises(ProtocolError, match=r"sample\.overview\.who"):
        decode(encode(bad))
    evil = Sample(1, 0.0, 1.0, extra={"overview": {"who": ["ev\x1b]0;pwned\x07il"]}})
    (name,) = decode(encode(evil)).extra["overview"]["who"]
    assert name.isprintable() and "\x1b" not in name


def test_a_metric_that_needs_a_field_has_no_value_without_it() -> None:
    """A metric's `needs` is true of its value: a cell with everything else the metric
    reads, but not that field, is unknown (the level does not call the value there)."""
    from tuimon_core.heat_levels import FABRIC_METRICS, GPU_METRICS, NO_DATA

    class Info:
        max_sm_clock = 1980.0

    for metric in (*GPU_METRICS, *FABRIC_METRICS):
        if metric.needs is None:
            continue
        assert metric.needs in metric.reads
        cell = {key: 50.0 for key in metric.reads if key != metric.needs}
        assert metric.value(cell, Info()) is None, metric.key
        assert metric.level(cell, Info()) == NO_DATA
        assert metric.level({**cell, metric.needs: 50.0}, Info()) != NO_DATA, metric.key
