"""`tuimon status` against live simulated agents: the report and the exit code."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from agent.sim.cluster import SimCluster

ROOT = Path(__file__).resolve().parent.parent


async def _status(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tuimon.cli", "status", *args, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode() + err.decode()


async def test_healthy_cluster_is_ok(unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="healthy")
    async with sim:
        code, out = await _status(*sim.targets, "--json")
    report = json.loads(out)
    assert code == 0 and report["status"] == "ok"
    assert report["nodes"]["up"] == 4 and report["gpus"] == 8 and report["alerts"] == []


async def test_a_lost_gpu_is_critical_and_named(unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="xid-79", fault_at=0.0)
    truth = sim.truth()
    async with sim:
        code, out = await _status(*sim.targets)
    assert code == 2, out
    assert out.startswith("CRITICAL: nodes 4 up")
    assert truth["components"][0] in out and "failed" in out


async def test_watch_keeps_the_worst_status_seen(unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="healthy")
    async with sim:
        task = asyncio.create_task(_status(*sim.targets, "--watch", "6"))
        await asyncio.sleep(3.0)
        await sim.stop_node(1)  # lost mid-watch
        code, out = await task
    assert code == 2, out
    assert "node_lost" not in out and "sim-node001" in out


@pytest.mark.parametrize(("scenario", "kind"), [("bad-cable", "symbol_errors"),
                                                ("hot-node", "congestion"),
                                                ("thermal-straggler", "thermal")])
async def test_a_steady_fault_is_in_every_snapshot_of_a_watch(
        scenario: str, kind: str, unused_tcp_port_factory) -> None:
    """`status --watch --json`: JSON lines, one a second; a fault that lasts is listed in
    every snapshot from the one that first shows it (error counters ride on one sample in
    five; throttling and congestion must hold a few seconds), and the last line lists
    everything seen with first and last seen. No topology is given."""
    sim = SimCluster(nodes=4, gpus=4, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario=scenario, fault_at=0.0)
    truth = sim.truth()
    async with sim:
        code, out = await _status(*sim.targets, "--watch", "14", "--json")
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(lines) >= 10 and lines[-1]["final"], out

    def named(snapshot: dict) -> bool:
        return any(a["kind"] == kind and any(c in a["where"] or a["where"] in c
                                             for c in truth["components"])
                   for a in snapshot["alerts"])
    first = next(i for i, s in enumerate(lines) if named(s))
    assert first <= 8, [s["alerts"] for s in lines]
    assert all(named(s) for s in lines[first:]), [s["alerts"] for s in lines[first:]]
    seen = [a for a in lines[-1]["seen"] if a["kind"] == kind]
    assert seen and seen[0]["first_seen"] < seen[0]["last_seen"]
    assert code in (1, 2)
