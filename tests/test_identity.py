"""A node's findings, inventory and causes come from the target that holds its name
(tuimon_core.identity): a hostile agent that calls itself like an honest node is a
`duplicate_name` finding, shown, never merged; on the viewer, the relay and in the
fleet comparison alike."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

from tests.test_hostile import fake_agents
from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Diagnosis
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.storage import StorageView
from tuimon.relay import Relay, RelayConfig
from tuimon.sources.agent_stream import StreamOptions, watching
from tuimon_core.findings import Finding
from tuimon_core.findings_family import findings_to_wire
from tuimon_core.fleet import fleet_findings
from tuimon_core.identity import NameHolders, named_by
from tuimon_core.protocol import Hello, Sample, encode

OPTIONS = StreamOptions(min_backoff=0.1, max_backoff=0.3)


def _agent(name: str, kernel: str, findings: list[Finding], delay: float = 0.0
           ) -> Callable[[web.WebSocketResponse, web.Request], object]:
    async def behave(ws: web.WebSocketResponse, _: web.Request) -> None:
        await asyncio.sleep(delay)
        await ws.send_bytes(encode(Hello(node=name, agent_version="t", boot_id=None,
                                         interval=0.2, ts=time.time(),
                                         host={"kernel": kernel})))
        for seq in range(1, 100_000):
            await ws.send_bytes(encode(Sample(
                seq=seq, ts=time.time(), interval=0.2, gpus=None, host={},
                extra={"findings": findings_to_wire(findings)})))
            await asyncio.sleep(0.2)
    return behave


DOWNTRAINED = Finding("warning", "pcie_downtrained", "GPU 3 PCIe Gen1 x16 of Gen5 x16 "
                      "while busy", node="x", gpu=3, score=0.9)


async def _until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_a_borrowed_name_is_refused_and_named_on_the_viewer() -> None:
    """gpu042 (honest, first) and a clone that says gpu042 with a downtrained link and
    another kernel, beside two more honest nodes: the clone's finding is not gpu042's,
    the fleet's kernel comparison is not moved by it, and the clone is named."""
    agents = [_agent("gpu042", "6.1", []), _agent("gpu043", "6.1", []),
              _agent("gpu044", "6.1", []),
              _agent("gpu042", "5.4", [DOWNTRAINED], delay=1.0)]
    async with fake_agents(agents) as targets:
        cluster = ClusterState()
        diagnosis = Diagnosis()
        async with watching(targets, cluster, OPTIONS):
            clone = targets[3]
            await _until(lambda: cluster.names.refused(clone) is not None, "the clone refused")
            await asyncio.sleep(0.6)  # its samples come and are dropped
            found = diagnosis.update(cluster, EfficiencyView(), StorageView())
    # About the clone, not the node whose name it took: nothing is said of gpu042 itself.
    [dup] = [f for f in found if f.kind == "duplicate_name"]
    assert dup.node is None and dup.target == clone and "gpu042 is said by 2" in dup.message
    assert not any(f.kind == "pcie_downtrained" for f in found), found
    assert not any(f.kind == "fleet_skew" for f in found), found  # no 5.4 on "gpu042"
    assert not any(f.kind == "node_lost" for f in found), found
    node = cluster.nodes[clone]
    assert node.name != "gpu042" and "held by" in (node.reason or "")
    assert cluster.nodes[targets[0]].hello.host["kernel"] == "6.1"


async def test_the_configured_name_holds_it_even_when_a_clone_came_first() -> None:
    """A target whose host is the node's name (`localhost:PORT` saying `localhost`) holds
    the name though a clone at another address said it first."""
    agents = [_agent("localhost", "5.4", [DOWNTRAINED]), _agent("localhost", "6.1", [],
                                                                delay=1.0)]
    async with fake_agents(agents) as (clone, honest):
        honest = honest.replace("127.0.0.1", "localhost")
        cluster = ClusterState()
        async with watching([clone, honest], cluster, OPTIONS):
            await _until(lambda: cluster.names.holder("localhost") == honest,
                         "the configured target holding its name")
            await _until(lambda: cluster.nodes[honest].status == "up", "the honest node up")
            found = Diagnosis().update(cluster, EfficiencyView(), StorageView())
    assert cluster.names.refused(clone) is not None
    assert not any(f.kind == "pcie_downtrained" for f in found), found
    assert cluster.nodes[honest].hello.host["kernel"] == "6.1"


async def test_a_relay_takes_a_borrowed_name_from_the_holder_only() -> None:
    """Through a relay: its /metrics names the duplicate and none of the clone's
    findings, and its viewers see the clone refused with the reason, under its address."""
    agents = [_agent("gpu042", "6.1", []), _agent("gpu042", "5.4", [DOWNTRAINED], delay=1.0)]
    async with fake_agents(agents) as (honest, clone), Relay(RelayConfig(
            targets=[honest, clone], listen="127.0.0.1:0", interval=0.2,
            upstream_backoff=(0.1, 0.5))) as relay:
        fan = relay.state.fanout
        await _until(lambda: fan.names.refused(clone) is not None, "the clone refused")
        viewer = ClusterState()
        async with watching([], viewer, OPTIONS, relays=[f"127.0.0.1:{relay.port}"]):
            await _until(lambda: clone in viewer.nodes and "held by" in (
                viewer.nodes[clone].reason or ""), "the viewer told why")
            await asyncio.sleep(1.5)
            async with aiohttp.ClientSession() as http, \
                    http.get(f"{relay.url}/metrics") as r:
                metrics = await r.text()
    assert 'kind="duplicate_name"' in metrics, metrics
    assert "pcie_downtrained" not in metrics
    assert viewer.nodes[honest].status == "up"
    assert viewer.nodes[clone].hello is None


def test_names_held_and_refused() -> None:
    names = NameHolders()
    assert names.claim("a:9477", "gpu1") == []
    assert names.claim("b:9477", "gpu1") == ["b:9477"]
    assert names.refused("b:9477") is not None and names.holder("gpu1") == "a:9477"
    # The configured one takes it from a first-comer, which is refused in its turn.
    assert names.claim("gpu1:9477", "gpu1") == ["a:9477"]
    assert names.holder("gpu1") == "gpu1:9477" and names.refused("a:9477") is not None
    # A refused target that says its own name is free again.
    assert names.claim("b:9477", "gpu2") == [] and names.refused("b:9477") is None
    assert named_by("gpu1.cluster.example:9477", "gpu1")
    assert named_by("[::1]:9477", "::1") and not named_by("gpu10:9477", "gpu1")


def _hello(kernel: str) -> Hello:
    return Hello(node="n", agent_version="t", boot_id=None, interval=1.0, ts=0.0,
                 host={"kernel": kernel})


def test_fleet_majority_with_a_tie_and_three_values() -> None:
    """2:1 names the one; 2:1:1 still names the two odd nodes (a third value does not
    hide the first difference); 2:2 and 1:1:1 are a split fleet, every group named."""
    def kernels(*values: str) -> list[str]:
        found = fleet_findings({f"n{i}": _hello(v) for i, v in enumerate(values)})
        return [f.message for f in found]

    assert kernels("a", "a", "b") == ["kernel: b on n2 (1 node); a on 2"]
    assert kernels("a", "a", "b", "c") == ["kernel: b on n2 (1 node); c on n3 (1 node); "
                                          "a on 2"]
    assert kernels("a", "a", "b", "b") == ["kernel: split, no value on most nodes: "
                                          "a on n[0-1] (2 nodes); b on n[2-3] (2 nodes)"]
    assert kernels("a", "b", "c")[0].startswith("kernel: split")
    assert kernels("a", "a", "a") == [] and kernels("a", "b") == []
