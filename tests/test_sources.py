"""The viewer's side of the wire: targets, streams to real simulated agents, the model."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent.sim.cluster import SimCluster
from tuimon.model.cluster import ClusterState
from tuimon.sources.agent_stream import AgentStream, StreamOptions, watching
from tuimon.sources.targets import TargetError, parse_targets, read_targets_file


def _vector(result: list[Any]) -> web.Response:
    """A query API's answer with these samples."""
    return web.json_response({"status": "success",
                              "data": {"resultType": "vector", "result": result}})


@contextlib.asynccontextmanager
async def _prometheus_answering(query: Callable[[web.Request], Awaitable[web.Response]]
                                ) -> AsyncIterator[str]:
    """A stand-in for Prometheus' query API on loopback, answering with `query`."""
    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _names_gpus(promql: str) -> bool:
    """Is this the inventory's query of the GPUs' names and UUIDs?"""
    return promql.startswith("group by (gpu,") and "UUID" in promql


ROOT = Path(__file__).resolve().parent.parent


def test_slurm_host_lists_expand_with_padding_and_ports() -> None:
    assert parse_targets(["gpu[001-003,010]:9000"]) == [
        "gpu001:9000", "gpu002:9000", "gpu003:9000", "gpu010:9000"]
    assert parse_targets(["node7"]) == ["node7:9477"]
    assert parse_targets(["rack[1-2]-gpu[1-2]"]) == [
        "rack1-gpu1:9477", "rack1-gpu2:9477", "rack2-gpu1:9477", "rack2-gpu2:9477"]
    assert parse_targets(["[::1]:9000", "a:1", "a:1"]) == ["[::1]:9000", "a:1"]


@pytest.mark.parametrize("bad", ["gpu[3-1]", "gpu[a-b]", "host:notaport", "host:0"])
def test_bad_targets_are_named_in_the_error(bad: str) -> None:
    with pytest.raises(TargetError, match="bad"):
        parse_targets([bad])


def test_targets_file_skips_comments(tmp_path: Path) -> None:
    f = tmp_path / "targets"
    f.write_text("# cluster A\ngpu001:1\n\ngpu002:2  # spare\n")
    assert read_targets_file(f) == ["gpu001:1", "gpu002:2"]
    with pytest.raises(TargetError, match="No such file"):
        read_targets_file(tmp_path / "none")


async def _until(predicate, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def test_a_stopped_node_goes_stale_and_comes_back(unused_tcp_port_factory) -> None:
    base = unused_tcp_port_factory()
    sim = SimCluster(nodes=3, gpus=4, base_port=base, interval=0.2, seed=3)
    cluster = ClusterState("test")
    options = StreamOptions(min_backoff=0.1, max_backoff=0.3)
    async with sim, watching(sim.targets, cluster, options):
        await _until(lambda: cluster.counts()["up"] == 3)
        victim = cluster.nodes[sim.targets[1]]
        assert victim.name == sim.members[1].name and victim.gpu_count == 4
        await sim.stop_node(1)
        await _until(lambda: victim.status in ("stale", "down"))
        assert "connect" in (victim.reason or "") or "closed" in (victim.reason or "")
        # The others keep updating meanwhile.
        other = cluster.nodes[sim.targets[0]]
        seq = other.sample.seq
        await _until(lambda: other.sample.seq > seq + 2)
        assert any(e.kind == "node_lost" for e in cluster.events)
        await sim.start_node(1)
        await _until(lambda: victim.status == "up")
        assert any(e.kind == "node_back" for e in cluster.events)


async def test_wrong_token_is_a_visible_reason(unused_tcp_port_factory) -> None:
    base = unused_tcp_port_factory()
    sim = SimCluster(nodes=1, gpus=1, base_port=base, interval=0.2,
                     token="right-token-0123456789")
    cluster = ClusterState()
    async with sim, aiohttp.ClientSession() as session:
        stream = AgentStream(sim.targets[0], cluster, session,
                             StreamOptions(token="wrong-token-0123456789", min_backoff=0.1))
        task = asyncio.create_task(stream.run())
        try:
            await _until(lambda: cluster.nodes[sim.targets[0]].reason is not None)
            assert "401" in cluster.nodes[sim.targets[0]].reason
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def test_demo_once_prints_the_simulated_cluster(unused_tcp_port: int) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tuimon.cli", "demo", "--nodes", "4", "--once",
         "--base-port", str(unused_tcp_port)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    # Its exit code is the verdict it prints, as `tuimon status` gives it.
    verdict = next(line.split(":")[0] for line in out.stdout.splitlines()
                   if line.startswith(("OK:", "WARNING:", "CRITICAL:")))
    assert out.returncode == {"OK": 0, "WARNING": 1, "CRITICAL": 2}[verdict], out.stderr
    assert "nodes up 4 / stale 0 / down 0" in out.stdout
    assert "GPUs 32" in out.stdout
    # What `status` says, after its waits: the job, its SLI, and the diagnosis.
    assert "job llm-pretrain (32 ranks): SLI 0." in out.stdout, out.stdout
    assert out.stdout.splitlines()[-1].startswith(("info", "warning", "critical", "job")), \
        out.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["connect"], "no targets"),
    (["connect", "gpu[3-1]"], "bad host list"),
    (["connect", "a:1", "--provisioned", "oops"], "expected MOUNT=RATE"),
    (["connect", "a:1", "--provisioned", "/x=4 PB/s"], "expected MOUNT=RATE"),
    (["--config", "/nonexistent/tuimon.toml", "--cluster", "x"], "file not found"),
    (["connect", "a:1", "--topology", "/nonexistent/topology.conf"], "No such file"),
    (["connect", "a:1", "--slo-target", "1.5"],
     "--slo-target: must be between 0 and 1 (e.g. 0.9), got 1.5"),
    (["connect", "a:1", "--baseline", "job=fast"], "expected JOB=SAMPLES/S"),
    (["prom", "http://127.0.0.1:9/", "--node-label", "k8s.node.name", "--once"],
     "--node-label 'k8s.node.name': expected a label name"),
])
def test_connect_refuses_bad_arguments_with_a_clear_message(args: list[str],
                                                            message: str) -> None:
    out = subprocess.run([sys.executable, "-m", "tuimon.cli", *args], capture_output=True,
                         text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2
    assert message in out.stderr


async def test_more_agents_than_aiohttps_default_pool_all_connect(
        unused_tcp_port_factory) -> None:
    # aiohttp pools 100 connections per session by default; a viewer holds one per agent.
    sim = SimCluster(nodes=120, gpus=1, base_port=unused_tcp_port_factory(), interval=1.0,
                     scenario="healthy")
    cluster = ClusterState()
    async with sim, watching(sim.targets, cluster):
        await _until(lambda: cluster.counts()["up"] == 120, timeout=30.0)


async def test_a_multi_tenant_store_gets_the_tenant_asked_for() -> None:
    """Mimir and Cortex answer only a request that names its tenant (X-Scope-OrgID);
    without one they refuse (401, `no org id`), which tuimon says as the server's reason."""
    from tuimon.sources.prometheus import PromError, PromOptions, PromSource

    async def query(request: web.Request) -> web.Response:
        if request.headers.get("X-Scope-OrgID") != "team-a":
            return web.Response(status=401, text="no org id\n")
        return _vector([])

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as session:
            plain = PromSource(url, ClusterState(), session, PromOptions())
            with pytest.raises(PromError, match="refused \\(401\\): no org id"):
                await plain.client.query("up")
            tenant = PromSource(url, ClusterState(), session, PromOptions(tenant="team-a"))
            assert await tenant.client.query("up") == []
    finally:
        await runner.cleanup()


async def test_the_map_draws_a_prometheus_read_as_soon_as_it_is_applied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`tuimon prom` reads the whole cluster at once, every few seconds: the map draws a
    read when it is applied, even just after a tick, not at the next draw timer (up to
    half a second later; never, here)."""
    from tests.test_relay import until
    from tuimon.sources.prometheus import PromOptions, PromSource
    from tuimon.ui import app as app_module
    from tuimon.ui.heatmap import HeatmapView

    temp = {"now": "30"}

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        if temp["now"] == "gone":
            return web.Response(status=503, text="down for maintenance")
        result = [{"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0",
                              "Hostname": "gpu001"}, "value": [1.0, temp["now"]]}] \
            if "DCGM_FI_DEV_GPU_TEMP" in promql and promql.startswith("max by") else []
        return _vector(result)

    monkeypatch.setattr(app_module, "DRAW_EVERY_S", 3600.0)  # no timer draws the map
    redrawn: list[int] = []
    original = HeatmapView.refresh_changed

    def refresh_changed(self: HeatmapView) -> None:
        redrawn.append(1)
        original(self)

    monkeypatch.setattr(HeatmapView, "refresh_changed", refresh_changed)
    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions())
        app = app_module.TuimonApp(cluster, refresh=3600)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("3")  # the map of temperatures
            await source.refresh()
            app.tick()  # a new node is laid out by the tick
            await pilot.pause()
            heat = app.active_map
            row = next(y for y in range(10) if "gpu001" in heat.render_line(y).text)
            cold = heat.render_line(row).text
            redrawn.clear()
            temp["now"] = "90"
            await source.refresh()
            await pilot.pause()
            assert redrawn  # told to draw the changed lines, at once
            assert heat.render_line(row).text != cold
            assert cluster.nodes["gpu001"].sample.gpus[0]["temp"] == 90
            # The server gone: every node marked stale, and drawn so at once too.
            redrawn.clear()
            temp["now"] = "gone"
            task = asyncio.create_task(source.run())
            try:
                await until(lambda: cluster.nodes["gpu001"].status != "up")
                await pilot.pause()
                assert redrawn
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def test_a_failing_inventory_query_leaves_the_refresh_and_is_asked_again() -> None:
    """Only the live queries must answer: the inventory's (here the GPUs' names, refused
    by the server) is logged, kept from before, and asked again at the next refresh."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    asked: list[str] = []

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        asked.append(promql)
        if _names_gpus(promql):
            return web.json_response({"status": "error", "error": "query timed out"},
                                     status=503)
        result = [{"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0",
                              "Hostname": "gpu001"}, "value": [1.0, "61"]}] \
            if "DCGM_FI_DEV_GPU_TEMP" in promql and promql.startswith("max by") else []
        return _vector(result)

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions())
        await source.refresh()
        assert cluster.nodes["gpu001"].status == "up"
        assert cluster.nodes["gpu001"].sample.gpus[0]["temp"] == 61
        before = sum(map(_names_gpus, asked))
        slow_before = sum("DCGM_FI_DEV_POWER_MGMT_LIMIT" in p for p in asked)
        await source.refresh()
        # Asked again, alone: the rest of the inventory answered and is kept.
        assert sum(map(_names_gpus, asked)) == before + 1
        assert sum("DCGM_FI_DEV_POWER_MGMT_LIMIT" in p for p in asked) == slow_before


@pytest.mark.parametrize("drawn", [None, frozenset({"sm_active", "gr_active", "util"})],
                         ids=["every field", "the busy map"])
async def test_a_gpu_that_never_has_a_total_does_not_bring_the_inventory_forward(
        drawn: frozenset[str] | None) -> None:
    """A GPU new since the inventory, with no total yet, brings it forward (15 s); one the
    inventory itself left without a total (an exporter that gives none) does not. The
    same while the map draws no memory (its memory used is not asked)."""
    from tuimon.sources.prometheus import INVENTORY_SOONEST_S, PromOptions, PromSource

    asked: list[str] = []
    hosts = ["gpu001"]

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        asked.append(promql)
        result = [{"metric": {"__name__": name, "gpu": "0", "Hostname": h},
                   "value": [1.0, "100"]} for h in hosts
                  for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP")
                  if promql.startswith("max by (__name__, gpu") and name in promql]
        if "DCGM_FI_DEV_GPU_TEMP" in promql:  # a node's presence, the GPUs drawn only
            if promql.startswith("max by (node,"):
                result = [{"metric": {"Hostname": h}, "value": [1.0, "100"]} for h in hosts]
            elif promql.startswith("group by (gpu,"):
                result = [{"metric": {"gpu": "0", "Hostname": h}, "value": [1.0, "1"]}
                          for h in hosts]
        return _vector(result)

    def inventories() -> int:
        return sum(map(_names_gpus, asked))

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        cluster.set_drawn(drawn)
        source = PromSource(url, cluster, session, PromOptions())
        await source.refresh()
        assert inventories() == 1
        source._last_inventory -= INVENTORY_SOONEST_S + 1  # time passes
        await source.refresh()
        assert inventories() == 1  # the same GPU, still without a total
        hosts.append("gpu002")  # a new node
        await source.refresh()
        source._last_inventory -= INVENTORY_SOONEST_S + 1
        await source.refresh()
        assert inventories() == 2
        assert ("mem_used" in cluster.nodes["gpu002"].sample.gpus[0]) == (drawn is None)


async def test_a_node_known_only_by_fields_the_map_does_not_draw_is_there_until_it_goes(
        ) -> None:
    """Under the busy map a node whose GPUs have no busy series (MIG instances without
    profiling) answers none of the per-GPU queries: its presence, one series a node,
    keeps it up with the GPUs the inventory knows, and its screen's detail query
    selects it by the label that named it; when its series stop, it goes stale at once,
    not at the next inventory."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    there = [True]
    asked: list[str] = []

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        asked.append(promql)
        if not there[0] or "DCGM_FI_DEV_GPU_TEMP" not in promql:
            return _vector([])
        if promql.startswith("max by (node,"):  # the node's presence
            return _vector([{"metric": {"Hostname": "mig001"}, "value": [1.0, "45"]}])
        if promql.startswith("group by (gpu,"):  # the GPUs known only by drawn fields
            return _vector([{"metric": {"gpu": g, "Hostname": "mig001"}, "value": [1.0, "1"]}
                            for g in ("0", "1")])
        return _vector([])

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        cluster.set_drawn(frozenset({"sm_active", "gr_active", "util"}))
        source = PromSource(url, cluster, session, PromOptions())
        await source.refresh()
        node = cluster.nodes["mig001"]
        assert node.status == "up" and node.gpu_count == 2
        cluster.set_detail({"mig001"})  # its screen opened
        await source.refresh()
        await source.refresh()
        assert node.status == "up"
        assert any('Hostname="mig001"' in promql for promql in asked)
        there[0] = False  # its exporter gone: every series stale at the server
        await source.refresh()
        assert node.status != "up" and "no series" in (node.reason or "")


@pytest.mark.parametrize("drawn", [None, frozenset({"sm_active", "gr_active", "util"})])
async def test_a_node_whose_exporter_gives_profiling_fields_only_is_a_node(
        drawn: frozenset[str] | None) -> None:
    """A dcgm-exporter configured with a profiling field alone (the memory interface's
    activity, as one target of a real mixed scrape) answers none of the dense or busy
    queries: the presence query, which asks it whatever the map draws, keeps the node in
    the cluster, up."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        if promql.startswith("max by (node,") and "DCGM_FI_PROF_DRAM_ACTIVE" in promql:
            return _vector([{"metric": {"Hostname": "prof001"}, "value": [1.0, "0.4"]}])
        return _vector([])

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        cluster.set_drawn(drawn)
        source = PromSource(url, cluster, session, PromOptions())
        await source.refresh()
        await source.refresh()
        assert cluster.nodes["prof001"].status == "up"


async def test_a_node_named_only_by_the_hours_increase_is_not_brought_back() -> None:
    """A node whose series stopped is still named by its jobs' increase over the last
    hour: that answer does not make it a node again (nor up); the live node's hour is
    its windows, and a job's hour without its compute is no hour (no SLI of 0)."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    answer_compute = [True]

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        hour = "[1h]" in promql and "increase(tuimon_job_" in promql
        if hour and ("wall" in promql or ("compute" in promql and answer_compute[0])):
            return _vector([{"metric": {"Hostname": h, "job": "train"}, "value": [1.0, v]}
                            for h, v in (("gpu001", "400"), ("gpu009", "400"))])
        if promql.startswith("max by (node,") and "DCGM_FI_DEV_GPU_TEMP" in promql:
            return _vector([{"metric": {"Hostname": "gpu001"}, "value": [1.0, "40"]}])
        if "rate(tuimon_job_" in promql and "[1m]" in promql:
            return _vector([{"metric": {"Hostname": "gpu001", "job": "train", "rank": "0"},
                             "value": [1.0, "0.9" if "wall" in promql else "0.5"]}])
        return _vector([])

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        cluster.set_drawn(frozenset({"sm_active", "gr_active", "util"}))
        source = PromSource(url, cluster, session, PromOptions())
        await source.refresh()
        assert "gpu009" not in cluster.nodes, list(cluster.nodes)
        assert set(source.reader.frames.hours) == {"gpu001"}
        answer_compute[0] = False
        source._last_budget -= 3600
        await source.refresh()
        assert source.reader.frames.hours == {}


async def test_a_new_gpu_reads_the_recorded_inventory_again_until_the_record_has_it() -> None:
    """With --recorded the inventory's records are up to a minute older than their read:
    a GPU new since, without its total, brings the inventory forward again while the
    record lacks it (not once, as the query's own answer, which would leave it lacking
    for a minute more), and its total comes with the read after the record has it."""
    from tuimon.sources.prom_live_rules import inventory_name, record_name
    from tuimon.sources.prometheus import INVENTORY_SOONEST_S, PromOptions, PromSource

    hosts, recorded_hosts = ["gpu001"], ["gpu001"]
    reads = [0]

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        if record_name("gpu_busy") in promql:
            return _vector([{"metric": {"node": h, "gpu": "0",
                                        "tuimon_series": "DCGM_FI_DEV_GPU_UTIL"},
                             "value": [2.0, "40"]} for h in hosts])
        if inventory_name("gpu_total") in promql:
            reads[0] += 1
            return _vector([{"metric": {"node": h, "gpu": "0",
                                        "tuimon_series": "tuimon:dcgm_fb_total"},
                             "value": [2.0, "81920"]} for h in recorded_hosts])  # MiB
        return _vector([])

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions(recorded=True))
        await source.refresh()
        assert reads[0] == 1 and cluster.nodes["gpu001"].sample.gpus[0]["mem_total"]
        hosts.append("gpu002")  # a new node, not yet in the inventory's record
        await source.refresh()
        for expected in (2, 3):  # brought forward, and again: the record still lacks it
            source._last_inventory -= INVENTORY_SOONEST_S + 1  # time passes
            await source.refresh()
            assert reads[0] == expected
            assert "mem_total" not in cluster.nodes["gpu002"].sample.gpus[0]
        recorded_hosts.append("gpu002")  # the records evaluated again
        source._last_inventory -= INVENTORY_SOONEST_S + 1
        await source.refresh()
        assert cluster.nodes["gpu002"].sample.gpus[0]["mem_total"] == 80 << 30
        source._last_inventory -= INVENTORY_SOONEST_S + 1
        await source.refresh()
        assert reads[0] == 4  # nothing lacks its total now: not brought forward
        # A GPU whose exporter gives no total at all: brought forward while the records
        # may not have it yet, a minute, then no more.
        hosts.append("gpu003")
        await source.refresh()
        source._last_inventory -= INVENTORY_SOONEST_S + 1
        await source.refresh()
        assert reads[0] == 5
        lacking = source.reader.inventory.lacking_since
        source.reader.inventory.lacking_since = {k: t - 61 for k, t in lacking.items()}
        for _ in range(3):
            source._last_inventory -= INVENTORY_SOONEST_S + 1
            await source.refresh()
        assert reads[0] == 6


@pytest.mark.parametrize("later", [False, True], ids=["from the start", "after a refresh"])
async def test_a_gpu_known_only_by_a_field_the_map_does_not_draw_stays_and_a_lost_one_goes(
        later: bool) -> None:
    """While the map draws no clock, a GPU whose only series is its clock (as on a real
    A800 node) is still one of the node's GPUs, whether the map drew no clock from the
    start or since a refresh that asked every field (whose inventory did not ask which
    GPUs those are); a GPU whose series stop is gone, though the inventory saw its clock
    a minute before."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    temps = {"0": 61, "1": 62}  # GPU 2 has only its clock

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        host = {"Hostname": "gpu001"}
        result = []
        if promql.startswith("group by (gpu, GPU_I_ID"):  # GPUs known by fields not asked
            result = [{"metric": {**host, "gpu": g}, "value": [1.0, "1"]}
                      for g in sorted({*([*temps, "2"] if "DCGM_FI_DEV_SM_CLOCK" in promql
                                         else []),  # a GPU fallen off the bus has no clock
                                       *(temps if "DCGM_FI_DEV_GPU_TEMP" in promql else [])})]
        elif promql.startswith("max by (__name__, gpu"):
            result = [{"metric": {**host, "gpu": g, "__name__": "DCGM_FI_DEV_GPU_TEMP"},
                       "value": [1.0, str(t)]} for g, t in temps.items()
                      if "DCGM_FI_DEV_GPU_TEMP" in promql]  # the temperature map
            if "DCGM_FI_DEV_SM_CLOCK" in promql:  # the clock map
                result.append({"metric": {**host, "gpu": "2", "__name__":
                                          "DCGM_FI_DEV_SM_CLOCK"}, "value": [1.0, "1410"]})
        return _vector(result)

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions())
        if later:
            await source.refresh()
            source._beside = True  # as run() after its first: the inventory asked beside
        cluster.set_drawn(frozenset({"temp"}))
        await source.refresh()
        node = cluster.nodes["gpu001"]
        assert [g.get("temp") for g in node.sample.gpus] == [61, 62, None]
        del temps["1"]  # GPU 1 falls off the bus: none of its series answers
        await source.refresh()
        assert [g.get("temp") for g in node.sample.gpus] == [61, None]
        assert [i.index for i in node.hello.gpus] == [0, 2]
        # The clock map, then back: asked again which GPUs are known only by the fields
        # not asked now; GPU 2 stays throughout.
        for drawn in ({"sm_clock"}, {"temp"}):
            cluster.set_drawn(frozenset(drawn))
            if drawn == {"sm_clock"}:
                source._last_inventory -= 60  # a new inventory under the clock map
            await source.refresh()
            if source._later is not None:  # asked beside: taken up by the next refresh
                await source._later
                await source.refresh()
            assert [i.index for i in node.hello.gpus] == [0, 2], drawn
        # An inventory asked beside under the clock map and taken up after the switch
        # back: its GPUs are of other fields than those not asked now, and not taken.
        source._beside = True
        cluster.set_drawn(frozenset({"sm_clock"}))
        await source.refresh()
        source._last_inventory -= 60
        await source.refresh()  # asks it beside
        cluster.set_drawn(frozenset({"temp"}))
        await source.refresh()
        if source._later is not None:
            await source._later
        await source.refresh()
        assert [i.index for i in node.hello.gpus] == [0, 2]


async def test_the_inventory_is_kept_between_its_runs_and_a_new_one_replaces_it() -> None:
    """What the inventory says (here a GPU's UUID, which changes when the GPU is swapped)
    is kept between its runs, not asked at every refresh, and the next inventory's answer
    replaces it on the node's screen."""
    from tuimon.sources import prom_queries as q
    from tuimon.sources.prometheus import PromOptions, PromSource

    uuid = ["GPU-aaaa"]

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        labels = {"gpu": "0", "Hostname": "gpu001"}
        result = []
        if _names_gpus(promql):
            result = [{"metric": {**labels, "UUID": uuid[0]}, "value": [1.0, "1"]}]
        elif promql.startswith("max by") and "DCGM_FI_DEV_GPU_TEMP" in promql:
            result = [{"metric": {**labels, "__name__": "DCGM_FI_DEV_GPU_TEMP"},
                       "value": [1.0, "61"]}]
        return _vector(result)

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions())
        await source.refresh()
        assert cluster.nodes["gpu001"].hello.gpus[0].uuid == "GPU-aaaa"
        uuid[0] = "GPU-bbbb"  # the GPU swapped
        await source.refresh()  # no inventory due: the kept one still says
        assert cluster.nodes["gpu001"].hello.gpus[0].uuid == "GPU-aaaa"
        assert cluster.nodes["gpu001"].sample.gpus[0]["temp"] == 61
        source._last_inventory -= q.INVENTORY_EVERY_S + 1  # time passes
        await source.refresh()
        assert cluster.nodes["gpu001"].hello.gpus[0].uuid == "GPU-bbbb"
        assert cluster.nodes["gpu001"].sample.gpus[0]["temp"] == 61


async def test_a_node_the_server_has_not_scraped_since_is_not_sent_again() -> None:
    """A refresh every 5 s over a scrape every 15 s finds most nodes as they were: those
    are not sent again (the viewer's work per node is the cost at 4096 nodes), a node
    whose values moved is, and a node that was lost comes back with the same values."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    temps = {"gpu001": "61", "gpu002": "70"}

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        result = []
        if promql.startswith("max by") and "DCGM_FI_DEV_GPU_TEMP" in promql:
            result = [{"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0",
                                  "Hostname": host}, "value": [1.0, temp]}
                      for host, temp in temps.items()]
        return _vector(result)

    sent: list[str] = []
    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions(
            recorder=lambda target, data: sent.append(target)))
        await source.refresh()
        assert sorted(set(sent)) == ["gpu001", "gpu002"]
        sent.clear()
        temps["gpu002"] = "72"  # scraped again since; gpu001 not
        await source.refresh()
        assert sent == ["gpu002"]
        assert cluster.nodes["gpu001"].sample.gpus[0]["temp"] == 61
        assert cluster.nodes["gpu002"].sample.gpus[0]["temp"] == 72
        cluster.mark_stale("gpu001", "prometheus unreachable")
        sent.clear()
        await source.refresh()
        assert sent == ["gpu001"]
        assert cluster.nodes["gpu001"].status == "up"


async def test_a_node_not_sent_again_is_still_seen_and_its_screen_gets_its_values() -> None:
    """A node as it was (not sent again) is still heard from: lost later, it is stale
    for its last word a moment ago, not down for the last sample minutes ago; and its
    screen, closed and opened again between two refreshes, gets its whole sample."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    there = [True]

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        result = []
        if there[0] and promql.startswith("max by") and "DCGM_FI_DEV_GPU_TEMP" in promql:
            result = [{"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0",
                                  "Hostname": "gpu001"}, "value": [1.0, "61"]}]
        return _vector(result)

    clock = [1000.0]
    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState(clock=lambda: clock[0])
        source = PromSource(url, cluster, session, PromOptions())
        await source.refresh()
        node = cluster.nodes["gpu001"]
        for _ in range(14):  # 70 s of refreshes, the values never moving
            clock[0] += 5.0
            await source.refresh()
        assert node.last_seen == clock[0]
        cluster.set_detail({"gpu001"})
        cluster.set_detail(set())  # closed: its whole sample let go
        assert node.detail is None
        cluster.set_detail({"gpu001"})
        clock[0] += 5.0
        await source.refresh()
        assert node.detail is not None and node.detail.gpus[0]["temp"] == 61
        there[0] = False  # its series vanish
        clock[0] += 5.0
        await source.refresh()
        assert node.status == "stale", (node.status, node.reason)


def _symbol_errors(symbols: list[str | None]
                   ) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A query API answering the error counters' query with one port of our agent on
    gpu001: its state, and its symbol errors as `symbols[0]` (None: neither, the node
    gone from the answers)."""
    port = {"node": "gpu001", "device": "mlx5_0", "port": "1"}

    async def query(request: web.Request) -> web.Response:
        result = []
        if symbols[0] is not None and "tuimon_read" in request.query["query"]:
            result = [{"metric": {**port, "__name__": "tuimon_ib_port_symbol_errors_total"},
                       "value": [1.0, symbols[0]]},
                      {"metric": {**port, "__name__": "tuimon_ib_port_state_id",
                                  "tuimon_read": "1"}, "value": [1.0, "4"]}]
        return _vector(result)
    return query


async def _errors_after_refresh(source: Any, cluster: ClusterState) -> object:
    """A refresh, then the errors counted on gpu001's one port (its `errors_inc`)."""
    await source.refresh()
    (p,) = cluster.nodes["gpu001"].sample.extra["fabric"]["ports"]
    return p.get("errors_inc")


async def test_port_errors_of_our_agent_count_with_a_counter_stuck_and_after_a_gap() -> None:
    """Our agent leaves out a counter stuck at its maximum (link_downed is 8 bits): the
    port's other errors still count. A node missing from the answers for a while (its
    scrapes failing for minutes) counts on from its last reading when it is back."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    symbols: list[str | None] = ["10"]
    async with _prometheus_answering(_symbol_errors(symbols)) as url, \
            aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions(errors_every=0))

        async def errors() -> object:
            return await _errors_after_refresh(source, cluster)

        assert await errors() is None  # ten from before: not news
        symbols[0] = "500"
        assert await errors() == {"symbol_errors": 490}
        symbols[0] = None  # gone from the answers (and the node with it)
        for _ in range(3):
            await source.refresh()
        symbols[0] = "520"
        assert await errors() == {"symbol_errors": 20}


async def test_port_errors_are_read_every_15_s_and_counted_whole() -> None:
    """The error counters are the costliest query at a large site, and a scrape every
    15 s has nothing newer: read every 15 s, what grew between two reads is counted at
    the second, none lost, also when read beside the refreshes."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    symbols: list[str | None] = ["10"]
    async with _prometheus_answering(_symbol_errors(symbols)) as url, \
            aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions(every=5.0))

        async def errors() -> object:
            return await _errors_after_refresh(source, cluster)

        assert await errors() is None  # read: ten from before, not news
        symbols[0] = "30"
        assert await errors() is None  # not read again yet
        symbols[0] = "50"
        source._last_errors -= 15  # 15 s on
        assert await errors() == {"symbol_errors": 40}
        symbols[0] = "55"
        source._last_errors -= 15
        assert await errors() == {"symbol_errors": 5}
        # As run() after its first refresh: read beside the refreshes, counted by the
        # refresh that takes the answer up.
        source._beside = True
        source._last_errors -= 15
        symbols[0] = "62"
        assert await errors() != {"symbol_errors": 7}  # asked beside, not yet read
        assert source._later is not None
        await source._later
        assert await errors() == {"symbol_errors": 7}
        if source._later is not None:  # the next read, asked beside: as run() ends
            source._later.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await source._later


async def test_a_refresh_asked_early_sums_the_jobs_rates_over_the_time_since_the_last() -> None:
    """A refresh the view asks for at once (a metric switched) comes soon after the last:
    a rank's wall seconds are its rate over that time, not over a whole interval again."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        labels = {"Hostname": "gpu001", "exported_job": "train", "rank": "0"}
        result = [{"metric": labels, "value": [1.0, "1"]}] \
            if promql.startswith("rate(tuimon_job_wall_seconds_total") else []
        return _vector(result)

    def wall() -> float:
        steps = cluster.nodes["gpu001"].sample.extra["steps"]
        return steps["jobs"][0]["ranks"][0]["wall"]

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions(every=5.0))
        await source.refresh()
        assert wall() == 5.0  # the first: one interval
        await source.refresh()
        assert wall() < 1.0  # a moment later


def test_every_field_asked_only_while_drawn_is_drawn_by_some_map() -> None:
    """Else no map could ever bring it back: a metric that reads it, on either map."""
    from tuimon.sources import prom_queries as q
    from tuimon_core.heat_levels import FABRIC_METRICS, GPU_METRICS

    gpu = {key for m in GPU_METRICS for key in m.reads}
    fabric = {key for m in FABRIC_METRICS for key in m.reads}
    assert gpu >= q.DRAWN_ONLY_GPU
    assert set(q.DRAWN_ONLY_PORT.values()) <= fabric
    assert all(q.skipped(m.reads, False).isdisjoint(
        n for n, key in q.DRAWN_ONLY_PORT.items() if key in m.reads) for m in FABRIC_METRICS)


async def test_once_does_not_ask_the_port_error_counters_it_could_not_count() -> None:
    """`tuimon prom --once` reads each counter once: what a port counted before is not
    news, so the costliest query at a large site is not sent; its ports still show. Of
    every GPU it asks what the readout shows."""
    from tests.conftest import run_tuimon
    from tuimon.sources import prom_queries as q

    asked: list[str] = []
    port = {"instance": "gpu001:9100", "device": "mlx5_0", "port": "1"}

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        asked.append(promql)
        result = [{"metric": {"instance": "gpu001:9100", "nodename": "gpu001"},
                   "value": [1.0, "1"]}] if promql.startswith("max by (instance, nodename)") \
            else [{"metric": port, "value": [1.0, "1000"]}] \
            if "port_transmit_wait" in promql else []
        return _vector(result)

    async with _prometheus_answering(query) as url:
        code, out = await run_tuimon("prom", url, "--once")
    assert code == 0, out
    assert "gpu001" in out
    counters = [name for name, (_, ours) in q.PORT_ERROR_SERIES.items() if not ours]
    assert any("port_transmit_wait" in a for a in asked)
    assert not any(name in a for a in asked for name in counters)
    # Every GPU's values as the readout shows them: power, not the clock.
    dense = [a for a in asked if a.startswith("max by (__name__, gpu")]
    assert any("DCGM_FI_DEV_POWER_USAGE" in a for a in dense)
    assert not any("DCGM_FI_DEV_SM_CLOCK" in a for a in dense)


async def test_the_inventory_runs_beside_the_refreshes_and_is_taken_up_when_it_comes(
        ) -> None:
    """At a large site the inventory's queries take seconds of the server's time: the
    live refreshes go on while they run, and what they bring (a swapped GPU's UUID) is
    shown by the first refresh after it comes."""
    from tests.test_relay import until
    from tuimon.sources.prometheus import PromOptions, prom_watching

    uuid, slow = ["GPU-aaaa"], [0.0]

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        labels = {"gpu": "0", "Hostname": "gpu001"}
        result = []
        if _names_gpus(promql):
            await asyncio.sleep(slow[0])
            result = [{"metric": {**labels, "UUID": uuid[0]}, "value": [1.0, "1"]}]
        elif promql.startswith("max by (__name__, gpu") and "DCGM_FI_DEV_GPU_TEMP" in promql:
            result = [{"metric": {**labels, "__name__": "DCGM_FI_DEV_GPU_TEMP"},
                       "value": [1.0, "61"]}]
        return _vector(result)

    def shown() -> str | None:
        node = cluster.nodes.get("gpu001")
        return node.hello.gpus[0].uuid if node and node.hello else None

    cluster = ClusterState()
    async with _prometheus_answering(query) as url, \
            prom_watching(url, cluster, PromOptions(every=0.2, timeout=10)) as source:
        await until(lambda: shown() == "GPU-aaaa" and source.refreshes >= 2)
        uuid[0], slow[0] = "GPU-bbbb", 3.0
        source._last_inventory -= 120  # the inventory is due
        seen = source.refreshes
        await until(lambda: source.refreshes >= seen + 3, timeout=2.5)  # 0.5 s apart
        assert shown() == "GPU-aaaa"  # its query still running
        await until(lambda: shown() == "GPU-bbbb", timeout=6)


async def test_the_inventory_beside_runs_every_60_s_though_one_query_always_fails() -> None:
    """The inventory's queries asked beside the refreshes keep their cadence: one that
    fails every time is asked again alone, and that does not put off the rest; the
    whole inventory is not asked twice in a row when a run of it is taken up."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    asked: list[str] = []

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        asked.append(promql)
        if _names_gpus(promql):
            return web.json_response({"status": "error", "error": "too big"}, status=422)
        result = [{"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0",
                              "Hostname": "gpu001"}, "value": [1.0, "61"]}] \
            if promql.startswith("max by (__name__, gpu") and "GPU_TEMP" in promql else []
        return _vector(result)

    def limits() -> int:  # the slow GPU values: asked with every whole inventory
        return sum("DCGM_FI_DEV_POWER_MGMT_LIMIT" in p for p in asked)

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        source = PromSource(url, ClusterState(), session, PromOptions())
        await source.refresh()  # the first, inline
        first = source._last_inventory
        source._beside = True  # as run() does after it

        async def refresh_and_take() -> None:
            await source.refresh()  # asks beside, if anything is due
            if source._later is not None:
                await source._later
            await source.refresh()  # takes it up

        for _ in range(3):
            await refresh_and_take()
        assert sum(map(_names_gpus, asked)) >= 3  # the failing one, again and again
        assert limits() == 1 and source._last_inventory == first
        source._last_inventory -= 60  # a minute on
        await refresh_and_take()
        assert limits() == 2
        await refresh_and_take()
        assert limits() == 2  # not again at once
        if source._later is not None:  # the failing one's next try: as run() ends
            source._later.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await source._later


async def test_a_port_known_by_its_state_stays_between_two_reads_of_its_counters() -> None:
    """Between two reads of the error counters (every 15 s), a port with no other series
    asked (no xmit_wait, its traffic not drawn) is still one of the node's ports, and its
    hello is not sent again; gone from the next read, it is gone."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    symbols: list[str | None] = ["0"]
    errors = _symbol_errors(symbols)

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        if promql.startswith("max by (node,") and "tuimon_gpu_temperature_celsius" in promql:
            return _vector([{"metric": {"node": "gpu001"}, "value": [1.0, "61"]}])  # is there
        if promql.startswith("(max by (__name__, gpu") and \
                "tuimon_gpu_utilization_ratio" in promql:
            return _vector([{"metric": {"__name__": "tuimon_gpu_utilization_ratio",
                                        "gpu": "0", "node": "gpu001"}, "value": [1.0, "0.6"]}])
        return await errors(request)

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        cluster.set_drawn(frozenset({"sm_active", "gr_active", "util"}))
        source = PromSource(url, cluster, session, PromOptions())

        def ports() -> list[str]:
            return [p["id"] for p in cluster.nodes["gpu001"].sample.extra["fabric"]["ports"]]

        await source.refresh()
        hello = cluster.nodes["gpu001"].hello
        await source.refresh()
        assert ports() == ["mlx5_0:1"] and cluster.nodes["gpu001"].hello is hello
        symbols[0] = None  # the port is gone
        source._last_errors -= 15
        await source.refresh()
        assert "fabric" not in cluster.nodes["gpu001"].sample.extra


@pytest.mark.parametrize("recorded", [False, True], ids=["built", "bytes"])
async def test_a_hostile_label_is_cleaned_or_refuses_only_its_node(recorded: bool) -> None:
    """A port named with terminal escapes is drawn without them, and a port name past
    any bound refuses that node's frame with a reason, while the other nodes go on:
    the same whether the frame is checked as built or as the bytes `tuimon record`
    keeps."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    devices = {"gpu001": "mlx5_\x1b[2J\x1b]0;owned\x07", "gpu002": "m" * 5000,
               "gpu003": "mlx5_0"}

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        result = []
        if "node_infiniband_state_id" in promql and "!=" not in promql:
            result = [{"metric": {"__name__": "node_infiniband_state_id", "device": device,
                                  "port": "1", "instance": f"{host}:9100"},
                       "value": [1.0, "4"]} for host, device in devices.items()]
        return _vector(result)

    kept: list[str] = []
    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions(
            recorder=(lambda target, data: kept.append(target)) if recorded else None))
        await source.refresh()
    nodes = cluster.nodes
    assert nodes["gpu003"].status == "up"
    assert [p["id"] for p in nodes["gpu003"].sample.extra["fabric"]["ports"]] == ["mlx5_0:1"]
    hostile = nodes["gpu001"]
    assert hostile.status == "up"
    (port,) = hostile.sample.extra["fabric"]["ports"]
    assert "\x1b" not in port["id"] and "\x07" not in port["id"]
    assert port["id"].startswith("mlx5_") and port["id"].endswith(":1")
    assert all("\x1b" not in p for p in hostile.port_ids)
    refused = nodes["gpu002"]
    assert refused.status != "up" and refused.sample is None
    assert "bad frame" in (refused.reason or "") and "ports" in (refused.reason or "")
    assert cluster.protocol_errors >= 1


def _records_answer(promql: str, evaluated: str) -> web.Response | None:
    """A stand-in's answer to the records' evaluation time (`evaluated`) and to the
    busy record (gpu001's one GPU at 40 %); None for any other query."""
    from tuimon.sources.prom_live_rules import record_name

    if promql.startswith("label_replace(max(timestamp("):
        return _vector([{"metric": {"tuimon_record": name}, "value": [2.0, evaluated]}
                        for name in re.findall(r'"tuimon:live_(\w+)"', promql)])
    if record_name("gpu_busy") in promql:
        return _vector([{"metric": {"node": "gpu001", "gpu": "0",
                                    "tuimon_series": "DCGM_FI_DEV_GPU_UTIL"},
                         "value": [2.0, "40"]}])
    return None


async def _standing_source(url: str, session: aiohttp.ClientSession) -> tuple[ClusterState, Any]:
    """A --recorded source as run() has it after its first refresh: a read done, and a
    refresh since that stood on it (the records as they were)."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    cluster = ClusterState()
    source = PromSource(url, cluster, session, PromOptions(recorded=True))
    await source.refresh()
    source._beside = True  # as run() after its first refresh
    await source.refresh()
    await source.refresh()
    assert not source.last_refresh_read
    return cluster, source


async def test_recorded_refreshes_of_a_node_with_jobs_read_every_time() -> None:
    """The records as they were spare a refresh only where no node has jobs: a job's
    steps are counted per refresh, so those refreshes read the server every time, and
    do not ask when the records were evaluated."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    with_jobs = [False]
    asked_time = [0]

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        asked_time[0] += promql.startswith("label_replace(max(timestamp(")
        answer = _records_answer(promql, "1000")  # never evaluated again
        if answer is not None:
            return answer
        if with_jobs[0] and "tuimon_job_" in promql and "increase" not in promql:
            return _vector([{"metric": {"node": "gpu001", "exported_job": "train",
                                        "rank": "0"},
                             "value": [2.0, "1"]}])
        return _vector([])

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        for jobs in (False, True):
            with_jobs[0] = jobs
            asked_time[0] = 0
            cluster = ClusterState()
            source = PromSource(url, cluster, session, PromOptions(recorded=True))
            await source.refresh()
            source._beside = True  # as run() after its first refresh
            read = []
            for _ in range(3):
                await source.refresh()
                read.append(source.last_refresh_read)
            assert read == ([True] * 3 if jobs else [True, False, False]), jobs
            assert asked_time[0] == (0 if jobs else 3)
            assert cluster.nodes["gpu001"].status == "up"


async def test_recorded_refreshes_that_stand_leave_the_error_counters_to_the_next_read(
        ) -> None:
    """What the task beside brought (here the error counters) while the records were as
    they were waits for the next refresh that reads them, and is counted whole there;
    no other read of the counters is started meanwhile."""
    from tuimon.sources.prom_live_rules import record_name
    from tuimon.sources.prometheus import PromOptions, PromSource

    evaluated = ["1000"]
    errors_asked = [0]

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        port = {"node": "gpu001", "device": "mlx5_0", "port": "1"}
        answer = _records_answer(promql, evaluated[0])
        if answer is not None:
            return answer
        if record_name("ib_errors") in promql:
            errors_asked[0] += 1
            return _vector([
                {"metric": {**port, "tuimon_series": "tuimon_ib_port_symbol_errors_total"},
                 "value": [2.0, str(10 * errors_asked[0])]},
                {"metric": {**port, "tuimon_series": "tuimon_ib_port_state_id"},
                 "value": [2.0, "4"]}])
        return _vector([])

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions(recorded=True, errors_every=0))
        await source.refresh()  # the first, inline: the counters at 10
        source._beside = True  # as run() after its first refresh
        await source.refresh()
        assert source.last_refresh_read and source._later is not None
        await source._later  # the counters at 20, not yet taken up
        for _ in range(2):
            await source.refresh()
            assert not source.last_refresh_read
        assert errors_asked[0] == 2
        evaluated[0] = "1015"  # the records evaluated again
        await source.refresh()
        assert source.last_refresh_read
        (p,) = cluster.nodes["gpu001"].sample.extra["fabric"]["ports"]
        assert p.get("errors_inc") == {"symbol_errors": 10}


async def test_the_fields_a_refresh_did_not_ask_are_known_until_the_next_asks_them() -> None:
    """Right after a switch to the memory map the model knows its values were not asked
    (the legend says "asking"), and no longer once the refresh the switch woke has read
    them."""
    from tuimon.sources.prometheus import PromOptions, PromSource
    from tuimon_core.heat_levels import GPU_METRICS

    busy, memory = GPU_METRICS[0].reads, GPU_METRICS[1].reads

    async def query(request: web.Request) -> web.Response:
        return _vector([])

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        cluster.set_drawn(busy)
        source = PromSource(url, cluster, session, PromOptions())
        assert not cluster.asking(memory)  # nothing read yet: nothing said
        await source.refresh()
        assert not cluster.asking(busy) and cluster.asking(memory)
        cluster.set_drawn(memory)
        assert cluster.asking(memory)
        await source.refresh()
        assert not cluster.asking(memory)


async def test_a_recorded_read_that_failed_is_not_stood_on() -> None:
    """The server away for a moment: the refresh fails and marks the nodes stale; the
    next one, with the records as they were, reads again and brings them back."""
    from tuimon.sources.prometheus import PromError

    down = [False]

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        if down[0]:
            return web.Response(status=503, text="unavailable")
        return _records_answer(promql, "1000") or _vector([])

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster, source = await _standing_source(url, session)
        down[0] = True  # the evaluation time unknown too: this refresh reads, and fails
        with pytest.raises(PromError):
            await source.refresh()
        cluster.mark_stale("gpu001", "prometheus unreachable")  # as run() does
        down[0] = False
        await source.refresh()
        assert source.last_refresh_read and cluster.nodes["gpu001"].status == "up"


async def test_recorded_refreshes_read_when_the_series_that_told_the_time_is_gone() -> None:
    """The evaluation time is asked of one series of each record, as the last read
    found it: where that series is gone (its node left), the refresh reads, and asks
    the time again after."""
    gone = [False]

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        if gone[0] and promql.startswith("label_replace(max(timestamp("):
            return _vector([])
        return _records_answer(promql, "1000") or _vector([])


    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        _, source = await _standing_source(url, session)
        gone[0] = True
        await source.refresh()
        assert source.last_refresh_read
        gone[0] = False
        await source.refresh()  # the time known again: this read's to stand on
        assert source.last_refresh_read
        await source.refresh()
        assert not source.last_refresh_read


async def test_a_node_with_a_hostile_mount_point_is_not_sent_again_unchanged() -> None:
    """A mount point with terminal escapes is drawn cleaned, and the node, as the server
    gave it, is still compared as it was: not sent again while nothing moved."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    async def query(request: web.Request) -> web.Response:
        if request.query["query"].startswith("node_filesystem_size_bytes"):
            return _vector([{"metric": {"__name__": "node_filesystem_size_bytes",
                                        "instance": "gpu001:9100", "fstype": "nfs",
                                        "device": "srv:/home", "mountpoint": "/mnt/\x1b[2Jx"},
                             "value": [1.0, "1e12"]}])
        return _vector([])

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions())
        await source.refresh()
        node = cluster.nodes["gpu001"]
        (fs,) = node.sample.extra["storage"]["filesystems"]
        assert "\x1b" not in fs["id"] and fs["id"].startswith("/mnt/")
        sent = node.sample
        await source.refresh()
        assert node.sample is sent  # as it was: not sent again
        assert node.status == "up"


async def test_recorded_refreshes_read_each_evaluation_once_it_is_stored_whole() -> None:
    """Each record's evaluation time is compared with its own at the last read. One
    evaluated before the other (a group's records are stored one after another, for
    longer than a refresh at thousands of nodes) is read with the other once it comes,
    not before; one whose rule fails (its time stuck) holds back the others' new values
    until the next evaluation is due, once, and not after."""
    from tuimon.sources.prom_live_rules import record_name

    times = {"gpu_busy": "1000", "ib_wait": "1000"}

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        if promql.startswith("label_replace(max(timestamp("):
            return _vector([{"metric": {"tuimon_record": name}, "value": [2.0, times[name]]}
                            for name in re.findall(r'"tuimon:live_(\w+)"', promql)])
        if record_name("ib_wait") in promql:
            return _vector([{"metric": {"node": "gpu001", "device": "mlx5_0", "port": "1"},
                             "value": [2.0, "5"]}])
        return _records_answer(promql, "1000") or _vector([])

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        _, source = await _standing_source(url, session)
        assert set(source.records.probes) == {"gpu_busy", "ib_wait"}

        async def reads(count: int) -> list[bool]:
            out = []
            for _ in range(count):
                await source.refresh()
                out.append(source.last_refresh_read)
            return out

        # Evaluated every 15 s, a refresh every 5 s: waits two refreshes at most.
        times["gpu_busy"] = "1015"  # the group evaluated, its first record stored
        assert await reads(2) == [False, False]  # waits for the rest
        times["ib_wait"] = "1015"
        assert await reads(3) == [True, False, False]  # read once, whole
        times["gpu_busy"] = "1030"
        assert await reads(1) == [False]
        times["ib_wait"] = "1030"
        assert await reads(2) == [True, False]
        times["gpu_busy"] = "1045"  # evaluated again; the port record's rule fails
        assert await reads(4) == [False, False, True, False]
        # Behind since then: stuck, not waited for, however often the others move.
        for at in range(1060, 1135, 15):
            times["gpu_busy"] = str(at)
            assert await reads(1) == [True]
        # A wait that a newer evaluation overtakes (the ruler skipped one, the port
        # record failing once) reads it at once: it does not chase the next.
        times["ib_wait"] = times["gpu_busy"] = "1150"
        assert await reads(1) == [True]
        for at, read in ((1165, False), (1180, True), (1195, True)):
            times["gpu_busy"] = str(at)
            assert await reads(1) == [read], at
        # Rules evaluated as often as the refreshes (every 5 s): no refresh fits before
        # the next evaluation, none waits.
        times["ib_wait"] = times["gpu_busy"] = "1200"
        assert await reads(1) == [True]
        times["gpu_busy"] = "1205"
        assert await reads(1) == [True]


async def test_a_port_whose_state_was_read_is_active_unless_the_live_query_says_not() -> None:
    """The live query asks only the ports not ACTIVE: a port whose state series the
    last read of its counters saw, and that query does not name, is ACTIVE on its
    node's screen, not unknown; one it names is as it says."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    symbols: list[str | None] = ["0"]
    errors = _symbol_errors(symbols)
    down = [False]

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        if down[0] and "!= 4" in promql:
            return _vector([{"metric": {"__name__": "tuimon_ib_port_state_id",
                                        "node": "gpu001", "device": "mlx5_0", "port": "1"},
                             "value": [1.0, "1"]}])
        if promql.startswith("max by (__name__, gpu") and \
                "tuimon_gpu_temperature_celsius" in promql:  # the node, every refresh
            return _vector([{"metric": {"__name__": "tuimon_gpu_temperature_celsius",
                                        "gpu": "0", "node": "gpu001"}, "value": [1.0, "61"]}])
        return await errors(request)

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions())

        def state() -> object:
            node = cluster.nodes["gpu001"]
            assert node.status == "up"
            (port,) = node.sample.extra["fabric"]["ports"]
            return port.get("state_name")

        await source.refresh()
        assert state() == "ACTIVE"
        await source.refresh()  # between two reads of the counters
        assert state() == "ACTIVE"
        # the counters' read failing since: two intervals
        source.reader.assembler.ports.read_at -= 31
        await source.refresh()
        assert state() is None  # unknown, not ACTIVE on an old word
        down[0] = True
        await source.refresh()
        assert state() == "DOWN"


async def test_a_port_read_down_is_not_made_active_by_a_live_query_with_no_answer() -> None:
    """The live query of the states other than ACTIVE may have no answer of its own (a
    record whose rule fails): a port the counters' read found DOWN is then unknown, not
    ACTIVE."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    port = {"node": "gpu001", "device": "mlx5_0", "port": "1"}

    async def query(request: web.Request) -> web.Response:
        if "tuimon_read" in request.query["query"]:  # the counters' read
            return _vector([{"metric": {**port, "__name__": "tuimon_ib_port_state_id",
                                        "tuimon_read": "1"}, "value": [1.0, "1"]}])
        return _vector([])  # the live query of the states: nothing

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions())
        await source.refresh()
        (p,) = cluster.nodes["gpu001"].sample.extra["fabric"]["ports"]
        assert p.get("state") is None


async def test_a_machine_named_twice_keeps_each_names_port_values() -> None:
    """Our agent names the machine `gpu001`, node_exporter `gpu001.cluster.local`: one
    node. Its port is DOWN by node_exporter's live state, though our agent's read of the
    counters found it ACTIVE a moment ago: DOWN, not ACTIVE."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    ours = {"node": "gpu001", "device": "mlx5_0", "port": "1"}
    theirs = {"instance": "gpu001.cluster.local:9100", "device": "mlx5_0", "port": "1"}
    down = [False]

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        if "tuimon_read" in promql:  # the counters' read: ours says ACTIVE
            return _vector([{"metric": {**ours, "__name__": "tuimon_ib_port_state_id",
                                        "tuimon_read": "1"}, "value": [1.0, "4"]}])
        if down[0] and "!= 4" in promql:  # node_exporter's live state
            return _vector([{"metric": {**theirs, "__name__": "node_infiniband_state_id"},
                             "value": [1.0, "1"]}])
        if "transmit_wait" in promql:
            return _vector([{"metric": theirs, "value": [1.0, "5"]}])
        if promql.startswith("max by (__name__, gpu") and \
                "tuimon_gpu_temperature_celsius" in promql:  # our agent, every refresh
            return _vector([{"metric": {"__name__": "tuimon_gpu_temperature_celsius",
                                        "gpu": "0", "node": "gpu001"}, "value": [1.0, "61"]}])
        return _vector([])

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = ClusterState()
        source = PromSource(url, cluster, session, PromOptions())
        await source.refresh()
        assert set(cluster.nodes) == {"gpu001"}

        def port() -> dict[str, Any]:
            (p,) = cluster.nodes["gpu001"].sample.extra["fabric"]["ports"]
            return p

        assert port()["state_name"] == "ACTIVE" and port()["xmit_wait_s"] == 5
        down[0] = True
        await source.refresh()
        assert port()["state_name"] == "DOWN" and port()["xmit_wait_s"] == 5
        assert set(cluster.nodes) == {"gpu001"} and cluster.nodes["gpu001"].status == "up"


async def test_a_node_the_model_cannot_take_is_marked_and_the_others_arrive() -> None:
    """A bug met by one node's frames (in building them or in the model taking them)
    is that node's: it is stale with the reason, and every other node of the refresh
    arrives as usual."""
    from tuimon.sources.prometheus import PromOptions, PromSource

    async def query(request: web.Request) -> web.Response:
        if "DCGM_FI_DEV_GPU_TEMP" in request.query["query"]:
            return _vector([{"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0",
                                        "Hostname": h}, "value": [1.0, "60"]}
                            for h in ("gpu001", "gpu002", "gpu003")])
        return _vector([])

    class Picky(ClusterState):
        def apply_message(self, target: str, message: Any, raw: bytes = b"") -> None:
            if target == "gpu002":
                raise ValueError("a value no check foresaw")
            super().apply_message(target, message, raw)

    async with _prometheus_answering(query) as url, aiohttp.ClientSession() as session:
        cluster = Picky()
        await PromSource(url, cluster, session, PromOptions()).refresh()
    assert [cluster.nodes[h].status for h in ("gpu001", "gpu003")] == ["up", "up"]
    assert cluster.nodes["gpu002"].status != "up"
    assert "ValueError: a value no check foresaw" in (cluster.nodes["gpu002"].reason or "")
