"""Faults: agents and a relay stopped (SIGSTOP) and killed (-9) mid-stream, then back;
the wall clock jumping under an agent and a viewer."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agent.files import FileTree
from agent.node import AgentConfig, NodeAgent
from agent.sim.cluster import SimCluster
from agent.sim.fake_nvml import FakeNvml
from tests.conftest import write_proc
from tuimon.model.cluster import ClusterState
from tuimon.model.efficiency import EfficiencyView
from tuimon.sources.agent_stream import StreamOptions, watching
from tuimon_core.protocol import Sample

ROOT = Path(__file__).resolve().parent.parent
FAST = StreamOptions(min_backoff=0.2, max_backoff=1.0)


async def until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.1)


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent", *args, "--log-level", "warning", cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        await proc.wait()


def _all(cluster: ClusterState, *states: str) -> bool:
    return bool(cluster.nodes) and all(n.status in states for n in cluster.nodes.values())


async def test_agents_stopped_and_killed_go_stale_and_come_back(
        unused_tcp_port_factory) -> None:
    port = unused_tcp_port_factory()
    sim_args = ("sim", "--nodes", "2", "--gpus", "1", "--base-port", str(port),
                "--interval", "0.5", "--scenario", "healthy")
    targets = [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]
    proc = await _spawn(*sim_args)
    cluster = ClusterState()
    try:
        async with watching(targets, cluster, FAST):
            await until(lambda: _all(cluster, "up"), "both up")
            proc.send_signal(signal.SIGSTOP)  # hung, sockets open: only silence tells
            await until(lambda: _all(cluster, "stale", "down"), "stale while stopped")
            assert all("no frame for" in (n.reason or "") for n in cluster.nodes.values())
            proc.send_signal(signal.SIGCONT)
            await until(lambda: _all(cluster, "up"), "back after SIGCONT")
            proc.kill()
            await proc.wait()
            await until(lambda: _all(cluster, "stale", "down"), "stale after kill -9")
            await until(lambda: all("cannot connect" in (n.reason or "")
                                    for n in cluster.nodes.values()), "reason given")
            proc = await _spawn(*sim_args)
            await until(lambda: _all(cluster, "up"), "back after restart")
            assert any(e.kind == "node_back" for e in cluster.events)
    finally:
        await _stop(proc)


async def test_a_viewer_bug_on_one_node_restarts_that_stream_only(unused_tcp_port_factory
                                                                  ) -> None:
    # Past every check, something in the view raises (a bug): that node's stream is
    # started again, it says why, and the other node's stream never notices.
    class Flaky(ClusterState):
        broke = False

        def apply_sample(self, target: str, sample: Sample) -> None:
            if target == sim.targets[0] and sample.seq == 3 and not self.broke:
                self.broke = True
                raise KeyError("a bug in the view")
            super().apply_sample(target, sample)

    sim = SimCluster(nodes=2, gpus=1, base_port=unused_tcp_port_factory(), interval=0.2,
                     scenario="healthy")
    cluster = Flaky()
    async with sim, watching(sim.targets, cluster, FAST) as streams:
        await until(lambda: cluster.broke, "the bug hit")
        broken, other = (cluster.nodes[t] for t in sim.targets)
        await until(lambda: broken.status == "up" and broken.sample.seq > 3,
                    "the node back")
        (lost,) = [e for e in cluster.events if e.kind == "node_lost"]
        assert "internal error: KeyError: 'a bug in the view'" in lost.message, lost
        assert streams[sim.targets[0]].attempts == 2
        assert streams[sim.targets[1]].attempts == 1 and other.status == "up"


async def test_relay_stopped_and_killed_marks_its_nodes_and_recovers(
        unused_tcp_port_factory, tmp_path: Path) -> None:
    sim = SimCluster(nodes=3, gpus=1, base_port=unused_tcp_port_factory(), interval=0.5,
                     scenario="healthy")
    relay_port = unused_tcp_port_factory()
    relay_args = ("relay", *sim.targets, "--listen", f"127.0.0.1:{relay_port}",
                  "--ledger", str(tmp_path / "ledger.db"), "--interval", "0.2")
    async with sim:
        relay = await _spawn(*relay_args)
        cluster = ClusterState()
        try:
            async with watching([], cluster, FAST, relays=[f"127.0.0.1:{relay_port}"]):
                await until(lambda: len(cluster.nodes) == 3 and _all(cluster, "up"),
                            "three nodes through the relay")
                relay.send_signal(signal.SIGSTOP)
                # The relay's fault, one: its nodes unknown, not lost, and why.
                await until(lambda: _all(cluster, "unknown"), "unknown, relay stopped")
                (reason, _, names) = cluster.lost_relays[f"127.0.0.1:{relay_port}"]
                assert reason.startswith("no frame") and len(names) == 3, reason
                assert all(f"relay 127.0.0.1:{relay_port} unreachable" in (n.reason or "")
                           for n in cluster.nodes.values())
                relay.send_signal(signal.SIGCONT)
                await until(lambda: _all(cluster, "up"), "back after SIGCONT")
                assert not cluster.lost_relays
                relay.kill()
                await relay.wait()
                await until(lambda: _all(cluster, "unknown"), "unknown, relay killed")
                killed = next(e.message for e in cluster.events if e.kind == "relay_lost")
                assert "closed by the relay" in killed, killed  # not "by the agent"
                relay = await _spawn(*relay_args)
                await until(lambda: _all(cluster, "up"), "back with a new relay")
                assert set(cluster.nodes) == set(sim.targets)  # the relay is not a node
        finally:
            await _stop(relay)


async def test_wall_clock_jumps(proc_root: Path) -> None:
    """Rates run on the monotonic clock, so a wall-clock step (NTP, a bad RTC) changes
    only the timestamps; the viewer neither drops the node nor counts negative time."""
    write_proc(proc_root)
    mono = [1000.0]
    wall = [1_800_000_000.0]
    agent = NodeAgent(AgentConfig(node_name="jumpy", interval=1.0, root=str(proc_root),
                                  watch_xid=False),
                      files=FileTree(proc_root), nvml_loader=lambda: FakeNvml(2),
                      monotonic=lambda: mono[0], wall=lambda: wall[0])
    await agent.start(sampling=False)
    cluster = ClusterState()
    eff = EfficiencyView(wall=lambda: wall[0])
    try:
        samples: list[Sample] = []
        for i, jump in enumerate((0.0, 0.0, -3600.0, 0.0, +7200.0, 0.0)):
            mono[0] += 1.0
            wall[0] += 1.0 + jump
            # Half of two CPUs busy each second (100 ticks a second each).
            busy, idle = 100 * (i + 1), 100 * (i + 1)
            (proc_root / "proc/stat").write_text(
                f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0\ncpu1 0 0 0 0\n")
            sample = await agent.sample_once()
            samples.append(sample)
            cluster.apply_hello("jumpy:9477", agent.hello)
            cluster.apply_sample("jumpy:9477", sample)
            eff.update(cluster)
    finally:
        await agent.stop()
    assert [s.seq for s in samples] == sorted(s.seq for s in samples)
    assert samples[2].ts < samples[1].ts  # the jump is visible in ts, as it happened
    for s in samples[1:]:
        assert s.host is not None and s.host["cpu_util"] is not None
        assert s.host["cpu_util"] == 0.5
        assert all(g.get("nvlink_tx") is None or g["nvlink_tx"] >= 0 for g in s.gpus or [])
    assert cluster.nodes["jumpy:9477"].status == "up"
