"""One name table (tuimon_core.protocol.fields): the agent's /metrics, `tuimon prom`'s
mapping back, dcgm-exporter's names and the documents all agree with it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import make_registry, render
from agent.sim.fake_nvml import FakeGpu, FakeNvml
from tests.conftest import make_agent
from tuimon.sources import prom_queries as q
from tuimon.sources.prom_assembly import Assembler
from tuimon.sources.prom_inventory import read_inventory
from tuimon.sources.prom_nodes import NodeNames
from tuimon_core.protocol.fields import GPU_FIELDS, HOST_FIELDS

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _assembled(answers: dict[str, list[tuple[dict[str, str], float]]],
               resolver: NodeNames | None = None, detail: frozenset[str] = frozenset(),
               assembler: Assembler | None = None) -> dict[str, Any]:
    """The nodes one refresh makes of these answers (the inventory's kept, as a refresh
    keeps them), with no server: the assembler alone."""
    resolver = resolver or NodeNames()
    kept = read_inventory({n: s for n, s in answers.items() if n in q.INVENTORY_QUERIES},
                          resolver)
    return (assembler or Assembler()).assemble(answers, resolver, clock=0.0, kept=kept,
                                                detail=detail).nodes


def _series(text: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.append(({**s.labels, "__name__": s.name}, s.value))
    return out


def test_what_the_agent_exports_tuimon_prom_reads_back_as_the_same_values(
        proc_root: Path) -> None:
    """Every GPU and host value the agent puts in /metrics comes back, through the
    queries' mapping, as the value the agent's own frame carried."""
    fake = FakeNvml([FakeGpu(i, util_gpu=40 + i, util_mem=20, mem_used=(30 + i) * 2**30,
                             temp=60 + i, power_mw=500_000 + i, energy_mj=10_000_000,
                             sm_mhz=1800, mem_mhz=2600, pstate=0, ecc_corrected=3,
                             pcie_tx_kbs=1000, pcie_rx_kbs=2000, procs=[(1, 2**30)])
                     for i in range(2)])
    agent = make_agent(proc_root, fake)

    async def scrape() -> tuple[list[dict], dict, str]:
        await agent.start(sampling=False)
        await agent.sample_once()
        sample = await agent.sample_once()
        text = render(make_registry(agent)).decode()
        await agent.stop()
        return sample.gpus or [], sample.host or {}, text

    gpus, host, text = asyncio.run(scrape())
    series = _series(text)
    answers = {"gpu": [(lab, v) for lab, v in series if lab["__name__"] in q.TUIMON_GPU],
               "host": [(lab, v) for lab, v in series if lab["__name__"] in q.HOST]}
    answers["gpu_info"] = answers["gpu"]
    nodes = _assembled(answers)
    back = nodes["node-a"]
    checked = 0
    for f in GPU_FIELDS:
        if f.exposed is None:
            continue
        for i, values in enumerate(gpus):
            if values.get(f.key) is None:
                continue
            assert back.gpus[i].get(f.key) == pytest.approx(values[f.key]), (f.key, i)
            checked += 1
    for f in HOST_FIELDS:
        if f.exposed is not None and host.get(f.key) is not None:
            assert back.host.get(f.key) == pytest.approx(host[f.key]), f.key
            checked += 1
    assert checked > 30


def test_every_dcgm_name_maps_to_a_wire_field_and_the_queries_ask_for_it() -> None:
    """Every GPU name is asked: each refresh of every GPU, of those with something to say,
    with the inventory, or for the node whose screen is open."""
    keys = {f.key for f in GPU_FIELDS}
    for name, (key, scale, _) in q.DCGM_GPU.items():
        assert name.startswith("DCGM_FI_") and (key in keys or key.startswith("_")), name
        assert scale > 0
    detail = q.detail_query(['Hostname="gpu001"'], "") or ""
    tiers = (q.DENSE_GPU, frozenset(q.BUSY), q.SPARSE_GPU, q.SLOW_GPU)
    for name, (key, _, _) in {**q.DCGM_GPU, **q.TUIMON_GPU}.items():
        assert name in detail, name
        assert sum(key in tier for tier in tiers) <= 1, (name, key)  # one tier at most
        for tier, query in zip(tiers, ("gpu", "gpu_busy", "gpu_sparse", "gpu_slow")):
            if key in tier:
                assert f"|{name}|" in "|" + (q.LIVE_QUERIES.get(query) or
                                             q.INVENTORY_QUERIES[query]).replace('"', "|"), name
    for f in HOST_FIELDS:
        for name in (f.exposed, f.node_exporter):
            if name:
                assert name in q.LIVE_QUERIES["host"], name


def test_the_documents_follow_the_table() -> None:
    metrics = (DOCS / "metrics.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z_0-9.]+)` \| [^|]+ \| (`tuimon_[a-z_0-9]+`|-) \|",
                           metrics, re.M))
    for prefix, fields in (("", GPU_FIELDS), ("host.", HOST_FIELDS)):
        for f in fields:
            if f.metric or f.dcgm or f.node_exporter:
                assert prefix + f.key in rows, f.key
                assert rows[prefix + f.key] == (f"`{f.exposed}`" if f.exposed else "-"), f.key
        for d in f.dcgm:
            assert f"`{d.name}`" in metrics, d.name
    protocol = (DOCS / "protocol.md").read_text()
    for f in GPU_FIELDS:
        assert f"| `{f.key}` | {f.kind} | {f.unit} |" in protocol, f.key


def _dcgm(host: str, name: str, gpu: int, value: float) -> tuple[dict[str, str], float]:
    """A series as the aggregated queries return it: its name, GPU and whose it is."""
    return ({"__name__": name, "gpu": str(gpu), "Hostname": host,
             "instance": f"{host}:9400"}, value)


def test_a_nodes_screen_open_counts_its_summed_fields_once() -> None:
    """Retired pages are single- plus double-bit retirements: with the node's screen open
    its every series comes in the detail answer as well as in the sparse one; counted
    once, not twice."""
    retired = [_dcgm("gpu001", "DCGM_FI_DEV_RETIRED_SBE", 0, 2),
               _dcgm("gpu001", "DCGM_FI_DEV_RETIRED_DBE", 0, 1)]
    answers = {"gpu": [_dcgm("gpu001", "DCGM_FI_DEV_GPU_TEMP", 0, 60)],
               "gpu_sparse": retired,
               "gpu_detail": [_dcgm("gpu001", "DCGM_FI_DEV_GPU_TEMP", 0, 60), *retired]}
    for detail in (set(), {"gpu001"}):
        nodes = _assembled({k: v for k, v in answers.items() if detail or k != "gpu_detail"},
                           detail=frozenset(detail))
        assert nodes["gpu001"].gpus[0]["retired_pages"] == 3, detail


def test_health_counters_a_node_exports_start_from_zero() -> None:
    """Only GPUs with a nonzero counter answer the sparse query; a GPU of a node that
    exports the counter is at 0, so its first error is an increase the rules see."""
    answers = {"gpu": [_dcgm("gpu001", "DCGM_FI_DEV_GPU_TEMP", i, 60) for i in range(2)]
               + [_dcgm("gpu002", "DCGM_FI_DEV_GPU_TEMP", 0, 60)],
               "gpu_sparse": [_dcgm("gpu001", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                                    1, 3)],
               "gpu_exported": [({"__name__": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                                  "Hostname": "gpu001", "instance": "gpu001:9400"}, 1.0)]}
    nodes = _assembled(answers)
    assert [g.get("nvlink_recovery_errors") for g in nodes["gpu001"].gpus.values()] == [0, 3]
    assert "nvlink_recovery_errors" not in nodes["gpu002"].gpus[0]  # not exported there


def test_the_kept_inventory_brings_back_no_gpu_that_has_gone() -> None:
    answers = {"gpu": [_dcgm("gpu001", "DCGM_FI_DEV_GPU_TEMP", 0, 60)],
               "gpu_slow": [_dcgm("gpu001", "DCGM_FI_DEV_POWER_MGMT_LIMIT", i, 700)
                            for i in range(2)] + [_dcgm("gone", "DCGM_FI_DEV_PSTATE", 0, 0)]}
    nodes = _assembled(answers)
    assert set(nodes) == {"gpu001"} and list(nodes["gpu001"].gpus) == [0]
    assert nodes["gpu001"].gpus[0]["power_limit"] == 700


def test_a_merged_node_keeps_the_matchers_that_fetch_its_screen() -> None:
    """dcgm-exporter says `gpu001.cluster.local`, node_exporter's uname `gpu001`: one
    node, and its screen's detail query still selects the exporter's series."""
    assembler = Assembler()
    resolver = NodeNames()
    fqdn = _dcgm("gpu001.cluster.local", "DCGM_FI_DEV_GPU_TEMP", 0, 60)
    answers = {"gpu": [fqdn], "gpu_info": [fqdn],
               "host": [({"__name__": "node_load1", "instance": "10.0.0.1:9100"}, 1.0)],
               "uname": [({"instance": "10.0.0.1:9100", "nodename": "gpu001"}, 1.0)]}
    resolver.learn_uname(answers["uname"])
    nodes = _assembled(answers, resolver, frozenset({"gpu001"}), assembler)
    assert set(nodes) == {"gpu001"}
    assert assembler.matchers["gpu001"] == {'Hostname="gpu001.cluster.local"'}
    detail = q.detail_query(assembler.matchers["gpu001"], "")
    assert detail is not None and 'Hostname="gpu001.cluster.local"' in detail


def test_one_target_answering_for_many_machines_names_none_of_them() -> None:
    """Behind federation or an exporter proxy one instance carries every node's uname:
    its failed scrape, named by the instance alone, is the target's, not the last
    node's in the answer."""
    resolver = NodeNames()
    resolver.learn_uname([({"instance": "10.0.0.9:9100", "nodename": f"gpu{i:03d}",
                            "node": f"gpu{i:03d}"}, 1.0) for i in range(3)]
                         + [({"instance": "10.0.0.1:9100", "nodename": "gpu101"}, 1.0)])
    assert resolver.of({"job": "node", "instance": "10.0.0.9:9100"}) == "10.0.0.9"
    assert resolver.of({"instance": "10.0.0.9:9100", "node": "gpu002"}) == "gpu002"
    assert resolver.of({"instance": "10.0.0.1:9400"}) == "gpu101"  # one machine: joined
    # A host that named one machine and now answers for several names none.
    resolver.learn_uname([({"instance": "10.0.0.1:9100", "nodename": n}, 1.0)
                          for n in ("gpu101", "gpu102")])
    assert resolver.of({"instance": "10.0.0.1:9400"}) == "10.0.0.1"


def test_a_label_value_with_a_newline_is_quoted_as_promql_reads_it() -> None:
    assert NodeNames().matcher({"Hostname": 'a\nb"c\\'}) == 'Hostname="a\\nb\\"c\\\\"'


def test_an_exporters_own_memory_total_wins_over_the_one_summed() -> None:
    """used + free + reserved, summed by the server, stands in for a total only where
    the exporter gives none; a GPU with no total yet (new since the inventory) has the
    inventory run again soon."""
    made = ({"__name__": q.FB_TOTAL, "gpu": "0", "Hostname": "gpu001",
             "instance": "gpu001:9400"}, 81000.0)
    own = _dcgm("gpu001", "DCGM_FI_DEV_FB_TOTAL", 0, 81559)
    answers = {"gpu": [_dcgm("gpu001", "DCGM_FI_DEV_FB_USED", 0, 1000),
                       _dcgm("gpu002", "DCGM_FI_DEV_FB_USED", 0, 1000)],
               "gpu_total": [made], "gpu_slow": [own]}
    nodes = _assembled(answers)
    assert nodes["gpu001"].gpus[0]["mem_total"] == 81559 * 2**20
    answers.pop("gpu_slow")
    assert _assembled(answers)["gpu001"].gpus[0]["mem_total"] == \
        81000 * 2**20
    assert "mem_total" not in nodes["gpu002"].gpus[0]
