"""`tuimon status` against live simulated agents: the report and the exit code."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.sim.cluster import SimCluster
from tests.conftest import run_tuimon
from tuimon.model.cluster import ClusterState

ROOT = Path(__file__).resolve().parent.parent


async def _status(*args: str) -> tuple[int, str]:
    return await run_tuimon("status", *args)


async def test_healthy_cluster_is_ok(unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="healthy")
    async with sim:
        code, out = await _status(*sim.targets, "--json")
        # `tuimon status ... | head -1` where head has gone before status prints: a quiet
        # 141, not an internal error's traceback and UNKNOWN.
        root = Path(__file__).resolve().parent.parent

        def closed_reader() -> tuple[int, str]:
            proc = subprocess.Popen([sys.executable, "-m", "tuimon.cli", "status",
                                     *sim.targets], cwd=root, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE,
                                    env={**os.environ, "PYTHONPATH": str(root)})
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()
            err = proc.stderr.read().decode()
            return proc.wait(timeout=60), err
        closed, err = await asyncio.to_thread(closed_reader)
        assert closed == 141 and err == "", err[-2000:]
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


async def _steady_fault_watch(scenario: str, kind: str, base_port: int) -> None:
    sim = SimCluster(nodes=4, gpus=4, base_port=base_port, interval=0.5,
                     scenario=scenario, fault_at=0.0)
    truth = sim.truth()
    async with sim:
        code, out = await _status(*sim.targets, "--watch", "14", "--json")
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(lines) >= 10 and lines[-1]["final"], (scenario, out)

    def named(snapshot: dict) -> bool:
        return any(a["kind"] == kind and any(c in a["where"] or a["where"] in c
                                             for c in truth["components"])
                   for a in snapshot["alerts"])
    first = next(i for i, s in enumerate(lines) if named(s))
    assert first <= 8, (scenario, [s["alerts"] for s in lines])
    assert all(named(s) for s in lines[first:]), (scenario,
                                                   [s["alerts"] for s in lines[first:]])
    seen = [a for a in lines[-1]["seen"] if a["kind"] == kind]
    assert seen and seen[0]["first_seen"] < seen[0]["last_seen"], (scenario, seen)
    assert code in (1, 2), (scenario, code)


async def test_a_steady_fault_is_in_every_snapshot_of_a_watch(unused_tcp_port_factory
                                                              ) -> None:
    """`status --watch --json`: JSON lines, one a second; a fault that lasts is listed in
    every snapshot from the one that first shows it (error counters ride on one sample in
    five; throttling and congestion must hold a few seconds), and the last line lists
    everything seen with first and last seen. No topology is given. The three faults are
    watched at once (each watch is 14 s of wall time, mostly waiting)."""
    await asyncio.gather(*(
        _steady_fault_watch(scenario, kind, unused_tcp_port_factory())
        for scenario, kind in [("bad-cable", "symbol_errors"), ("hot-node", "congestion"),
                               ("thermal-straggler", "thermal")]))


# -- exit codes an on-call engineer can trust -------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_nothing_reached_is_unknown_not_ok() -> None:
    dead = [f"127.0.0.1:{_free_port()}" for _ in range(3)]
    code, out = await _status(*dead, "--json")
    report = json.loads(out)
    assert code == 3 and report["status"] == "unknown", out
    assert report["nodes"]["unreached"] == 3 and report["nodes"]["up"] == 0
    (alert,) = report["alerts"]
    assert alert["kind"] == "unreached" and "connection refused" in alert["message"]
    code, out = await _status(*dead)
    assert code == 3 and out.startswith("UNKNOWN: nodes 0 up") and "3 never reached" in out


async def test_a_snapshot_waits_for_first_steps_only_where_a_gpu_runs_something() -> None:
    from tests.seeded import seeded_cluster
    from tuimon.status import steps_may_come

    cluster, _ = await seeded_cluster(2, gpus=2)
    busy = [g.get("procs") for n in cluster.nodes.values() for g in n.sample.gpus]
    assert any(busy), busy  # the simulator's jobs run on its GPUs
    assert steps_may_come(cluster)
    for n in cluster.nodes.values():  # every GPU idle: no job can send a first step
        n.sample.gpus = [{**g, "procs": 0} for g in n.sample.gpus]
    assert not steps_may_come(cluster)
    first = next(iter(cluster.nodes.values()))
    first.sample.gpus[0].pop("procs")  # not known (Prometheus sees no process): wait
    assert steps_may_come(cluster)
    first.sample.gpus[0]["procs"] = 0
    first.sample.gpus[0]["mig"] = [{"gi": 1, "procs": None}]  # an instance unread: wait
    assert steps_may_come(cluster)
    first.sample.gpus[0]["mig"] = [{"gi": 1, "procs": 0}]
    assert not steps_may_come(cluster)
    # A node whose GPUs NVML does not show may run a job all the same, unless it is
    # said to be a CPU node.
    first.hello.gpus, first.hello.gpu_status = [], "NVML init failed: driver not loaded"
    assert steps_may_come(cluster)
    assert not steps_may_come(cluster, frozenset({first.name}))
    first.status = "stale"  # nor from a node that is not up
    assert not steps_may_come(cluster)
    assert steps_may_come(ClusterState())  # no node known yet (Prometheus not read)


async def test_a_snapshot_of_unreachable_nodes_answers_at_once() -> None:
    """A quick check of a dead node says so when the connection fails, without waiting
    out the bounds for steps no node can send."""
    from tuimon.snapshot_waits import STEPS_WAIT_S

    started = time.monotonic()
    code, out = await _status(f"127.0.0.1:{_free_port()}")
    assert code == 3 and "never reached" in out and "connection refused" in out, out
    assert time.monotonic() - started < STEPS_WAIT_S, out


async def test_some_nodes_down_is_critical(unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="healthy")
    async with sim:
        code, out = await _status(*sim.targets, f"127.0.0.1:{_free_port()}")
    assert code == 2, out
    assert "nodes 2 up / 0 stale / 0 down / 1 never reached" in out
    assert "1 node never reached" in out


async def test_a_node_whose_gpus_cannot_be_read_is_critical(unused_tcp_port_factory,
                                                            tmp_path: Path) -> None:
    """A real agent on this machine (no NVIDIA driver here) beside simulated GPU nodes:
    a node with no GPUs and a reason, in a cluster of GPU nodes, is a fault; named as a
    CPU node, it is not."""
    port = _free_port()
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", "run", "--listen", f"127.0.0.1:{port}", "--no-steps",
        "--node-name", "broken-gpu01", "--log-level", "warning", cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    sim = SimCluster(nodes=2, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="healthy")
    try:
        for _ in range(100):  # the agent up and serving
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        async with sim:
            code, out = await _status(*sim.targets, f"127.0.0.1:{port}", "--json")
            report = json.loads(out)
            kinds = {a["kind"]: a for a in report["alerts"]}
            assert code == 2 and "gpu_init_failed" in kinds, out
            assert kinds["gpu_init_failed"]["node"] == "broken-gpu01"
            assert "NVML" in kinds["gpu_init_failed"]["message"]
            code, out = await _status(*sim.targets, f"127.0.0.1:{port}",
                                      "--cpu-nodes", "broken-gpu01")
            assert code == 0, out
    finally:
        agent.terminate()
        await agent.wait()


async def test_seconds_of_a_job_below_its_slo_say_so_and_raise_no_burn_alert(
        unused_tcp_port_factory) -> None:
    """A one-shot sees a few seconds of a job far below its target: it says the burn and
    how little of each window it saw, in the text and the JSON, and raises no ticket or
    page from it (a burn alert needs most of its short window); with nothing else found
    (no topology: no leaf to name) the verdict is ok."""
    sim = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="spine-imbalance", fault_at=0.0, nodes_per_leaf=2)
    async with sim:
        code, out = await _status(*sim.targets, "--json")
        text_code, text = await _status(*sim.targets)
    report = json.loads(out)
    job = report["jobs"]["llm-pretrain"]
    assert job["sli_1m"] < 0.9 and code == 0 == text_code, out
    kinds = {a["kind"] for a in report["alerts"]}
    assert not any(k.startswith("burn_") for k in kinds), kinds
    assert job["burn_alert"] is None and 0 < job["burn_covered_s"]["5m"] < 60, job
    assert job["burn_covered_s"]["3d"] == job["burn_covered_s"]["5m"], job
    line = next(x for x in text.splitlines() if x.startswith("job llm-pretrain"))
    assert re.search(r"burn 1h \d+\.\dx \(\d+ s of 1h\) 5m", line), line
    assert "ticket" not in line and "page" not in line, line


async def test_a_one_shot_status_says_the_same_every_time(unused_tcp_port_factory) -> None:
    sim = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="healthy")
    async with sim:
        reports = []
        for _ in range(4):
            _, out = await _status(*sim.targets, "--json")
            reports.append(json.loads(out))
        _code, out = await _status(*sim.targets, "--watch", "3", "--json")
        reports.append(json.loads(out.splitlines()[-1]))
    jobs = [r["jobs"].get("llm-pretrain") for r in reports]
    assert all(j is not None and j["sli_1m"] is not None for j in jobs), jobs
    rates = [j["samples_per_s"] for j in jobs]
    assert max(rates) / min(rates) < 1.15, rates
    assert all(abs(j["sli_1m"] - jobs[0]["sli_1m"]) < 0.03 for j in jobs), jobs
    # What the rest of the step time went to: the simulated ranks wait in collectives.
    assert all(set(j["waits_1h"]) == {"comm"} and
               abs(j["waiting_1h"] - (1 - j["sli_1m"])) < 0.03 for j in jobs), jobs


async def test_the_text_status_groups_many_nodes_with_one_fault() -> None:
    from tests.seeded import judged, seeded_cluster
    from tuimon.model.efficiency import EfficiencyView
    from tuimon.status import format_text, report

    cluster, sim = await seeded_cluster(12, gpus=1)
    for m in sim.members[2:9]:
        cluster.mark_stale(m.target, "connection reset")
    _, findings = judged(cluster)
    text = format_text(report(cluster, EfficiencyView(), findings, "critical"))
    lost = [line for line in text.splitlines() if "lost" in line]
    assert len(lost) == 1, text
    assert lost[0].startswith("critical") and "7 nodes lost: sim-node[002-008]" in lost[0]


async def test_a_one_shot_status_during_an_incident_tells_what_the_app_tells(
        unused_tcp_port_factory, tmp_path: Path) -> None:
    """A leaf loses spine capacity two minutes into the run (simulated 40 times faster
    than real time, so the agents have counted the job's healthy hour... minutes before
    it): every one-shot run names the drop with the SLI from before the fault, and the
    leaf, as a viewer that watched from the start does. Nothing of it is the latest
    sample: the drop is the nodes' judgement over their windows, the leaf the cluster
    rule's, waited for."""
    sim = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=1.0,
                     scenario="spine-imbalance", fault_at=120.0, nodes_per_leaf=2, speed=40)
    topology = tmp_path / "topology.conf"
    topology.write_text(sim.topology_conf())
    async with sim:
        await asyncio.sleep(5.0)  # 200 s of the run: 80 s of it faulty
        asked = time.time()
        outs = [await _status(*sim.targets, "--topology", str(topology), "--json")
                for _ in range(2)]
        _, job_out = await _status(*sim.targets, "--job", "llm-pretrain", "--json",
                                   "--topology", str(topology))
        _, job_text = await _status(*sim.targets, "--job", "llm-pretrain")
    # Each window's SLI as the nodes counted it (their whole last minute and five
    # minutes, the part of their hour the run has had), saying how much of its window
    # it covers; none from this one-shot's few seconds.
    doc = json.loads(job_out)
    # The seconds it watched are put down to the leaf found, not to "no finding" while
    # the leaf's condition was being held before it showed.
    assert [c["cause"] for c in doc["causes"]["comm"]] == ["congestion leaf00"], doc["causes"]
    seen = doc["sli_covered_s"]
    assert set(seen) == {"1m", "5m", "1h"} and seen["1m"] == 60 and seen["5m"] == 300, seen
    assert 300 < seen["1h"] < 3240, seen
    sli_line = next(x for x in job_text.splitlines() if x.startswith("SLI"))
    assert " of 1h)" in sli_line and " of 5m)" not in sli_line and " of 1m)" not in sli_line, \
        sli_line
    assert json.loads(outs[-1][1])["jobs"]["llm-pretrain"]["sli_1m_covered_s"] == 60
    for code, out in outs:
        report = json.loads(out)
        kinds = {a["kind"]: a for a in report["alerts"]}
        assert code == 2 and "efficiency_drop" in kinds, out
        drop = kinds["efficiency_drop"]["message"]
        before = float(re.split(r"[;,\s]", drop.split("down from ")[1])[0])
        assert before >= 0.85, drop  # the healthy SLI, not one already mixed with the fault
        # The burn over the hour the nodes counted (200 s of it), not the one-shot's few
        # seconds: the rate a viewer that watched from the start shows.
        job = report["jobs"]["llm-pretrain"]
        assert 100 < job["burn_covered_s"]["1h"] < 3240, job["burn_covered_s"]
        assert job["burn_rates"]["1h"] < job["burn_rates"]["5m"], job["burn_rates"]
        # Its onset is the drop's as the nodes judged it, not when the one-shot began.
        assert kinds["efficiency_drop"]["first_seen"] < asked - 10, out
        assert kinds.get("congestion", {}).get("leaf") == "leaf00", out


async def test_one_job_whole(unused_tcp_port_factory) -> None:
    """`status --job NAME`: the job's screen as text or JSON (what its budget went to, its
    waiting, its ranks' spread, its nodes); a job nobody reports is UNKNOWN, naming the
    jobs that are."""
    sim = SimCluster(nodes=2, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="healthy")
    async with sim:
        code, out = await _status(*sim.targets, "--job", "llm-pretrain", "--json")
        text_code, text = await _status(*sim.targets, "--job", "llm-pretrain")
        missing_code, missing = await _status(*sim.targets, "--job", "nope")
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "ok" and doc["job"] == "llm-pretrain", out
    assert doc["nodes"] == ["sim-node000", "sim-node001"] and doc["world"] == 4
    assert doc["spent"][0]["kind"] == "comm" and doc["spent"][0]["share"] > 0.99, doc["spent"]
    assert sum(c["share"] for c in doc["causes"]["comm"]) == pytest.approx(1.0), doc["causes"]
    assert set(doc["waiting_1h"]["kinds"]) == {"comm"}
    assert doc["ranks"]["ranks"] == 4 and sum(doc["ranks"]["bins"]) == 4
    assert text_code == 0 and text.startswith("OK: job llm-pretrain  4 ranks  OK"), text
    assert "what the budget was spent on" in text and "  comm " in text, text
    assert "nodes  2: sim-node[000-001]" in text, text
    assert missing_code == 3 and "no job 'nope' reports steps (jobs: llm-pretrain)" in missing
