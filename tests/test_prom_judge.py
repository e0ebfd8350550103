"""`tuimon prom URL --serve HOST:PORT`: the judgement over Prometheus with no screen, as
its own process, against a real Prometheus scraping simulated agents: a site without a
relay is paged with the cause too, and a Prometheus gone is one finding, not every node
lost."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.sim.cluster import SimCluster
from tests.conftest import run_tuimon
from tests.peers import PROMETHEUS, free_port, running_prometheus

ROOT = Path(__file__).resolve().parent.parent


def _require_prometheus() -> None:
    if PROMETHEUS is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus not found: CI installs it (apt-get install prometheus)")
        pytest.skip("prometheus not installed (apt-get install prometheus); CI installs it")


def topology_conf(sim: SimCluster) -> str:
    """The simulated cluster's leaves as a Slurm topology.conf."""
    leaves: dict[str, list[str]] = {}
    for m in sim.members:
        leaves.setdefault(sim.leaf_of(m.index), []).append(m.name)
    return "".join(f"SwitchName={leaf} Nodes={','.join(names)}\n"
                   for leaf, names in leaves.items())


@asynccontextmanager
async def judging(*args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`tuimon prom ... --serve` as its own process; yields it and its /metrics URL once
    it answers. Stopped with SIGTERM, as a service manager stops it."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tuimon.cli", "prom", *args, "--serve", f"127.0.0.1:{port}",
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=log, stderr=asyncio.subprocess.STDOUT)
        try:
            url = await _serving(proc, f"http://127.0.0.1:{port}/metrics")
            yield proc, url
        except BaseException:
            log.seek(0)
            print("the judge said:\n" + log.read().decode(errors="replace")[-4000:])
            raise
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 15)
                except asyncio.TimeoutError:
                    proc.kill()
                    await proc.wait()


async def _serving(proc: asyncio.subprocess.Process, url: str) -> str:
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as http:
        while True:
            assert proc.returncode is None, "the judge exited at start"
            try:
                async with http.get(url) as r:
                    if r.status == 200:
                        return url
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, "the judge never served /metrics"
            await asyncio.sleep(0.3)


async def scrape(url: str) -> dict[str, list]:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        text = await r.text()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


async def until(url: str, check, what: str, timeout: float = 120.0) -> dict[str, list]:
    deadline = time.monotonic() + timeout
    while True:
        families = await scrape(url)
        if check(families):
            return families
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {families}"
        await asyncio.sleep(1.0)


def findings(families: dict[str, list]) -> list[dict[str, str]]:
    return [s.labels for s in families.get("tuimon_finding", [])]


async def test_the_seed_incident_through_prometheus_is_served_with_the_leaf_named(
        tmp_path: Path, unused_tcp_port_factory) -> None:
    """A leaf loses spine capacity (an onset the judge is not told), the agents scraped by
    a real Prometheus and nothing else: the headless judge serves `tuimon_finding` naming
    the leaf, its text and its onset; nothing graver than information before. Then
    Prometheus stops: one `source_lost` finding and `tuimon_judge_prometheus_up` 0, no
    node said lost; the judge goes on serving, and stops cleanly on SIGTERM."""
    _require_prometheus()
    sim = SimCluster(nodes=16, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="spine-imbalance", fault_at=20.0)
    leaf = sim.truth()["components"][0]
    topology = tmp_path / "topology.conf"
    topology.write_text(topology_conf(sim))
    scrape_config = ("  - job_name: tuimon\n    static_configs:\n"
                     f"      - targets: {sim.targets!r}\n").replace("'", '"')
    async with sim:
        with contextlib.ExitStack() as prometheus:
            prom = prometheus.enter_context(running_prometheus(tmp_path, scrape_config,
                                                               every=1.0))
            async with judging(prom, "--every", "1", "--topology", str(topology)) as (proc, url):
                early: list[dict[str, str]] = []

                def named(families: dict[str, list]) -> bool:
                    held = findings(families)
                    if time.time() < sim.truth()["onset"]:
                        early.extend(f for f in held if f["severity"] != "info")
                    return any(f["kind"] == "congestion" and f["leaf"] == leaf for f in held)
                families = await until(url, named, f"congestion under {leaf}", timeout=150)
                assert early == [], early
                up = {s.labels["url"]: s.value
                      for s in families["tuimon_judge_prometheus_up"]}
                assert up == {prom: 1.0}
                text = next(s.labels["text"] for s in families["tuimon_finding_info"]
                            if s.labels["kind"] == "congestion")
                assert f"under {leaf}" in text, text
                began = next(s.value for s in families["tuimon_finding_since_seconds"]
                             if s.labels["kind"] == "congestion")
                assert sim.truth()["onset"] - 5 <= began <= time.time(), began
                nodes = {s.labels["status"]: s.value for s in families["tuimon_judge_nodes"]}
                assert nodes["up"] == 16, nodes
                # The one-shots at the same moment tell the same story: the leaf named in
                # the text and in the JSON, and the same verdict as their exit code.
                (code, text), (json_code, document) = [
                    await run_tuimon("prom", prom, "--once", *extra, "--topology",
                                     str(topology), timeout=90)
                    for extra in ((), ("--json",))]
                assert f"congestion concentrated under {leaf}" in text, text
                assert leaf in document and "congestion" in document, document
                assert code == json_code >= 1, (code, json_code, text)
                prometheus.close()  # Prometheus stops; the judge goes on
                families = await until(
                    url, lambda f: any(x["kind"] == "source_lost" for x in findings(f)),
                    "Prometheus said gone", timeout=60)
                assert [s.value for s in families["tuimon_judge_prometheus_up"]] == [0.0]
                kinds = [(f["kind"], f["severity"]) for f in findings(families)]
                assert ("source_lost", "critical") in kinds, kinds
                assert not any(k == "node_lost" for k, _ in kinds), kinds
                # The leaf's congestion is not known to have cleared: kept, saying so.
                text = next(s.labels["text"] for s in families["tuimon_finding_info"]
                            if s.labels["kind"] == "congestion")
                assert f"under {leaf}" in text and "no data since" in text, text
                nodes = {s.labels["status"]: s.value for s in families["tuimon_judge_nodes"]}
                assert nodes["unknown"] == 16, nodes
                assert proc.returncode is None
    assert proc.returncode == 0


async def test_serve_options_are_checked_before_anything_listens(tmp_path: Path) -> None:
    """A judge that would serve the findings to anyone off loopback, or draw a screen as
    well, is refused with the reason (exit 2); a second judge on the same port says the
    port is taken."""
    url = f"http://127.0.0.1:{free_port()}"
    code, out = await run_tuimon("prom", url, "--serve", "0.0.0.0:9479")
    assert code == 2 and "token" in out, out
    code, out = await run_tuimon("prom", url, "--serve", "127.0.0.1:0", "--once")
    assert code == 2 and "--serve judges until stopped" in out, out
    code, out = await run_tuimon("prom", url, "--once", "--serve-insecure")
    assert code == 2 and "--serve-insecure: options of --serve" in out, out
    async with judging(url) as (proc, metrics):
        port = metrics.split(":")[2].split("/")[0]
        code, out = await run_tuimon("prom", url, "--serve", f"127.0.0.1:{port}")
        assert code == 2 and port in out, out
        assert proc.returncode is None
        # Prometheus never answered: said once, no node invented.
        families = await until(
            metrics, lambda f: any(x["kind"] == "source_lost" for x in findings(f)),
            "Prometheus unreachable said", timeout=30)
        assert [f["kind"] for f in findings(families)] == ["source_lost"]
