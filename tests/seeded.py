"""A seeded simulated cluster read at fixed times: the same model state on every run.

The real agents read the simulator's NVML and files through the real collectors; only
the clocks are fixed, so snapshots and app tests see exactly the same values each time.
"""

from __future__ import annotations

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
