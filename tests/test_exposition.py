"""`/metrics` text written in one pass is what prometheus_client's `generate_latest`
writes, byte for byte: on a full node's agent and on the values that need escaping."""

from __future__ import annotations

import math
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.registry import Collector

from agent.metrics import make_registry
from agent.sim.fake_nvml import FakeGpu, FakeNvml
from tests.conftest import make_agent
from tests.trees import HW, diskstats_line, ib_port, llite_stats, nic, write
from tuimon_core.serving.exposition import render


class Fixed(Collector):
    def __init__(self, *families: object) -> None:
        self.families = families

    def collect(self):  # type: ignore[no-untyped-def]
        return iter(self.families)


def _registry(*families: object) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed(*families))
    return registry


async def test_a_full_nodes_scrape_reads_as_generate_latest_writes_it(proc_root: Path) -> None:
    for p in range(2):
        ib_port(proc_root, f"mlx5_{p}", hw=HW, counters={"port_xmit_data": 2**40 + p})
    nic(proc_root, "eth0", rx_bytes=10**9)
    (proc_root / "scratch").mkdir()
    write(proc_root / "proc/self/mounts", "10.0.0.1@o2ib:/scratch /scratch lustre rw 0 0\n")
    write(proc_root / "sys/kernel/debug/lustre/llite/scratch-ffff9a0c4d1e8000/stats",
          llite_stats(10**12, 10**6, 10**11, 10**5, opens=500, getattrs=900))
    write(proc_root / "proc/diskstats", diskstats_line(259, 0, "nvme0n1", reads=10,
                                                       rsect=800, writes=5, wsect=80, io_ms=3))
    nvml = FakeNvml([FakeGpu(i, clock_events=0x4, procs=[(100 + i, 2**30)]) for i in range(4)])
    # A name a viewer shows as it is, and /metrics must quote: a quote and a backslash.
    agent = make_agent(proc_root, nvml, node_name='gpu"7\\a')
    await agent.start(sampling=False)
    try:
        for _ in range(3):
            await agent.sample_once()
        registry = make_registry(agent)
        text = render(registry)
        assert text == generate_latest(registry)
        assert b'node="gpu\\"7\\\\a"' in text and text.count(b"\n") > 300
    finally:
        await agent.stop()


def test_escapes_odd_values_and_empty_label_sets_as_generate_latest() -> None:
    counter = CounterMetricFamily("tuimon_odd", 'help with \\ and\na newline', labels=["v"])
    for value in ('quote " here', "back \\ slash", "new\nline", "", "ünïcode"):
        counter.add_metric([value], 3)
    gauge = GaugeMetricFamily("tuimon_values", "numbers as Go prints them")
    gauge.add_metric([], 1e21)
    plain = GaugeMetricFamily("tuimon_specials", "nan and infinities", labels=["k"])
    for k, v in (("nan", math.nan), ("inf", math.inf), ("ninf", -math.inf), ("tiny", 1e-9),
                 ("int", 7), ("neg", -0.5)):
        plain.add_metric([k], v)
    registry = _registry(counter, gauge, plain)
    assert render(registry) == generate_latest(registry)


def test_a_family_of_another_kind_is_left_to_generate_latest() -> None:
    info = InfoMetricFamily("tuimon_build", "build", value={"version": "1"})
    hist = HistogramMetricFamily("tuimon_wait", "waits", buckets=[("1", 2), ("+Inf", 3)],
                                 sum_value=4)
    stamped = GaugeMetricFamily("tuimon_stamped", "with a timestamp")
    stamped.add_metric([], 1, timestamp=1700000000.5)
    for families in ((info,), (hist,), (stamped,)):
        registry = _registry(GaugeMetricFamily("tuimon_x", "x", value=1), *families)
        assert render(registry) == generate_latest(registry)
