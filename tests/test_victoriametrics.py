"""`tuimon prom` on VictoriaMetrics single-node (Debian's `victoria-metrics`, started here
on loopback with its defaults) scraping real simulated agents. Its query language is
MetricsQL, a superset of PromQL that differs in corners, and by default it hides the
newest 30 s of samples from a query for "now" (-search.latencyOffset)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp

from agent.sim.cluster import SimCluster
from tests.conftest import run_tuimon
from tests.peers import running_victoria_metrics

ROOT = Path(__file__).resolve().parent.parent


async def _until_stored(url: str, promql: str, count: int, timeout: float = 20) -> float:
    """Until the server holds `count` series of `promql` (asked with nocache=1: as they
    are stored, not 30 s before); seconds waited."""
    start = time.monotonic()
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(f"{url}/api/v1/query", params={"query": promql, "nocache": "1"}) as r:
                body = await r.json()
            if len(body["data"]["result"]) >= count:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise AssertionError(f"victoria-metrics has not {count} series of {promql}")
            await asyncio.sleep(0.5)


def test_prom_on_victoria_metrics_shows_the_nodes_as_soon_as_they_are_stored(
        tmp_path: Path, unused_tcp_port_factory) -> None:
    """Within seconds of the first scrapes (not after VictoriaMetrics' 30 s offset): the
    nodes, their GPUs, the job's SLI and what it waited on, as `prom --once` and
    `status --prometheus --json` read them."""
    async def scenario() -> tuple[float, list[tuple[int, str]]]:
        sim = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.5,
                         scenario="healthy")
        async with sim:
            scrape = ("  - job_name: tuimon\n    static_configs:\n"
                      f"      - targets: {json.dumps(sim.targets)}\n")
            with running_victoria_metrics(tmp_path, scrape) as url:
                started = time.monotonic()
                await _until_stored(url, "tuimon_gpu_utilization_ratio", 2)
                await _until_stored(url, "rate(tuimon_job_wall_seconds_total[1m]) > 0", 2)
                runs = [await run_tuimon("prom", url, "--once"),
                        await run_tuimon("status", "--prometheus", url, "--json")]
                return time.monotonic() - started, runs
    elapsed, ((code, out), (status_code, status)) = asyncio.run(scenario())
    assert elapsed < 25, elapsed  # all of it inside the server's 30 s offset
    assert code == 0 and "nodes up 2" in out, out
    assert "sim-node000" in out and "sim-node001" in out, out
    job = next(line for line in out.splitlines() if line.startswith("job llm-pretrain"))
    assert "SLI 0." in job, out
    report = json.loads(status)
    assert status_code in (0, 1) and report["nodes"]["up"] == 2, status
    assert report["gpus"] == 2 and set(report["jobs"]) == {"llm-pretrain"}, status
    waits = report["jobs"]["llm-pretrain"]["waits_1h"]
    assert waits and max(waits, key=waits.__getitem__) == "comm", status
