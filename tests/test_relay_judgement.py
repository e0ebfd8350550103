"""The relay judges around the clock: simulated clusters with faults whose onset nobody
tells the test, a real relay judging them with the topology, and what a viewer, `tuimon
status` and `/metrics` read of that judgement at once, from the true onsets."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from agent.sim.cluster import SimCluster
from tests.conftest import run_tuimon
from tuimon.model.judge_config import JudgeConfig
from tuimon.relay import Relay, RelayConfig
from tuimon_core.findings import Finding


async def until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


def _relay(sims: list[SimCluster], **judge: object) -> Relay:
    topology = {m.name: sim.leaf_of(m.index) for sim in sims for m in sim.members}
    return Relay(RelayConfig(targets=[t for sim in sims for t in sim.targets],
                             listen="127.0.0.1:0", interval=0.2, upstream_backoff=(0.1, 0.5),
                             judge=JudgeConfig(topology=topology, **judge)))  # type: ignore[arg-type]


def _held(relay: Relay, kind: str, where: str = "") -> Finding | None:
    return next((f for f in relay.state.fanout.findings
                 if f.kind == kind and where in f.message), None)


async def test_status_through_a_judging_relay_names_the_leaf_and_its_onset_at_once(
        unused_tcp_port_factory) -> None:
    """The seed incident (a leaf loses spine capacity), its onset a few seconds in: the
    relay names the leaf; a one-shot `status --relay` started well after the onset says
    it on its first read, with the onset, in the time the read takes (no hold to wait
    out), and the relay's /metrics carries it for Alertmanager with the leaf by label."""
    sim = SimCluster(nodes=16, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="spine-imbalance", fault_at=3.0)
    leaf = sim.truth()["components"][0]
    async with sim, _relay([sim]) as relay:
        await until(lambda: _held(relay, "congestion", f"under {leaf}") is not None,
                    "the relay naming the leaf")
        onset = _held(relay, "congestion", f"under {leaf}").first_seen  # type: ignore[union-attr]
        await asyncio.sleep(4.0)  # the onset is well behind whoever asks now
        started = time.monotonic()
        code, out = await run_tuimon("status", "--relay", f"127.0.0.1:{relay.port}")
        took = time.monotonic() - started
        async with aiohttp.ClientSession() as http, \
                http.get(f"{relay.url}/metrics") as r:
            metrics = await r.text()
    line = next(x for x in out.splitlines() if f"under {leaf}" in x)
    assert line.startswith("warning") and code == 1, out
    when = time.strftime("%H:%M", time.localtime(onset))
    m = re.search(r"since (\d\d:\d\d) \((\d+) s\)", line)
    assert m and m.group(1) == when and int(m.group(2)) >= 4, line
    # Two samples of every node, then the judgement with them: no hold waited out.
    assert took < 10.0, took
    page = next(x for x in metrics.splitlines() if x.startswith("tuimon_finding{")
                and 'kind="congestion"' in x)
    assert f'leaf="{leaf}"' in page and 'severity="warning"' in page, page
    assert any(x.startswith("tuimon_finding_info{") and f"under {leaf}" in x
               for x in metrics.splitlines())


async def test_status_through_the_relay_names_stragglers_and_their_causes_at_once(
        unused_tcp_port_factory) -> None:
    """A thermal straggler and a GPU whose PCIe link trained at Gen3 x8, on two
    clusters (two jobs) under one relay: a straggler needs half a minute of ranks to
    judge, which the relay has had; `status --relay` names both, each with its cause, on
    its first read."""
    hot = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="thermal-straggler", fault_at=2.0, job_name="hot-job",
                     name_prefix="hot")
    slow = SimCluster(nodes=4, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                      scenario="pcie-downtrain", fault_at=2.0, job_name="slow-job",
                      name_prefix="slow")
    async with hot, slow, _relay([hot, slow]) as relay:
        await until(lambda: len([f for f in relay.state.fanout.findings
                                 if f.kind == "straggler"]) >= 2, "both stragglers",
                    timeout=90.0)
        code, out = await run_tuimon("status", "--relay", f"127.0.0.1:{relay.port}")
    for sim, cause in ((hot, "thermal"), (slow, "pcie downtrained")):
        where = sim.truth()["components"][0]  # `hot002 GPU 1`
        line = next((x for x in out.splitlines() if "computes" in x and where in x), "")
        assert f"likely: {cause}" in line and "since " in line, (where, out)
    assert code == 1, out


async def test_the_seed_incident_through_a_relay_killed_midway(
        tmp_path: Path, unused_tcp_port_factory) -> None:
    """The seed incident under a real relay process judging with a Slurm topology.conf,
    killed with -9 while it holds and started again: `status --since` lists the incident,
    one episode from its first onset, as still holding; over the whole run the ledger
    puts the job's comm waiting down to the leaf's congestion, not to a node's port."""
    import os
    import signal
    import sys

    from tuimon.relay.ledger import Ledger

    sim = SimCluster(nodes=16, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="spine-imbalance", fault_at=3.0)
    leaf = sim.truth()["components"][0]
    conf = tmp_path / "topology.conf"
    conf.write_text(sim.topology_conf())
    path = tmp_path / "ledger.db"
    port = unused_tcp_port_factory()
    root = Path(__file__).resolve().parent.parent

    async def start() -> asyncio.subprocess.Process:
        with open(tmp_path / "relay.err", "ab") as err:
            return await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tuimon.cli", "relay", *sim.targets, "--listen",
                f"127.0.0.1:{port}", "--ledger", str(path), "--flush-every", "0.5",
                "--interval", "0.2", "--topology", str(conf), "--log-level", "warning",
                cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                stdout=asyncio.subprocess.DEVNULL, stderr=err)

    async def incidents() -> str:
        return (await run_tuimon("status", "--relay", f"127.0.0.1:{port}", "--since",
                                 "1h"))[1]

    async with sim:
        relay = await start()
        try:
            deadline = time.monotonic() + 60
            listed = ""
            while f"congestion {leaf}" not in listed:
                assert time.monotonic() < deadline, listed
                await asyncio.sleep(1.0)
                listed = await incidents()
            first = next(x for x in listed.splitlines() if f"congestion {leaf}" in x)
            await asyncio.sleep(2.0)  # a flush or more after it began
            relay.send_signal(signal.SIGKILL)
            await relay.wait()
            await asyncio.sleep(2.0)
            relay = await start()
            # The restarted relay reads its ledger and judges again: the incident holds
            # once its windows have filled (a few seconds; longer on a busy machine), as
            # one incident, not a second.
            deadline = time.monotonic() + 30
            listed = ""
            while not any("holds" in x for x in listed.splitlines()
                          if f"congestion {leaf}" in x) and time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                listed = await incidents()
        finally:
            if relay.returncode is None:
                relay.terminate()
                await relay.wait()
    lines = [x for x in listed.splitlines() if f"congestion {leaf}" in x]
    assert len(lines) == 1 and "holds" in lines[0], listed
    assert lines[0].split(";")[1].split(" (")[0] == first.split(";")[1].split(" (")[0], (
        first, lines[0])  # the same onset: one episode, gone on with after the kill
    with Ledger(path) as ledger:
        comm = ledger.summary()[sim.job.name]["causes_h"]["comm"]
    # Before the fault (and while it was held before it showed) the usual waiting in the
    # collectives had no cause: `no finding`. Since, the leaf; never a node's port.
    assert comm.get(f"congestion {leaf}", 0) > 0, comm
    assert set(comm) <= {f"congestion {leaf}", "no finding"}, comm


async def test_the_seed_incident_pages_alertmanager_with_the_leaf_named(
        tmp_path: Path, unused_tcp_port_factory) -> None:
    """Real Prometheus scraping a judging relay and evaluating `tuimon rules`, real
    Alertmanager delivering to a webhook: the leaf whose spine capacity goes (an onset the
    test tells nobody) arrives as a page naming the leaf, with the finding's text, within
    two minutes of the onset. Nothing pages before it."""
    from aiohttp import web

    from tests.peers import (
        PROMETHEUS,
        require_alertmanager,
        running_alertmanager,
        running_prometheus,
    )
    from tuimon.model.prom_rules import FINDING_ALERT, rules_yaml
    from tuimon.model.slo import Slo

    require_alertmanager()
    if PROMETHEUS is None:
        import os

        import pytest
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus not found: CI installs it")
        pytest.skip("prometheus not installed (apt-get install prometheus); CI installs it")
    pages: list[tuple[float, dict]] = []

    async def hook(request: web.Request) -> web.Response:
        body = await request.json()
        for alert in body.get("alerts", []):
            if alert.get("status") == "firing":
                pages.append((time.time(), alert))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    hook_port = unused_tcp_port_factory()
    await web.TCPSite(runner, "127.0.0.1", hook_port).start()
    sim = SimCluster(nodes=16, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="spine-imbalance", fault_at=8.0)
    leaf = sim.truth()["components"][0]
    onset = sim.truth()["onset"]
    try:
        async with sim, _relay([sim]) as relay:
            with running_alertmanager(tmp_path, f"http://127.0.0.1:{hook_port}/hook") as am, \
                    running_prometheus(tmp_path, f"  - job_name: relay\n    static_configs:\n"
                                                 f"      - targets: ['127.0.0.1:{relay.port}']\n",
                                       every=1.0, rules=rules_yaml(Slo(0.9, 720)),
                                       alertmanager=am):
                await until(lambda: any(a["labels"].get("leaf") == leaf for _, a in pages),
                            "a page naming the leaf", timeout=180.0)
    finally:
        await runner.cleanup()
    when, page = next((t, a) for t, a in pages if a["labels"].get("leaf") == leaf)
    assert page["labels"]["alertname"] == FINDING_ALERT
    assert page["labels"]["kind"] == "congestion", page
    assert f"under {leaf}" in page["annotations"]["description"], page
    assert when - onset <= 120, when - onset
    early = [a for t, a in pages if t < onset and a["labels"].get("severity") != "info"]
    assert early == [], early


async def test_ten_healthy_minutes_under_a_judging_relay_page_nothing(
        tmp_path: Path) -> None:
    """32 healthy simulated nodes for ten minutes under a relay's judgement (fixed clocks,
    real agents): no warning or critical finding at any moment, no incident in its
    ledger, nothing for `tuimon_finding` to page on."""
    from tests.seeded import run_relay_scenario

    graver: list[Finding] = []
    incidents: list[object] = []
    async for _, findings, _, ledger in run_relay_scenario(
            "healthy", tmp_path / "l.db", seconds=600.0):
        graver += [f for f in findings if f.severity != "info"]
        incidents = ledger.incidents(0.0, 4e9)
    assert graver == [], graver[:5]
    assert incidents == []


async def test_the_relays_incident_of_the_seed_fault_costs_what_the_job_lost_to_it(
        tmp_path: Path) -> None:
    """The same harness with the seed fault: the leaf's congestion is an incident from
    the onset, that touched the job, and the budget the ledger put down to it is the
    job's comm waiting since (not a node's port's); the job's efficiency drop is one
    too, naming the leaf as its likely cause; no node's port is one."""
    from tests.seeded import run_relay_scenario

    incidents: list = []
    causes: dict = {}
    leaf = None
    async for since, findings, _, ledger in run_relay_scenario(
            "spine-imbalance", tmp_path / "l.db", seconds=180.0, fault_at=30.0):
        incidents = [e for e in ledger.incidents(0.0, 4e9) if e.severity != "info"]
        leaf = leaf or next((f.leaf for f in findings if f.kind == "congestion"), None)
        if since > 0:
            ledger.flush()
            causes = ledger.summary()["llm-pretrain"].get("causes_h", {})
    assert leaf is not None
    [incident] = [e for e in incidents if e.kind == "congestion"]
    assert (incident.where, incident.jobs) == (leaf, ["llm-pretrain"])
    assert incident.onset == 1_796_000_000.0 + 30.0  # the fault's own second
    [drop] = [e for e in incidents if e.kind == "efficiency_drop"]
    assert drop.message.startswith(f"likely congestion {leaf} -> ")
    assert incident.lost_s / 3600 == pytest.approx(causes["comm"][f"congestion {leaf}"],
                                                   rel=0.01)


async def test_a_relay_gone_leaves_its_findings_unknown_not_cleared(
        unused_tcp_port_factory) -> None:
    """A viewer watching the seed incident through a judging relay; the relay stops. The
    leaf's congestion is not said cleared (nobody knows it cleared): it stays, saying
    since when there is no data, beside the relay's own loss; and it reads as before once
    the relay is back."""
    from tuimon.model.cluster import ClusterState
    from tuimon.sources.agent_stream import StreamOptions, watching

    sim = SimCluster(nodes=16, gpus=2, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="spine-imbalance", fault_at=3.0)
    leaf = sim.truth()["components"][0]
    relay_port = unused_tcp_port_factory()
    topology = {m.name: sim.leaf_of(m.index) for m in sim.members}

    def relay() -> Relay:
        return Relay(RelayConfig(targets=sim.targets, listen=f"127.0.0.1:{relay_port}",
                                 interval=0.2, judge=JudgeConfig(topology=topology)))

    cluster = ClusterState()
    judge = JudgeConfig().judgement(cluster)  # the viewer's own: no topology of its own
    options = StreamOptions(min_backoff=0.2, max_backoff=1.0)

    def congestion() -> Finding | None:
        judge.update()
        return next((f for f in judge.diagnosis.findings
                     if f.kind == "congestion" and f.leaf == leaf), None)

    async with sim:
        first = relay()
        await first.start()
        try:
            async with watching([], cluster, options, relays=[f"127.0.0.1:{relay_port}"]):
                await until(lambda: congestion() is not None, "the leaf named")
                await first.stop()
                await until(lambda: bool(cluster.lost_relays), "the relay said lost")
                held = congestion()
                assert held is not None and "no data since" in held.message, held
                assert f"relay 127.0.0.1:{relay_port} unreachable" in held.message
                assert any(f.kind == "relay_lost" for f in judge.diagnosis.findings)
                assert not any(e.message.startswith("cleared: congestion")
                               for e in cluster.events), list(cluster.events)
                second = relay()
                await second.start()
                try:
                    await until(lambda: not cluster.lost_relays, "the relay back")
                    await until(lambda: "no data since" not in (
                        getattr(congestion(), "message", "") or "no data since"),
                        "the leaf named as before")
                finally:
                    await second.stop()
        finally:
            await first.stop()
