"""`tuimon prom`: the live cluster read from a real Prometheus server (Debian's
`prometheus`, started here on loopback) that scrapes real simulated agents, a test
exporter speaking dcgm-exporter's names, and node_exporter on a /sys tree."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agent.sim.cluster import SimCluster
from tests.conftest import make_agent, run_tuimon, serve
from tests.peers import PROMETHEUS, free_port, running_prometheus, running_victoria_metrics
from tests.seeded import judged
from tests.test_relay import until
from tests.trees import ib_port
from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Diagnosis
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.slo import LedgerBurn, Slo
from tuimon.model.storage import StorageView
from tuimon.sources import prom_queries
from tuimon.sources.prom_client import PromClient
from tuimon.sources.prom_live_rules import NAME_LABEL, live_rules_yaml, record_name
from tuimon.sources.prometheus import PromOptions, PromSource, prom_watching
from tuimon.status import format_text, report

ROOT = Path(__file__).resolve().parent.parent
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None and os.environ.get("CI") != "true",
    reason="Prometheus not installed (apt-get install prometheus); CI installs it")

MODEL = 'modelName="NVIDIA H100 80GB HBM3"'
# (metric, help, {(host, gpu): value}); GPUs: dgx-a 0 and 1, dgx-b 0.
DCGM_ROWS = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).",
     {("dgx-a", 0): 87, ("dgx-a", 1): 12, ("dgx-b", 0): 95}),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).",
     {("dgx-a", 0): 40960, ("dgx-a", 1): 1024, ("dgx-b", 0): 70000}),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
     {("dgx-a", 0): 40960, ("dgx-a", 1): 80896, ("dgx-b", 0): 11920}),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).",
     {("dgx-a", 0): 66, ("dgx-a", 1): 41, ("dgx-b", 0): 89}),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).",
     {("dgx-a", 0): 512.5, ("dgx-a", 1): 80.25, ("dgx-b", 0): 690}),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).",
     {("dgx-a", 0): 1980, ("dgx-a", 1): 345, ("dgx-b", 0): 1410}),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.",
     {("dgx-a", 0): 0, ("dgx-a", 1): 79, ("dgx-b", 0): 0}),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons.",
     {("dgx-b", 0): 64}),
)


def dcgm_text() -> str:
    """dcgm-exporter's exposition: its names, its labels (gpu, UUID, device, modelName,
    Hostname), its units (percent, MiB, MHz)."""
    lines = []
    for metric, help_text, values in DCGM_ROWS:
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for (host, gpu), value in values.items():
            uuid = f"GPU-{host[-1]}{gpu}"
            lines.append(f'{metric}{{gpu="{gpu}",UUID="{uuid}",device="nvidia{gpu}",'
                         f'{MODEL},Hostname="{host}"}} {value}')
    return "\n".join(lines) + "\n"


def prometheus(tmp: Path, targets: list[str], server: str = "prometheus",
               rules: str = "") -> contextlib.AbstractContextManager[str]:
    """A real Prometheus (or VictoriaMetrics) on loopback scraping `targets` every
    second; Prometheus evaluating `rules` (YAML) too, where given."""
    scrape = ("  - job_name: tuimon\n    static_configs:\n"
              f"      - targets: {json.dumps(targets)}\n")
    if server == "victoria-metrics":
        assert not rules, "the rules are tested on Prometheus"
        return running_victoria_metrics(tmp, scrape)
    return running_prometheus(tmp, scrape, rules=rules)


@contextlib.contextmanager
def node_exporter(root: Path) -> Iterator[str | None]:
    if NODE_EXPORTER is None:
        yield None
        return
    port = free_port()
    proc = subprocess.Popen(
        [NODE_EXPORTER, f"--path.sysfs={root / 'sys'}", f"--path.procfs={root / 'proc'}",
         "--collector.disable-defaults", "--collector.infiniband",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.asynccontextmanager
async def dcgm_exporter() -> AsyncIterator[str]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=dcgm_text(), content_type="text/plain")
    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _until_series(url: str, promql: str, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while True:
            # nocache=1: VictoriaMetrics answers with what it stored, not 30 s before.
            async with s.get(f"{url}/api/v1/query",
                             params={"query": promql, "nocache": "1"}) as r:
                body = await r.json()
            if len(body["data"]["result"]) >= count:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus has not {count} series of {promql}: {body}")
            await asyncio.sleep(0.5)


@pytest.mark.parametrize("server", ["prometheus", "victoria-metrics"])
async def test_agents_dcgm_and_node_exporter_through_a_real_prometheus(
        tmp_path: Path, unused_tcp_port_factory, proc_root: Path, server: str) -> None:
    """The same scrapes through Prometheus and through VictoriaMetrics (MetricsQL): the
    same cluster read from either."""
    ib_port(proc_root, "mlx5_0", counters={"port_xmit_data": 1000, "port_rcv_data": 2000})
    ib_port(proc_root, "mlx5_1", state="1: DOWN", phys_state="3: Disabled")
    sim = SimCluster(nodes=3, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="healthy")
    async with sim, dcgm_exporter() as dcgm:
        with node_exporter(proc_root) as nodex:
            targets = [*sim.targets, dcgm] + ([nodex] if nodex else [])
            with prometheus(tmp_path, targets, server) as url:
                await _until_series(url, "tuimon_gpu_utilization_ratio", 6)
                await _until_series(url, "DCGM_FI_DEV_GPU_UTIL", 3)
                # Rates need two scrapes of each target, and targets are scraped at
                # different offsets: wait for a rate from every one of them.
                await _until_series(url, "rate(tuimon_job_wall_seconds_total[1m]) > 0", 6)
                await _until_series(url, "rate(tuimon_job_samples_total[1m]) > 0", 6)
                await _until_series(url, "rate(tuimon_fs_read_bytes_total[1m])", 3)
                if nodex:
                    await _until_series(
                        url, "rate(node_infiniband_port_data_transmitted_bytes_total[1m])", 1)
                cluster = ClusterState()
                async with aiohttp.ClientSession() as session:
                    source = PromSource(url, cluster, session, PromOptions(every=1.0))
                    await source.refresh()
                    per_refresh = source.queries_run
                    # The second refresh skips the budget's and the inventory's queries,
                    # and the ports' error counters (read every 15 s).
                    await source.refresh()
                    # (The presence of nodes too: of the profiling fields no other asks.)
                    live = len(prom_queries.LIVE_QUERIES)
                    assert source.queries_run - per_refresh == live - 1
                    # A node's screen open: its every value, in one more query.
                    cluster.set_detail({"dgx-a"})
                    before = source.queries_run
                    await source.refresh()
                    assert source.queries_run - before == live
                    source._last_errors -= 15  # time passes: the error counters again
                    before = source.queries_run
                    await source.refresh()
                    assert source.queries_run - before == live + 1
    # A bounded number of queries, whatever the node count (every field asked: no need
    # of the GPUs known only by a field asked while drawn); the budget's with each node's
    # last hour of its jobs.
    assert per_refresh == len(prom_queries.LIVE_QUERIES) + len(
        prom_queries.budget_queries(720)) + len(prom_queries.JOB_HOUR) + len(
        prom_queries.INVENTORY_QUERIES) - 1

    # Our agents' metrics: every simulated node with its two GPUs and its host.
    for m in sim.members:
        node = cluster.nodes[m.name]
        assert node.status == "up" and node.gpu_count == 2, (m.name, node.reason)
        gpus = node.sample.gpus
        assert all(0 <= g["util"] <= 1 and g["mem_total"] > 0 for g in gpus)
        assert node.sample.host["mem_total"] > 0
        assert node.sample.extra["fabric"]["ports"], "IB ports of the simulated node"
        assert node.sample.extra["storage"]["filesystems"]
    # dcgm-exporter's names, units converted.
    a, b = cluster.nodes["dgx-a"], cluster.nodes["dgx-b"]
    assert a.gpu_count == 2 and b.gpu_count == 1
    assert a.hello.gpus[0].uuid == "GPU-a0" and a.hello.gpus[0].name == "NVIDIA H100 80GB HBM3"
    g0, g1 = a.sample.gpus
    assert g0["util"] == pytest.approx(0.87) and g0["temp"] == 66
    assert g0["mem_used"] == 40960 << 20 and g0["mem_total"] == 81920 << 20
    assert g0["power"] == 512.5 and g0["sm_clock"] == 1980e6
    assert g0.get("last_xid") is None and g1["last_xid"] == 79
    assert b.sample.gpus[0]["clock_events"] == ["hw_thermal_slowdown"]
    # ... so the diagnosis works on them as on the agents' frames.
    eff = EfficiencyView(Slo(0.9, 720))
    eff.update(cluster)
    _, findings = judged(cluster, eff=eff)  # throttling held a few seconds
    assert any(f.kind == "xid" and f.where == "dgx-a GPU 1" and "XID 79" in f.message
               for f in findings), findings
    assert any(f.kind == "thermal" and f.where == "dgx-b GPU 0" for f in findings), findings
    # node_exporter's InfiniBand port, on the node named by its instance's host.
    if nodex:
        ports = {p["id"]: p for p in cluster.nodes["127.0.0.1"].sample.extra["fabric"]["ports"]}
        up, down = ports["mlx5_0:1"], ports["mlx5_1:1"]
        # Only a port that is not ACTIVE and LinkUp is asked its state live; one whose
        # state series the read of its counters saw, and that query did not name, is
        # ACTIVE. Named as the agent names them.
        assert up["state_name"] == "ACTIVE" and up["tx_bytes_s"] == 0
        assert (down["state"], down["state_name"], down["phys_state_name"]) == (
            1, "DOWN", "Disabled")
        # Disabled since first seen: configured off, information (not a cabling fault).
        assert any(f.kind == "port_disabled" and f.where == "127.0.0.1 mlx5_1:1"
                   and f.severity == "info" for f in findings), findings
        assert not any(f.kind == "link_down" for f in findings), findings
    # The job's budget from the counters, and its SLI from the rates.
    assert "llm-pretrain" in cluster.budgets
    budget = cluster.budgets["llm-pretrain"]
    assert budget["observed_h"] > 0 and budget["consumed_h"] >= 0
    assert 0.0 < budget["error_ratio"]["5m"] < 0.3  # healthy: SLI about 0.92
    assert isinstance(eff.jobs["llm-pretrain"].burn, LedgerBurn)
    # (The last minute as the nodes' counters summed it: the reader's own count may not
    # hold a whole step yet.)
    job = eff.jobs["llm-pretrain"]
    sli, covered = job.sli_window(60, eff.now)
    throughput = job.throughput(60, eff.now)
    assert sli is not None and 0.7 < sli <= 1.0 and covered == 60
    assert throughput is not None and throughput > 0


async def test_prometheus_down_or_wrong_is_said(tmp_path: Path) -> None:
    cluster = ClusterState()
    cluster.add_target("dgx-a")
    port = free_port()
    async with prom_watching(f"http://127.0.0.1:{port}", cluster,
                             PromOptions(every=0.5, timeout=2)):
        for _ in range(50):
            if cluster.nodes["dgx-a"].reason:
                break
            await asyncio.sleep(0.1)
    assert "cannot connect" in cluster.nodes["dgx-a"].reason
    assert f"127.0.0.1:{port}" in cluster.nodes["dgx-a"].reason
    # One fault, the server's, said once: its nodes are unknown, not each one lost (a
    # Prometheus restarting must not page about every node of the cluster).
    _, findings = judged(cluster)
    assert [(f.severity, f.kind) for f in findings] == [("critical", "source_lost")], findings
    assert findings[0].message.endswith("its 1 node unknown"), findings[0].message
    assert findings[0].first_seen is not None
    # `tuimon status` says since when once, in its own words, as for every finding.
    text = format_text(report(cluster, EfficiencyView(), findings, "critical"))
    (line,) = [t for t in text.splitlines() if "unknown" in t and "critical" in t]
    assert line.count("since") == 1 and re.search(r"; since \d\d:\d\d \(\d+ s\)$", line), line
    assert cluster.nodes["dgx-a"].status == "unknown"

    async def bad(_: web.Request) -> web.Response:
        return web.json_response({"status": "error", "errorType": "bad_data",
                                  "error": "parse error at char 3"}, status=400)
    app = web.Application()
    app.router.add_get("/api/v1/query", bad)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            source = PromSource(f"http://127.0.0.1:{port}", ClusterState(), session)
            with pytest.raises(Exception, match="parse error at char 3"):
                await source.refresh()
    finally:
        await runner.cleanup()


def test_prom_command_once_and_record(tmp_path: Path, unused_tcp_port_factory) -> None:
    """`tuimon prom URL --once --record FILE` against a real Prometheus, then replayed:
    the nodes, and the job's SLI and budget from the step counters, as the app shows
    them. `tuimon status` checks the same server, named with --prometheus or by a
    cluster whose config says `prometheus =`."""
    config = tmp_path / "config.toml"
    run = run_tuimon

    async def scenario() -> list[tuple[int, str]]:
        sim = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.5,
                         scenario="healthy")
        async with sim:
            with prometheus(tmp_path, sim.targets) as url:
                await _until_series(url, "tuimon_gpu_utilization_ratio", 2)
                await _until_series(url, "rate(tuimon_job_wall_seconds_total[1m]) > 0", 2)
                config.write_text(f'[clusters.lab]\nprometheus = "{url}"\n')
                return [
                    await run("prom", url, "--once", "--every", "1",
                              "--record", str(tmp_path / "rec.tuimon")),
                    await run("status", "--prometheus", url),
                    await run("--config", str(config), "--cluster", "lab", "status"),
                    await run("status", "--prometheus", url, "--json"),
                    await run("prom", url, "--once", "--json"),
                ]
    (code, out), *statuses, (_, status_json), (prom_code, prom_json) = asyncio.run(scenario())
    # `prom --once --json` prints status's document, with its exit code.
    ours, theirs = json.loads(prom_json), json.loads(status_json)
    assert prom_code in (0, 1) and set(ours) == set(theirs), prom_json
    assert ours["nodes"]["up"] == 2 and set(ours["jobs"]) == {"llm-pretrain"}
    assert set(ours["jobs"]["llm-pretrain"]) == set(theirs["jobs"]["llm-pretrain"])
    # What the step time waited on, from tuimon_job_wait_seconds_total: the simulated
    # ranks wait in collectives; and the budget spent so, from the same counters.
    job = theirs["jobs"]["llm-pretrain"]
    # (rates of separate counters align to the scrape only roughly: a rest is `other`)
    waits = job["waits_1h"]
    assert waits and max(waits, key=waits.__getitem__) == "comm", job
    spent = job["budget_spent_hours"]  # (any rest of the lost time is `other`)
    assert spent and max(spent, key=spent.__getitem__) == "comm", job
    assert code == 0, out
    assert "nodes up 2" in out and "sim-node000" in out and "sim-node001" in out
    job = next(line for line in out.splitlines() if line.startswith("job llm-pretrain"))
    assert "SLI 0." in job and "budget" in job, out
    for code, text in statuses:
        assert code in (0, 1), text
        assert text.startswith(("OK: nodes 2 up", "WARNING: nodes 2 up")), text
        assert "job llm-pretrain" in text, text
    # The recording holds the frames the refresh made: replayed, the same two nodes.
    from tuimon.sources.recording import apply_item, read_recording

    rec = read_recording(tmp_path / "rec.tuimon")
    replayed = ClusterState()
    for _, target, data, call in rec.frames():
        apply_item(replayed, target, data, call)
    assert {n.name for n in replayed.nodes.values() if n.status == "up"} == {
        "sim-node000", "sim-node001"}
    assert all(n.gpu_count == 1 and n.sample.gpus[0]["util"] is not None
               for n in replayed.nodes.values())


@pytest.mark.parametrize("server", ["prometheus", "victoria-metrics"])
async def test_port_errors_through_a_real_prometheus_count_each_error_once(
        tmp_path: Path, proc_root: Path, server: str) -> None:
    """node_exporter's error counters read through Prometheus: what a port counted before
    the viewer started is not news, errors that come later are counted once each, by
    kind (a link down is a link down, not a symbol error), and the node rules' window
    says how many there were, not that many times the refreshes in a minute."""
    if NODE_EXPORTER is None:
        if os.environ.get("CI") == "true":
            raise AssertionError("CI must install prometheus-node-exporter")
        pytest.skip("node_exporter not installed (apt-get install prometheus-node-exporter)")
    counters = {"port_xmit_data": 1000, "port_rcv_data": 2000, "symbol_error": 5,
                "link_downed": 0}
    base = ib_port(proc_root, "mlx5_0", counters=counters)
    with node_exporter(proc_root) as nodex, \
            prometheus(tmp_path, [nodex or ""], server) as url:
        await _until_series(url, "node_infiniband_symbol_error_total == 5", 1)
        await _until_series(  # two scrapes: the port's rates are defined
            url, "rate(node_infiniband_port_data_transmitted_bytes_total[1m])", 1)
        cluster = ClusterState()
        diagnosis = Diagnosis(wall=time.time)  # the judgement, after each refresh
        async with aiohttp.ClientSession() as session:
            # The error counters read at every refresh (every 15 s by default).
            source = PromSource(url, cluster, session, PromOptions(every=1.0, errors_every=0))

            async def port() -> dict:
                await source.refresh()
                diagnosis.update(cluster, EfficiencyView(), StorageView())
                (p,) = cluster.nodes["127.0.0.1"].sample.extra["fabric"]["ports"]
                return p

            assert "errors_inc" not in await port()  # five from before: not news
            (base / "counters" / "symbol_error").write_text("15\n")
            (base / "counters" / "link_downed").write_text("1\n")
            await _until_series(url, "node_infiniband_link_downed_total == 1", 1)
            assert (await port())["errors_inc"] == {"symbol_errors": 10, "link_downed": 1}
            for _ in range(3):
                assert "errors_inc" not in await port()
            # The counters unreadable a while (the collector fails, its series go stale):
            # not read is not 0, and what they grew by meanwhile counts when read again.
            (base / "counters" / "symbol_error").write_text("garbage\n")
            await _until_series(url, "absent(node_infiniband_link_downed_total)", 1)
            assert "errors_inc" not in await port()
            (base / "counters" / "symbol_error").write_text("20\n")
            await _until_series(url, "node_infiniband_symbol_error_total == 20", 1)
            assert (await port())["errors_inc"] == {"symbol_errors": 5}
    said = [f.message for f in diagnosis.update(cluster, EfficiencyView(), StorageView())
            if f.kind == "symbol_errors"]
    assert said == ["127.0.0.1 mlx5_0:1 +15 symbol errors in 10 min (cable or transceiver)"]


@pytest.mark.parametrize("server,recorded", [("prometheus", False),
                                             ("victoria-metrics", False), ("prometheus", True)])
async def test_a_counter_our_agent_could_not_read_is_not_news_when_it_is_back(
        tmp_path: Path, proc_root: Path, server: str, recorded: bool) -> None:
    """Our agent leaves a port counter it cannot read (garbage, an I/O error) out of
    /metrics, and says so. Read through a real store, directly or through the records,
    that absence is not 0: back at its old total, the counter is not counted as that
    many new errors (a false "link errors" finding); what it grew by meanwhile is."""
    symbol = ib_port(proc_root, "mlx5_0", counters={
        "port_xmit_data": 1000, "port_rcv_data": 2000, "symbol_error": "garbage",
        "link_downed": 0}) / "counters" / "symbol_error"
    total = "tuimon_ib_port_symbol_errors_total"
    agent = make_agent(proc_root, None, node_name="ib-a")
    async with serve(agent) as agent_server:
        target = f"127.0.0.1:{agent_server.port}"
        rules = live_rules_yaml(every=1) if recorded else ""
        with prometheus(tmp_path, [target], server, rules) as url:
            async with aiohttp.ClientSession() as session:
                source = PromSource(url, ClusterState(), session,
                                    PromOptions(every=1.0, errors_every=0, recorded=recorded))

                def seen(name: str, compare: str = "", **labels: str) -> str:
                    """A series as the source reads it: the agent's, or its record."""
                    if recorded:
                        labels = {NAME_LABEL: name, **labels}
                        name = record_name("ib_errors")
                    inside = ",".join(f'{k}="{v}"' for k, v in labels.items())
                    return f"{name}{{{inside}}} {compare}"

                unreadable = seen("tuimon_ib_port_counter_unreadable", counter="symbol_errors")

                async def errors(until: str) -> dict[str, int] | None:
                    """The port's new errors at a refresh once `until` holds."""
                    await _until_series(url, until, 1)
                    await source.refresh()
                    (p,) = source.cluster.nodes["ib-a"].sample.extra["fabric"]["ports"]
                    return p.get("errors_inc")

                # Unreadable since before the viewer started: no baseline, so when it is
                # back its total is not news.
                assert await errors(unreadable) is None
                symbol.write_text("40\n")
                assert await errors(seen(total, "== 40")) is None
                assert await errors(seen(total, "== 40")) is None
                # Unreadable a while, then back where it was: nothing new.
                symbol.write_text("garbage\n")
                assert await errors(unreadable) is None
                symbol.write_text("40\n")
                assert await errors(seen(total, "== 40")) is None
                # Unreadable while it grew: what it grew by counts when it is back.
                symbol.write_text("garbage\n")
                assert await errors(unreadable) is None
                symbol.write_text("43\n")
                assert await errors(seen(total, "== 43")) == {"symbol_errors": 3}


async def test_the_app_asks_the_maps_cells_it_draws_and_asks_again_when_they_change(
        tmp_path: Path) -> None:
    """At a large site a refresh's cost is its series: the app on `tuimon prom` asks
    every GPU's memory, temperature, power and clock only while the map draws them.
    Switching the map to memory asks at once, not at the next refresh (every 30 s
    here), and the map draws it."""
    from tuimon.model.map_kinds import GPU_MAP
    from tuimon.ui.app import TuimonApp
    from tuimon.ui.heatmap import HeatmapView
    from tuimon_core.heat_levels import NO_DATA

    asked: list[str] = []
    original = PromClient.query

    async def query(self: PromClient, promql: str,  # type: ignore[no-untyped-def]
                    name: str | None = None):
        asked.append(promql)
        return await original(self, promql, name)

    def levels(node: str, metric: str) -> list[int]:
        """The node's cells as the map draws them, for that metric."""
        state = cluster.nodes.get(node)
        if state is None or state.overview is None:
            return []
        (m,) = (m for m in GPU_MAP.metrics if m.key == metric)
        return GPU_MAP.levels(state, m)

    def dense_used(promql: str) -> bool:  # memory used asked of every GPU
        return promql.startswith("max by (__name__, gpu") and "DCGM_FI_DEV_FB_USED" in promql

    cluster = ClusterState("prom")

    def sources(state: ClusterState):  # type: ignore[no-untyped-def]
        async def run() -> None:
            async with prom_watching(url, state, PromOptions(every=30.0, timeout=10)):
                await asyncio.Event().wait()
        return [run()]

    async with dcgm_exporter() as dcgm:
        with prometheus(tmp_path, [dcgm]) as url:
            await _until_series(url, "DCGM_FI_DEV_POWER_USAGE", 3)
            PromClient.query = query  # type: ignore[method-assign]
            try:
                app = TuimonApp(cluster, sources=sources, refresh=0.2)
                async with app.run_test(size=(120, 30)) as pilot:
                    await until(lambda: len(levels("dgx-a", "util")) == 2)
                    # How busy every GPU is; no memory, no temperature.
                    assert levels("dgx-a", "util")[0] != NO_DATA
                    assert levels("dgx-b", "temp") == [NO_DATA]
                    assert levels("dgx-a", "mem") == [NO_DATA, NO_DATA]
                    assert not any(dense_used(a) for a in asked)
                    started = time.monotonic()
                    await pilot.press("2")  # the map of memory used
                    assert app.query_one("#gpu-map", HeatmapView).metric.key == "mem"
                    await until(lambda: levels("dgx-a", "mem")[:1] not in ([], [NO_DATA]))
                    assert time.monotonic() - started < 10  # not the 30 s refresh
                    assert levels("dgx-a", "mem") == [4, 0]  # half and 1/80 used
                    assert any(dense_used(a) for a in asked)
                    # Memory -> temperature asks less; temperature -> health asks the
                    # same as before, so the server is not asked again for it.
                    await pilot.press("3")
                    await until(lambda: levels("dgx-a", "mem") == [NO_DATA, NO_DATA])
                    await until(lambda: levels("dgx-b", "temp") == [8])
                    refreshes = len(asked)
                    await pilot.press("6")
                    await pilot.pause(2.0)
                    assert len(asked) == refreshes
            finally:
                PromClient.query = original  # type: ignore[method-assign]
