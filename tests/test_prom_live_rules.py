"""`tuimon rules --live` and `tuimon prom --recorded`: the live queries as recording
rules, checked by the real promtool, and a real Prometheus evaluating them over real
exporter scrapes, read by the app as it reads the queries' own answers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.peers import free_port, require_promtool
from tests.test_real_data import (
    _gpu_node_tree,
    _until,
    _without_family,
    need_peers,
    node_exporter_on,
    prometheus_scraping,
    real,
    static_exporter,
)
from tuimon.model.cluster import ClusterState
from tuimon.model.prom_rules import quote_yaml
from tuimon.sources import prom_queries
from tuimon.sources.prom_live_rules import (
    INVENTORY_GROUP,
    INVENTORY_RECORDED,
    RECORDED,
    inventory_name,
    live_rules_yaml,
    record_name,
    recorded_inventory,
    recorded_queries,
)
from tuimon.sources.prom_nodes import identity_labels
from tuimon.sources.prometheus import PromError, PromOptions, PromSource
from tuimon_core.heat_levels import GPU_METRICS

ROOT = Path(__file__).resolve().parent.parent
# The A800 capture, less the family Prometheus refuses to scrape (values "ERROR").
A800 = _without_family(real("dcgm_v3_a800_mig_2g20gb.prom"),
                       "DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION")


def promtool_run(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([require_promtool(), *args], cwd=tmp, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{done.args}: {done.stdout}\n{done.stderr}"
    return done


@pytest.mark.parametrize(("match", "labels", "every"), [
    ("", [], 15), ('cluster="a"', ["host"], 2.5), ("{cluster=~'a|b', dc!=\"x\"}", [], 1),
    ('cluster="a\\"b}"', [], 60)])
def test_promtool_checks_the_live_rules(tmp_path: Path, match: str, labels: list[str],
                                        every: float) -> None:
    (tmp_path / "live.yml").write_text(live_rules_yaml(match, labels, every=every))
    done = promtool_run(tmp_path, "check", "rules", "live.yml")
    assert f"SUCCESS: {len(RECORDED) + len(INVENTORY_RECORDED)} rules found" in done.stdout


def test_a_record_keeps_the_series_name_and_the_clusters_label(tmp_path: Path) -> None:
    """What the app reads back from a record: the exporter's series name (a record
    replaces it), the identity labels and the --match label, and nothing else."""
    (tmp_path / "live.yml").write_text(live_rules_yaml('cluster="a"', every=1))
    temp = ('DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="gpu001",instance="10.0.0.1:9400",'
            'job="dcgm",cluster="a",modelName="NVIDIA A800",UUID="GPU-1"}')
    other = temp.replace('cluster="a"', 'cluster="b"').replace("gpu001", "gpu002")
    port = ('node_infiniband_port_data_transmitted_bytes_total{device="mlx5_0",port="1",'
            'instance="10.0.0.1:9100",job="node",cluster="a"}')
    unit = {"rule_files": ["live.yml"], "evaluation_interval": "1s", "tests": [{
        "interval": "1s",
        "input_series": [{"series": temp, "values": "65x30"},
                         {"series": other, "values": "70x30"},
                         {"series": port, "values": "0+1000x30"}],
        "promql_expr_test": [
            {"expr": record_name("gpu"), "eval_time": "20s", "exp_samples": [{
                "labels": 'tuimon:live_gpu{gpu="0",Hostname="gpu001",instance="10.0.0.1:9400",'
                          'cluster="a",tuimon_series="DCGM_FI_DEV_GPU_TEMP"}',
                "value": 65}]},
            {"expr": record_name("ib_tx"), "eval_time": "20s", "exp_samples": [{
                "labels": 'tuimon:live_ib_tx{device="mlx5_0",port="1",'
                          'instance="10.0.0.1:9100",cluster="a"}',
                "value": 1000}]},
        ]}]}
    (tmp_path / "test.yml").write_text(json.dumps(unit))
    promtool_run(tmp_path, "test", "rules", "test.yml")


def test_every_inventory_query_has_its_record() -> None:
    """--recorded asks a record for each inventory query: one without would be a
    KeyError at the first refresh."""
    from tuimon.sources.prom_queries import INVENTORY_QUERIES

    assert INVENTORY_RECORDED.keys() == INVENTORY_QUERIES.keys()


def test_the_inventory_records_keep_what_the_inventory_reads(tmp_path: Path) -> None:
    """What a GPU is (model, UUID, bus id), its memory's total made of used and free,
    and a port's rate: recorded with the labels the inventory reads, the cluster's, and
    the name of the series each came from; and read back by what --recorded asks."""
    (tmp_path / "live.yml").write_text(live_rules_yaml('cluster="a"', every=1,
                                                       inventory_every=1))
    gpu = ('{gpu="0",Hostname="gpu001",instance="10.0.0.1:9400",job="dcgm",cluster="a",'
           'modelName="NVIDIA A800",UUID="GPU-1",pci_bus_id="00000000:1A:00.0",'
           'DCGM_FI_DRIVER_VERSION="535.54.03"}')
    rate = ('node_infiniband_rate_bytes_per_second{device="mlx5_0",port="1",'
            'instance="10.0.0.1:9100",job="node",cluster="a"}')
    ids = ("Hostname", "instance", "cluster")
    asked = recorded_inventory('cluster="a"', ids)
    of_gpu = 'gpu="0",Hostname="gpu001",instance="10.0.0.1:9400",cluster="a"'

    def expect(record: str, labels: str, value: float) -> dict[str, Any]:
        return {"expr": asked[record], "eval_time": "20s",
                "exp_samples": [{"labels": labels, "value": value}]}

    unit = {"rule_files": ["live.yml"], "evaluation_interval": "1s", "tests": [{
        "interval": "1s",
        "input_series": [{"series": "DCGM_FI_DEV_FB_USED" + gpu, "values": "1000x30"},
                         {"series": "DCGM_FI_DEV_FB_FREE" + gpu, "values": "80000x30"},
                         {"series": "DCGM_FI_DEV_FB_USED" + gpu.replace('"a"', '"b"'),
                          "values": "5x30"},
                         {"series": rate, "values": "25000000000x30"},
                         {"series": "DCGM_FI_DEV_MEM_CLOCK" + gpu, "values": "1593x30"},
                         {"series": "DCGM_FI_DEV_XID_ERRORS" + gpu, "values": "0x30"}],
        "promql_expr_test": [
            expect("gpu_info", f'{{{of_gpu},modelName="NVIDIA A800",UUID="GPU-1",'
                               'pci_bus_id="00000000:1A:00.0"}', 1),
            expect("gpu_total", f'{{{of_gpu},tuimon_series="tuimon:dcgm_fb_total"}}', 81000),
            expect("port_rate", '{device="mlx5_0",port="1",instance="10.0.0.1:9100",'
                                'cluster="a",tuimon_series="node_infiniband_rate_bytes_per_second"}',
                   25e9),
            expect("gpu_slow", f'{{{of_gpu},tuimon_series="DCGM_FI_DEV_MEM_CLOCK"}}', 1593),
            expect("gpu_exported", '{Hostname="gpu001",instance="10.0.0.1:9400",cluster="a",'
                                   'tuimon_series="DCGM_FI_DEV_XID_ERRORS"}', 1),
            expect("gpu_drawn", f"{{{of_gpu}}}", 1),
        ]}]}
    (tmp_path / "test.yml").write_text(json.dumps(unit))
    promtool_run(tmp_path, "test", "rules", "test.yml")


def test_the_replicas_of_an_ha_pair_read_as_one(tmp_path: Path) -> None:
    """Behind Thanos each Prometheus of a pair records its own copy, told apart by the
    replica label the store adds: what --recorded asks folds them, as the queries' own
    `max by` does, so a summed value (retired pages) is not counted twice."""
    (tmp_path / "live.yml").write_text(live_rules_yaml(every=1))
    record = ('tuimon:live_gpu_sparse{gpu="0",Hostname="gpu001",instance="10.0.0.1:9400",'
              'tuimon_series="DCGM_FI_DEV_RETIRED_SBE",replica="%s"}')
    query = recorded_queries("", identity_labels())["gpu_sparse"]
    unit = {"rule_files": ["live.yml"], "evaluation_interval": "1s", "tests": [{
        "interval": "1s",
        "input_series": [{"series": record % "a", "values": "3x10"},
                         {"series": record % "b", "values": "3x10"}],
        "promql_expr_test": [{"expr": query, "eval_time": "5s", "exp_samples": [{
            "labels": '{gpu="0",Hostname="gpu001",instance="10.0.0.1:9400",'
                      'tuimon_series="DCGM_FI_DEV_RETIRED_SBE"}', "value": 3}]}]}]}
    (tmp_path / "test.yml").write_text(json.dumps(unit))
    promtool_run(tmp_path, "test", "rules", "test.yml")


def _view(cluster: ClusterState) -> dict[str, Any]:
    """What the maps and the rules read of each node, but what moves between two reads
    (the NFS mounts' rates from a file that grows)."""
    out = {}
    for name, node in cluster.nodes.items():
        sample = node.sample
        fabric = sample.extra.get("fabric") if sample else None
        storage = sample.extra.get("storage") if sample else None
        out[name] = {
            "status": node.status,
            "gpus": [i.index for i in node.hello.gpus] if node.hello else None,
            "samples": sample.gpus if sample else None,
            "ports": fabric["ports"] if fabric else None,
            "mounts": sorted(f["id"] for f in storage["filesystems"]) if storage else None,
            "host": sample.host if sample else None,
        }
    return out


@need_peers
async def test_recorded_reads_the_same_cluster_as_the_queries(tmp_path: Path) -> None:
    """Real dcgm-exporter scrapes (MIG, Kubernetes, a pod name) and a real node_exporter
    through a real Prometheus evaluating the live rules: `--recorded` sees every node,
    GPU and port as the queries do, and names the failed scrape."""
    here = os.uname().nodename
    kops = real("dcgm_v4_l4_kops.prom").replace('Hostname="i-030791dc5a37cd257"',
                                                f'Hostname="{here}"')
    tree, stop = _gpu_node_tree(tmp_path)
    try:
        async with contextlib.AsyncExitStack() as stack:
            serve = stack.enter_async_context
            jobs = [
                ("dcgm", await serve(static_exporter("127.0.0.2", kops)), {}),
                ("node", stack.enter_context(node_exporter_on(tree, "127.0.0.2")), {}),
                ("dcgm-mig", await serve(static_exporter(
                    "127.0.0.3", A800)), {}),
                ("dcgm-k8s", await serve(static_exporter(
                    "127.0.0.5", real("dcgm_v4_lowercase_hostname_mig.prom"))),
                 {"kubernetes_node": "gpu-k8s-07"}),
                ("dcgm-v2", await serve(static_exporter(
                    "127.0.0.9", real("dcgm_v2_a30_mig_podname.prom"))), {}),
                ("gone", "127.0.0.10:1", {}),
            ]
            url = stack.enter_context(prometheus_scraping(
                tmp_path, jobs, rules=live_rules_yaml(every=1, inventory_every=1)))
            await _until(url, "up == 1", 5)
            await _until(url, record_name("ib_tx"), 1)
            await _until(url, record_name("gpu_busy"), 4)
            # (the group's last record: its evaluation has stored them all)
            await _until(url, inventory_name(list(INVENTORY_RECORDED)[-1]), 4)
            await _until(url, inventory_name("port_rate"), 1)
            views = {}
            # Every field, and only what the busy map draws (the app's first map).
            busy_map = GPU_METRICS[0].reads
            async with aiohttp.ClientSession() as session:
                for recorded, drawn in itertools.product((False, True), (None, busy_map)):
                    cluster = ClusterState()
                    cluster.set_drawn(drawn)
                    source = PromSource(url, cluster, session,
                                        PromOptions(every=1.0, recorded=recorded))
                    await source.refresh()
                    views[recorded, drawn] = _view(cluster)
                    # The inventory read from its records: none lacked what its
                    # query finds.
                    assert not source.records.said_unrecorded
                    assert not recorded or all(source.records.answered_by_record.values())
                    failures = cluster.scrape_failures
                    assert any("127.0.0.10:1" in reason for _, reason in failures.values())
                    if drawn is not None:  # a node's screen opened: its ports' rates
                        cluster.set_detail({here})
                        await source.refresh()
                        views[recorded, "screen"] = _view(cluster)
                        # The error counters read beside the refreshes (as run() does
                        # after its first), records or not: each port's state read.
                        source._beside, source._last_errors = True, float("-inf")
                        await source.refresh()
                        assert source._later is not None
                        await source._later
                        await source.refresh()
                        assert source.reader.assembler.ports.read[here], recorded
    finally:
        stop.set()
    assert {"gpu-k8s-07", "msxf-hpc-64-35-ai", "127.0.0.9", here} <= set(views[True, None])
    assert views[True, None] == views[False, None]
    assert views[True, busy_map] == views[False, busy_map]
    mig = views[True, None]["msxf-hpc-64-35-ai"]["samples"][0]
    assert mig["mig_mode"] == 1 and [m["gi"] for m in mig["mig"]] == [3, 5, 6]

    def gpus(view: dict[str, Any]) -> list[dict[str, Any]]:
        return [g for node in view.values() for g in node["samples"] or ()]
    # The busy map's refresh asks no GPU's power, memory used, temperature or clock...
    drawn_only = prom_queries.DRAWN_ONLY_GPU
    assert all(drawn_only.isdisjoint(g) for g in gpus(views[True, busy_map]))
    assert all(any(key in g for g in gpus(views[True, None])) for key in drawn_only)
    # ... nor any port's traffic, unless a node's screen is open.
    def ports(view: dict[str, Any]) -> list[dict[str, Any]]:
        return [p for node in view.values() for p in node["ports"] or ()]
    assert all("tx_bytes_s" not in p and "rx_bytes_s" not in p
               for p in ports(views[True, busy_map]))
    for view in (views[True, None], views[True, "screen"], views[False, "screen"]):
        assert ports(view) and all("tx_bytes_s" in p for p in ports(view))
    # ... and draws the maps that need none of them as the full refresh does.
    full, busy = views[True, None], views[True, busy_map]
    assert set(full) == set(busy)
    for metric in GPU_METRICS:
        if drawn_only.isdisjoint(metric.reads):
            for name in full:
                assert [metric.level(g) for g in full[name]["samples"] or ()] == \
                    [metric.level(g) for g in busy[name]["samples"] or ()], (name, metric.key)


@need_peers
async def test_recorded_without_the_rules_says_what_to_load(tmp_path: Path) -> None:
    async with static_exporter("127.0.0.3", A800) as target:
        with prometheus_scraping(tmp_path, [("dcgm", target, {})]) as url:
            await _until(url, "up == 1", 1)
            async with aiohttp.ClientSession() as session:
                source = PromSource(url, ClusterState(), session,
                                    PromOptions(every=1.0, recorded=True))
                with pytest.raises(PromError, match="tuimon rules --live"):
                    await source.refresh()


@need_peers
async def test_rules_without_the_inventory_read_it_from_the_series(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Rules of an older tuimon (no inventory group): --recorded reads the inventory
    from the series, as without --recorded, and says once per record what to load."""
    rules = live_rules_yaml(every=1)
    older = rules[:rules.index(f"  - name: {quote_yaml(INVENTORY_GROUP)}")]
    assert inventory_name("gpu_info") not in older
    async with static_exporter("127.0.0.3", A800) as target:
        with prometheus_scraping(tmp_path, [("dcgm", target, {})], rules=older) as url:
            await _until(url, record_name("gpu_busy"), 1)
            views = []
            async with aiohttp.ClientSession() as session:
                for recorded in (False, True):
                    cluster = ClusterState()
                    source = PromSource(url, cluster, session,
                                        PromOptions(every=1.0, recorded=recorded))
                    for _ in range(2):  # the inventory read twice
                        source._last_inventory = float("-inf")
                        await source.refresh()
                    views.append(_view(cluster))
    assert views[0] == views[1]
    gpus = views[1]["msxf-hpc-64-35-ai"]["samples"]
    assert any(g.get("mem_total") for g in gpus or ())  # from the inventory
    said = [r.getMessage() for r in caplog.records
            if inventory_name("gpu_info") in r.getMessage()]
    assert len(said) == 1 and "tuimon rules --live" in said[0]


@pytest.mark.parametrize(("args", "said"), [
    (["rules", "--live", "--match", "cluster"], "not a PromQL label matcher list"),
    (["rules", "--live", "--node-label", "a-b"], "--node-label 'a-b'"),
    (["rules", "--live", "--every", "0.5"], "must be in [1, 60]"),
    (["rules", "--live", "--match", 'a="\u2028"'], "control characters"),
    (["prom", "http://127.0.0.1:1", "--recorded", "--match", "up"], "--match with --recorded"),
])
def test_live_rules_refuse_what_they_cannot_keep(args: list[str], said: str) -> None:
    done = subprocess.run([sys.executable, "-m", "tuimon.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_refresh_leaves_the_collector_as_it_found_it() -> None:
    """heap.paused(): no collection inside, and the collector on again after, however
    the block ends (an error, a cancelled refresh)."""
    import asyncio
    import gc

    from tuimon_core import heap

    assert gc.isenabled()
    with pytest.raises(RuntimeError), heap.paused():
        assert not gc.isenabled()
        raise RuntimeError("a refresh failed")
    assert gc.isenabled()

    async def refresh() -> None:
        with heap.paused():
            await asyncio.sleep(10)

    async def cancelled() -> None:
        task = asyncio.create_task(refresh())
        await asyncio.sleep(0.01)
        assert not gc.isenabled()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert gc.isenabled()
    gc.disable()
    try:  # off before: off after
        with heap.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@need_peers
async def test_recorded_reads_the_records_once_per_evaluation(tmp_path: Path) -> None:
    """Refreshes between two evaluations of the records find them as they were and ask
    nothing but when they were evaluated; a value that changed is read after the next
    evaluation; an open node screen is read at every refresh."""
    # How busy GPU 1 is (not in MIG mode): what the busy map reads.
    line = next(row for row in A800.splitlines()
                if row.startswith('DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1"'))
    busy = ["0.33"]

    async def metrics(_: web.Request) -> web.Response:
        text = A800.replace(line, line.rsplit(" ", 1)[0] + " " + busy[0])
        return web.Response(body=text.encode(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port("127.0.0.3")
    await web.TCPSite(runner, "127.0.0.3", port).start()
    try:
        with prometheus_scraping(tmp_path, [("dcgm", f"127.0.0.3:{port}", {})],
                                 rules=live_rules_yaml(every=3)) as url:
            await _until(url, record_name("gpu_busy"), 1)
            async with aiohttp.ClientSession() as session:
                cluster = ClusterState()
                cluster.set_drawn(GPU_METRICS[0].reads)  # the busy map, the app's first
                source = PromSource(url, cluster, session,
                                    PromOptions(every=0.5, recorded=True))
                await source.refresh()  # the first: everything, inline
                source._beside = True  # as run() after its first refresh
                node = cluster.nodes["msxf-hpc-64-35-ai"]

                def busy_read() -> float:
                    return node.detail.gpus[1]["gr_active"] if node.detail else -1.0

                assert busy_read() == 0.33
                busy[0] = "0.71"
                reads, standing, asked_standing = 0, 0, []
                window = time.monotonic() + 10.0  # three evaluations or more
                while time.monotonic() < window:
                    before = source.queries_run
                    await source.refresh()
                    if source.last_refresh_read:
                        reads += 1
                    else:
                        standing += 1
                        asked_standing.append(source.queries_run - before)
                    await asyncio.sleep(0.5)
                # The new value came (a scrape a second, an evaluation every 3 s)...
                assert busy_read() == 0.71
                # ... read about once per evaluation, the refreshes between asking only
                # when the records were evaluated.
                assert reads >= 2 and standing >= reads and set(asked_standing) == {1}
                assert node.status == "up"
                # Another map drawn (other fields): read at once.
                assert "mem_used" not in node.detail.gpus[0]
                cluster.set_drawn(GPU_METRICS[1].reads)
                await source.refresh()
                assert source.last_refresh_read and "mem_used" in node.detail.gpus[0]
                cluster.set_drawn(None)  # a view that has not said: every field
                await source.refresh()
                assert source.last_refresh_read and "sm_clock" in node.detail.gpus[0]
                # A node's screen opened: read at once, and at every refresh after.
                cluster.set_detail({node.target})
                for _ in range(3):
                    await source.refresh()
                    assert source.last_refresh_read
    finally:
        await runner.cleanup()
