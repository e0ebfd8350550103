"""Efficiency from step telemetry: SLI windows, throughput, budget burn, stragglers."""

from __future__ import annotations

import pytest

from tuimon.model.cluster import ClusterState
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.slo import Slo
from tuimon_core.protocol import GpuInfo, Hello, Sample


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _feed(cluster: ClusterState, seq: int, slow_node: int | None = None,
          ts: float = 0.0) -> None:
    for n in range(4):
        ranks = []
        for g in range(2):
            compute = 0.9 * (1.2 if n == slow_node else 1.0)
            ranks.append({"rank": n * 2 + g, "steps": 1, "wall": 1.2, "compute": compute,
                          "samples": 10, "tokens": 0})
        sample = Sample(seq, ts, 1.0, gpus=[{"util": 0.9}, {"util": 0.7}],
                        extra={"steps": {"jobs": [{"id": "j", "world": 8, "ranks": ranks}],
                                         "received": seq, "rejected": 0}})
        cluster.apply_sample(f"n{n}:1", sample)


def _cluster() -> ClusterState:
    cluster = ClusterState()
    for n in range(4):
        cluster.apply_hello(f"n{n}:1", Hello(f"node{n}", "0", None, 1.0, 0.0, gpus=[
            GpuInfo(i, None, None, None, None, None, None, None) for i in range(2)]))
    return cluster


def test_no_telemetry_gives_a_labelled_proxy() -> None:
    cluster = _cluster()
    for n in range(4):
        cluster.apply_sample(f"n{n}:1", Sample(1, 0.0, 1.0, gpus=[{"util": 0.9},
                                                                  {"util": 0.7}]))
    view = EfficiencyView()
    view.update(cluster)
    assert view.jobs == {} and view.proxy == pytest.approx(0.8)


def test_sli_throughput_budget_and_a_straggler() -> None:
    clock = Clock()
    cluster = _cluster()
    view = EfficiencyView(Slo(0.90, 720), baselines={"j": 5.0}, wall=clock)
    for seq in range(1, 41):
        _feed(cluster, seq, slow_node=2, ts=clock.now)
        view.update(cluster)
        clock.now += 1.0
    job = view.jobs["j"]
    clock.now -= 1.0  # the last update's time
    sli, throughput = job.window(60, clock.now)
    # 6 ranks at 0.9 s and 2 at 1.08 s of compute in 1.2 s steps.
    assert sli == pytest.approx((6 * 0.9 + 2 * 1.08) / (8 * 1.2))
    # 8 ranks x 10 samples a step of 1.2 s: by the steps' own clock, not the viewer's.
    assert throughput == pytest.approx(8 * 10 / 1.2)
    assert view.scaling_efficiency(job, throughput) == pytest.approx(8 * 10 / 1.2 / (8 * 5.0))
    burn = job.burn.burn_rates(clock.now)
    assert burn["5m"] == pytest.approx((1 - sli) / 0.1)
    assert job.burn.consumed_hours == pytest.approx(40 * 1.2 * (1 - sli) / 3600)
    assert [(s.node, s.rank, round(s.ratio, 2)) for s in job.stragglers] == [
        ("node2", 4, 1.2), ("node2", 5, 1.2)]


def test_a_repeated_sample_is_not_counted_twice() -> None:
    clock = Clock()
    cluster = _cluster()
    view = EfficiencyView(wall=clock)
    _feed(cluster, 1, ts=clock.now)
    view.update(cluster)
    view.update(cluster)  # the same samples still in the model a tick later
    assert len(view.jobs["j"].history) == 1


def test_mfu_from_flops_per_sample_and_the_gpus_peak() -> None:
    clock = Clock()
    cluster = _cluster()
    for n in range(4):
        node = cluster.nodes[f"n{n}:1"]
        node.hello.gpus = [GpuInfo(i, None, "NVIDIA H100 80GB HBM3", None, None, None, None,
                                   None) for i in range(2)]
    view = EfficiencyView(flops_per_sample={"j": 6e12}, wall=clock)
    for seq in range(1, 11):
        _feed(cluster, seq, ts=clock.now)
        view.update(cluster)
        clock.now += 1.0
    job = view.jobs["j"]
    _, throughput = job.window(60, view.now)
    assert throughput == pytest.approx(8 * 10 / 1.2)
    assert view.mfu(job, throughput) == pytest.approx(8 * 10 / 1.2 * 6e12 / (8 * 989e12))
    assert len(view.sli_series(job, 5)) == 5
