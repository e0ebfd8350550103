"""A seeded simulated cluster read at fixed times: the same model state on every run.

The real agents read the simulator's NVML and files through the real collectors; only
the clocks are fixed, so snapshots and app tests see exactly the same values each time.
"""

from __future__ import annotations

from typing import Any

from agent.sim.cluster import SimCluster
from tuimon.model.cluster import ClusterState


class FixedClock:
    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


async def seeded_cluster(nodes: int = 16, gpus: int = 8, seed: int = 7,
                         samples: int = 3) -> tuple[ClusterState, SimCluster]:
    mono = FixedClock(1_000.0)
    wall = FixedClock(1_796_000_000.0)
    sim = SimCluster(nodes=nodes, gpus=gpus, seed=seed, base_port=1, clock=mono, wall=wall)
    cluster = ClusterState(f"seeded {nodes} nodes", clock=mono)
    for m in sim.members:
        m.agent.config.watch_xid = False
        await m.agent.start(sampling=False)
    for _ in range(samples):
        mono.now += 1.0
        wall.now += 1.0
        for m in sim.members:
            await m.agent.sample_once()
    for m in sim.members:
        assert m.agent.hello is not None and m.agent.latest is not None
        cluster.apply_hello(m.target, m.agent.hello)
        cluster.apply_sample(m.target, m.agent.latest)
        await m.agent.stop()
    return cluster, sim


async def run_scenario(name: str, *, nodes: int = 32, gpus: int = 8, fault_at: float = 30.0,
                       seconds: float = 90.0, step: float = 1.0, seed: int = 3,
                       provisioned: bool = True):
    """Run a scenario on fixed clocks through the real agents, model and diagnosis.

    Yields (seconds since onset, findings, sim) once per step. `provisioned`: the shared
    file system's provisioned throughput is known (as `--provisioned` tells it).
    """
    from tuimon.model.diagnosis import Diagnosis
    from tuimon.model.efficiency import EfficiencyView
    from tuimon.model.storage import StorageView

    mono = FixedClock(1_000.0)
    wall = FixedClock(1_796_000_000.0)
    sim = SimCluster(nodes=nodes, gpus=gpus, seed=seed, base_port=1, clock=mono, wall=wall,
                     scenario=name, fault_at=fault_at)
    topology = {m.name: sim.leaf_of(m.index) for m in sim.members}
    cluster = ClusterState(name, clock=mono)
    eff = EfficiencyView(wall=wall)
    storage = StorageView({"/lustre/scratch": sim.lustre_provisioned} if provisioned else {})
    diagnosis = Diagnosis(topology, wall=wall)
    for m in sim.members:
        m.agent.config.watch_xid = False
        await m.agent.start(sampling=False)
    try:
        t = 0.0
        while t < seconds:
            t += step
            mono.now += step
            wall.now += step
            if t - step < fault_at <= t:  # the agents the scenario restarts at its onset
                for index in sim.plan.restart:
                    await sim.members[index].agent.stop()
                    agent = sim.renew_agent(index)
                    agent.config.watch_xid = False
                    await agent.start(sampling=False)
            sim.report_steps(step)
            for m in sim.members:
                sample = await m.agent.sample_once()
                if cluster.nodes.get(m.target) is None or \
                        cluster.nodes[m.target].hello is not m.agent.hello:
                    cluster.apply_hello(m.target, m.agent.hello)
                cluster.apply_sample(m.target, sample)
            storage.update(cluster)
            eff.update(cluster)
            yield t - fault_at, diagnosis.update(cluster, eff, storage), sim, eff
    finally:
        for m in sim.members:
            await m.agent.stop()


def judged(cluster: ClusterState, topology: dict[str, str] | None = None,
           storage: object = None, eff: object = None, seconds: float = 6.0):  # type: ignore[no-untyped-def]
    """A Diagnosis that has watched this state for `seconds` (findings hold a few
    seconds before they show), on a fixed clock; returns (diagnosis, findings)."""
    from tuimon.model.diagnosis import Diagnosis
    from tuimon.model.efficiency import EfficiencyView
    from tuimon.model.storage import StorageView

    clock = FixedClock(1_796_000_000.0)
    diagnosis = Diagnosis(topology, wall=clock)
    storage = storage if storage is not None else StorageView()
    eff = eff if eff is not None else EfficiencyView()
    findings = []
    for _ in range(int(seconds) + 1):
        findings = diagnosis.update(cluster, eff, storage)  # type: ignore[arg-type]
        clock.now += 1.0
    return diagnosis, findings


async def run_relay_scenario(name: str, ledger_path: Any, *, nodes: int = 32, gpus: int = 4,
                             fault_at: float = 30.0, seconds: float = 600.0,
                             step: float = 2.0, seed: int = 3):
    """A scenario's real agents, on fixed clocks, under a relay's fan-out with its
    ledger and its judgement (topology given), as the relay's housekeeping runs them;
    yields (seconds since onset, the relay's findings, the fan-out, the ledger) a step."""
    from tuimon.model.judge_config import JudgeConfig
    from tuimon.relay.fanout import FanOut
    from tuimon.relay.judging import RelayJudge
    from tuimon.relay.ledger import Ledger
    from tuimon_core.protocol import decode, encode

    mono = FixedClock(1_000.0)
    wall = FixedClock(1_796_000_000.0)
    sim = SimCluster(nodes=nodes, gpus=gpus, seed=seed, base_port=1, clock=mono, wall=wall,
                     scenario=name, fault_at=fault_at)
    topology = {m.name: sim.leaf_of(m.index) for m in sim.members}
    ledger = Ledger(ledger_path, clock=wall, monotonic=mono)
    fan = FanOut(on_steps=ledger.add, on_totals=ledger.add_totals, on_ended=ledger.ended,
                 clock=mono, wall=wall,
                 judge=RelayJudge(JudgeConfig(topology=topology), wall, mono))
    for m in sim.members:
        m.agent.config.watch_xid = False
        await m.agent.start(sampling=False)
    try:
        t = 0.0
        said: dict[str, object] = {}
        while t < seconds:
            t += step
            mono.now += step
            wall.now += step
            sim.report_steps(step)
            for m in sim.members:
                sample = await m.agent.sample_once()
                if said.get(m.target) is not m.agent.hello:
                    said[m.target] = m.agent.hello
                    data = encode(m.agent.hello)
                    fan.apply_message(m.target, decode(data), data)
                data = encode(sample)
                fan.apply_message(m.target, decode(data), data)
            fan.refresh()
            ledger.observe(fan.findings, wall.now, fan.jobs_touched)
            ledger.attribute(fan.job_findings)
            ledger.note_stops(wall.now, fan.stop_cause, fan.returned)
            yield t - fault_at, fan.findings, fan, ledger
    finally:
        for m in sim.members:
            await m.agent.stop()
        ledger.close()


def watched_by_app(targets: list[str], options: object):  # type: ignore[no-untyped-def]
    """The app's `sources`: the agents at `targets` watched for the life of the app."""
    import asyncio

    from tuimon.sources.agent_stream import watching

    def sources(state: object):  # type: ignore[no-untyped-def]
        async def run() -> None:
            async with watching(targets, state, options):  # type: ignore[arg-type]
                await asyncio.Event().wait()
        return [run()]
    return sources
