"""One name table (tuimon_core.protocol.fields): the agent's /metrics, `tuimon prom`'s
mapping back, dcgm-exporter's names and the documents all agree with it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import make_registry, render
from agent.sim.fake_nvml import FakeGpu, FakeNvml
from tests.conftest import make_agent
from tuimon.model.cluster import ClusterState
from tuimon.sources import prom_queries as q
from tuimon.sources.prom_nodes import NodeNames
from tuimon.sources.prometheus import PromOptions, PromSource
from tuimon_core.protocol.fields import GPU_FIELDS, HOST_FIELDS

DOCS = Path(__file__).resolve().parent.parent / "docs"


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
    source = PromSource("http://unused", ClusterState(), None, PromOptions())  # type: ignore[arg-type]
    nodes = source._assemble(answers, NodeNames())
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
    tiers = (q.LIVE_QUERIES["gpu"], q.LIVE_QUERIES["gpu_sparse"],
             q.INVENTORY_QUERIES["gpu_slow"])
    for name, (key, _, _) in {**q.DCGM_GPU, **q.TUIMON_GPU}.items():
        assert name in detail, name
        asked = [t for t in tiers if name in t]
        tiered = key in q.DENSE_GPU | q.SPARSE_GPU | q.SLOW_GPU
        assert len(asked) == (1 if tiered else 0), (name, key)
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
