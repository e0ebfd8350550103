"""One story on every path: a leaf loses spine capacity (an onset no reader is told) and,
at one moment, every reader an on-call would look with says the same. The app watched
the agents from the start (its strip and its job screen); one-shot `status`, `status
--job` and their JSON read the agents; `status --prometheus` and `tuimon prom --once`
read a real Prometheus that scraped the same agents. Their SLI windows, their burn
windows and rates, what the step time waited on, the findings (the leaf's congestion,
the efficiency drop naming it first) and what the waiting is put down to agree, within
what the stated tolerances allow: the sources sample the same counters at moments up
to a scrape apart."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from agent.sim.cluster import SimCluster
from tests.conftest import run_tuimon
from tests.peers import require_prometheus, running_prometheus
from tests.seeded import watched_by_app
from tuimon.model.cluster import ClusterState
from tuimon.model.job_report import job_report
from tuimon.model.judge_config import JudgeConfig
from tuimon.sources.agent_stream import StreamOptions
from tuimon.ui.app import TuimonApp
from tuimon.ui.job_screen import JobScreen

JOB = "llm-pretrain"
SLI_TOLERANCE = 0.03  # one SLI read a scrape (a second) apart, 40 s into a fault
BURN_TOLERANCE = 0.15  # of the rate: the same hour, counted up to a scrape apart


@pytest.mark.timeout(300)  # two minutes of a run, then the readers
async def test_every_reader_tells_the_same_story_at_the_same_moment(
        tmp_path: Path, unused_tcp_port_factory) -> None:
    require_prometheus()
    sim = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=1.0,
                     scenario="spine-imbalance", fault_at=90.0, nodes_per_leaf=2)
    leaf = sim.truth()["components"][0]
    topology = tmp_path / "topology.conf"
    topology.write_text(sim.topology_conf())
    scrape = ("  - job_name: tuimon\n    static_configs:\n"
              f"      - targets: {sim.targets!r}\n").replace("'", '"')
    cluster = ClusterState("on-call")
    sources = watched_by_app(sim.targets, StreamOptions(min_backoff=0.1, max_backoff=0.3))

    async with sim:
        with running_prometheus(tmp_path, scrape, every=1.0) as prom:
            topo = ("--topology", str(topology))
            leaves = {m.name: sim.leaf_of(m.index) for m in sim.members}
            app = TuimonApp(cluster, sources=sources, refresh=1.0,
                            judgement=JudgeConfig(topology=leaves).judgement(cluster))
            async with app.run_test(size=(200, 50)) as pilot:
                # 40 s into the fault: the drop is judged (the minute before it and more
                # counted healthy on every path), the leaf's congestion held.
                await asyncio.sleep(max(0.0, sim.truth()["onset"] + 40 - time.time()))
                readers = await asyncio.gather(
                    run_tuimon("status", *sim.targets, *topo, "--json", timeout=90),
                    run_tuimon("status", *sim.targets, *topo, "--job", JOB, "--json",
                               timeout=90),
                    run_tuimon("status", "--prometheus", prom, *topo, "--json", timeout=90),
                    run_tuimon("prom", prom, "--once", "--json", *topo, timeout=90),
                    run_tuimon("status", "--prometheus", prom, *topo, "--job", JOB,
                               "--json", timeout=90))
                strip = str(app.query_one("SloStrip").render())
                screen = job_report(app.efficiency, JOB, app.diagnosis.findings)
                await pilot.press("b")
                await pilot.pause()
                assert isinstance(app.screen, JobScreen)
    (direct_code, direct), (_, direct_job), (prom_code, via_prom), (_, judge), \
        (_, prom_job) = [(code, json.loads(out)) for code, out in readers]

    # The findings: the leaf's congestion everywhere, and the efficiency drop, critical,
    # leading with it; so the verdict is critical on both paths.
    for name, doc in (("status", direct), ("status --prometheus", via_prom),
                      ("prom --once", judge)):
        kinds = {a["kind"]: a for a in doc["alerts"]}
        assert kinds.get("congestion", {}).get("leaf") == leaf, (name, doc["alerts"])
        drop = kinds.get("efficiency_drop")
        assert drop and drop["message"].startswith(f"likely congestion {leaf} -> {JOB}"), \
            (name, doc["alerts"])
        assert doc["status"] == "critical", (name, doc["status"])
    assert direct_code == prom_code == 2
    assert any(f.kind == "efficiency_drop" and f"congestion {leaf}" in f.message
               for f in app.diagnosis.findings)

    # The SLI of the last minute, whole on every path.
    jobs = {"status": direct["jobs"][JOB], "status --prometheus": via_prom["jobs"][JOB],
            "prom --once": judge["jobs"][JOB]}
    slis = {name: j["sli_1m"] for name, j in jobs.items()}
    slis["status --job"] = direct_job["sli"]["1m"]
    slis["status --prometheus --job"] = prom_job["sli"]["1m"]
    slis["job screen"] = screen["sli"]["1m"]
    strip_sli = re.search(r"1m (\d\.\d\d)", strip)
    assert strip_sli, strip
    slis["strip"] = float(strip_sli.group(1))
    assert max(slis.values()) - min(slis.values()) <= SLI_TOLERANCE, slis
    assert all(j["sli_1m_covered_s"] == 60 for j in jobs.values()), jobs

    # The burn: the same windows, each over the hour the job ran (not a one-shot's
    # seconds), at the same rate.
    for name, j in jobs.items():
        assert j["burn_covered_s"]["1h"] > 120, (name, j["burn_covered_s"])
    hour = [j["burn_rates"]["1h"] for j in jobs.values()]
    assert max(hour) - min(hour) <= BURN_TOLERANCE * max(hour), jobs
    windows = {name: re.findall(r"(\d+[mhd]) \d", j["burn"]) for name, j in jobs.items()}
    assert len({tuple(w) for w in windows.values()}) == 1, windows

    # What the step time waited on over the hour: the collectives, the same share.
    waits = {name: j["waits_1h"].get("comm", 0.0) for name, j in jobs.items()}
    waits["job screen"] = screen["waiting_1h"]["kinds"].get("comm", 0.0)
    assert max(waits.values()) - min(waits.values()) <= SLI_TOLERANCE, waits

    # What the waiting is put down to: the leaf, by every reader that counts it.
    for name, doc in (("status --job", direct_job), ("status --prometheus --job", prom_job)):
        causes = [c["cause"] for c in doc["causes"]["comm"]]
        assert causes == [f"congestion {leaf}"], (name, doc["causes"])
    assert f"congestion {leaf}" in [c["cause"] for c in screen["causes"]["comm"]], \
        screen["causes"]

