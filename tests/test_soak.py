"""Soak (opt-in: `pytest -m slow tests/test_soak.py`, about 6 minutes on 2 cores).

256 simulated nodes of 8 GPUs for 30 simulated minutes on fixed clocks, every piece on
its real code path in one process: the agents (real collectors over the simulator),
the relay's fan-out and SQLite ledger (frames as bytes, a viewer feed taking batches),
and the app's model (the viewer decoding those batches into ClusterState, efficiency,
storage, diagnosis). The agents sample every 5 simulated seconds so a 2-core machine
gets through it; the "mixed" scenario keeps events, stragglers, flapping links and
checkpoints coming.

After 5 minutes of warm-up the process's resident memory may grow by at most 5 % to
the end, and each structure that could grow with time stays bounded.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest

from agent.sim.cluster import SimCluster
from tests.seeded import FixedClock
from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import Diagnosis
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.storage import StorageView
from tuimon.relay.fanout import FanOut
from tuimon.relay.ledger import Ledger
from tuimon.relay.viewer_feed import ViewerFeed
from tuimon_core.protocol import MAX_BATCH_BYTES, Batch, decode, encode

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

NODES, STEP, WARMUP, DURATION = 256, 5.0, 300.0, 1800.0


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_256_nodes_for_30_simulated_minutes_hold_their_memory(tmp_path: Path) -> None:
    mono, wall = FixedClock(1_000.0), FixedClock(1_796_000_000.0)
    sim = SimCluster(nodes=NODES, gpus=8, seed=11, base_port=1, clock=mono, wall=wall,
                     scenario="mixed", interval=STEP)
    ledger = Ledger(tmp_path / "ledger.db", clock=wall)
    fanout = FanOut(on_steps=ledger.add, clock=mono)
    feed = ViewerFeed("soak viewer", STEP)
    fanout.attach(feed)
    cluster = ClusterState("soak", clock=mono)
    eff = EfficiencyView(wall=wall)
    storage = StorageView({"/lustre/scratch": sim.lustre_provisioned})
    diagnosis = Diagnosis({m.name: sim.leaf_of(m.index) for m in sim.members}, wall=wall)
    for m in sim.members:
        m.agent.config.watch_xid = False
        await m.agent.start(sampling=False)
    hellos: dict[str, object] = {}
    marks: dict[str, int] = {}
    started = time.monotonic()
    try:
        t = 0.0
        while t < DURATION:
            t += STEP
            mono.now += STEP
            wall.now += STEP
            sim.report_steps(STEP)
            for m in sim.members:
                sample = await m.agent.sample_once()
                if hellos.get(m.target) is not m.agent.hello:
                    hellos[m.target] = m.agent.hello
                    data = encode(m.agent.hello)
                    fanout.apply_message(m.target, decode(data, deep=False), data)
                data = encode(sample)
                fanout.apply_message(m.target, decode(data, deep=False), data)
            for batch_bytes in feed.take(wall.now, "soak", ledger.summary(wall.now), int(t)):
                batch = decode(batch_bytes, max_bytes=MAX_BATCH_BYTES)
                assert isinstance(batch, Batch)
                for source, frame in batch.frames:
                    cluster.apply_message(source, decode(frame), frame)
                if batch.budget:
                    cluster.apply_budget(batch.budget)
            if int(t) % 60 == 0:
                ledger.flush()
            storage.update(cluster)
            eff.update(cluster)
            diagnosis.update(cluster, eff, storage)
            cluster.refresh_ages()
            if t in (WARMUP, DURATION):
                gc.collect()
                marks[f"rss_{int(t)}"] = rss_kib()
    finally:
        for m in sim.members:
            await m.agent.stop()
        ledger.close()
    before, after = marks[f"rss_{int(WARMUP)}"], marks[f"rss_{int(DURATION)}"]
    growth = (after - before) / before
    print(f"\nsoak: {NODES} nodes, {DURATION / 60:.0f} simulated min in "
          f"{time.monotonic() - started:.0f} s; RSS {before / 1024:.1f} MiB after warm-up, "
          f"{after / 1024:.1f} MiB at the end ({100 * growth:+.2f} %)")
    assert growth <= 0.05, (before, after)
    # The structures that could grow with time are bounded.
    assert len(cluster.events) <= 2000
    assert len(fanout.sources) == NODES and not feed.samples and not feed.events
    assert all(len(j.history) <= 3600 / STEP + 1 for j in eff.jobs.values())
    assert eff.jobs and ledger.error is None
