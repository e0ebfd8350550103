"""Heatmap levels, filters, sorting and topology: the app's logic without a screen."""

from __future__ import annotations

import pytest

from agent.sim.cluster import SimCluster
from tuimon.model.cluster import ClusterState
from tuimon.model.map_kinds import FABRIC_METRICS, FAILED, GPU_METRICS, NO_DATA, node_level
from tuimon.model.view_state import FilterError, ViewState, parse_topology_conf
from tuimon_core.protocol import GpuInfo

UTIL, MEM, TEMP, POWER, CLOCK, HEALTH = GPU_METRICS
PORT_UTIL, CONGESTION, ERRORS = FABRIC_METRICS


def test_gpu_levels_cover_the_scale_and_the_special_cases() -> None:
    assert UTIL.level({"util": 0.0}) == 0 and UTIL.level({"util": 1.0}) == 8
    assert UTIL.level({"util": 0.5}) == 4
    assert UTIL.level({"util": None}) == NO_DATA
    assert UTIL.level({"failed": "GPU is lost"}) == FAILED
    assert TEMP.level({"temp": 90.0}) == 8 and TEMP.level({"temp": 20.0}) == 0
    assert MEM.level({"mem_used": 40, "mem_total": 80}) == 4
    info = GpuInfo(0, None, None, None, None, None, 2e9, None)
    assert CLOCK.level({"sm_clock": 1e9}, info) == 4
    assert POWER.level({"power": 700.0, "power_limit": 700.0}) == 8


@pytest.mark.parametrize(("values", "level"), [
    ({"util": 0.9, "temp": 60.0, "clock_events": []}, 0),
    ({"util": 0.9, "clock_events": ["hw_thermal_slowdown"]}, 4),
    ({"util": 0.9, "clock_events": ["gpu_idle"]}, 0),  # idle is not trouble
    ({"util": 0.9, "ecc_uncorrected": 2}, 8),
    ({"util": 0.9, "last_xid": 79}, 8),
    ({"util": 0.9, "remap_pending": 1}, 4),
])
def test_health_levels(values: dict, level: int) -> None:
    assert HEALTH.level(values) == level


def test_fabric_levels() -> None:
    assert PORT_UTIL.level({"tx_util": 0.25, "rx_util": 0.5}) == 4
    assert CONGESTION.level({"xmit_wait_s": 50.0}) == 0
    assert CONGESTION.level({"xmit_wait_s": 1e6}) == 8
    assert ERRORS.level({"state": 1}) == 8  # link down
    assert ERRORS.level({"state": 4}) == 0
    assert 0 < ERRORS.level({"state": 4, "errors_inc": {"symbol_errors": 12}}) < 8
    assert ERRORS.level({"state": 4, "errors_inc": {"link_downed": 1}}) == 8


def test_folded_node_level_worst_for_health_mean_for_util() -> None:
    gpus = [{"util": 1.0, "temp": 40.0}, {"util": 0.0, "temp": 90.0}]
    assert node_level(UTIL, gpus, []) == 4
    assert node_level(TEMP, gpus, []) == 8
    assert node_level(UTIL, [*gpus, {"failed": "lost"}], []) == FAILED
    assert node_level(UTIL, [], []) == NO_DATA


def test_filter_text_and_regex() -> None:
    # Brackets are a host list first, as everywhere else in tuimon...
    view = ViewState(known_names=frozenset({"gpu011", "gpu012", "gpu021"}))
    view.set_filter("gpu0[12]")
    assert view._names == {"gpu012"}
    # ...and a regular expression when no node has one of the listed names.
    view.set_filter("gpu0[12]1")
    assert view._pattern is not None and view._pattern.search("gpu011")
    assert view._pattern.search("gpu021") and not view._pattern.search("gpu012")
    view.set_filter("gpu0")
    assert view._pattern is not None and view._pattern.search("gpu011")
    with pytest.raises(FilterError, match="bad filter"):
        view.set_filter("gpu[")
    view.set_filter("  ")
    assert view.filter_text == ""


def test_topology_conf_parse_matches_the_simulator() -> None:
    sim = SimCluster(nodes=20, gpus=1, base_port=30000, nodes_per_leaf=8)
    leaves = parse_topology_conf(sim.topology_conf())
    assert leaves["sim-node000"] == "leaf00" and leaves["sim-node019"] == "leaf02"
    text = ("# comment\nSwitchName=s1 Switches=l[1-2]\n"
            "SwitchName=l1 Nodes=gpu[001-003],login1\nSwitchName=l2 Nodes=gpu[004-005]\n")
    assert parse_topology_conf(text) == {"gpu001": "l1", "gpu002": "l1", "gpu003": "l1",
                                         "login1": "l1", "gpu004": "l2", "gpu005": "l2"}


async def test_sorting_the_fabric_map_by_congestion_puts_the_most_congested_first() -> None:
    """The fabric map sorts by its own metric over each node's ports (it sorted by name:
    every node had "no data" on a GPU fold of a fabric metric)."""
    from tests.seeded import seeded_cluster
    from tuimon.model.map_kinds import FABRIC_MAP

    cluster, _ = await seeded_cluster(6, gpus=1, samples=2)
    last = next(n for n in cluster.nodes.values() if n.name == "sim-node005")
    for port in last.sample.extra["fabric"]["ports"]:
        port["xmit_wait_s"] = 5e6  # starved of credits
    for node in cluster.nodes.values():
        if node is not last:
            for port in node.sample.extra["fabric"]["ports"]:
                port["xmit_wait_s"] = 50.0  # quiet
    for node in cluster.nodes.values():  # as an agent without overviews sends them
        del node.sample.extra["overview"], node.sample.extra["findings"]
        cluster.apply_sample(node.target, node.sample)
    congestion = next(m for m in FABRIC_METRICS if m.key == "congestion")
    view = ViewState(sort="metric")
    order = view.visible(cluster, congestion, FABRIC_MAP)
    assert order[0] is last
    view.reverse = True
    assert view.visible(cluster, congestion, FABRIC_MAP)[-1] is last


async def test_gpu_total_and_interval_follow_every_hello_and_node() -> None:
    from dataclasses import replace

    from tests.seeded import seeded_cluster

    seeded, _ = await seeded_cluster(nodes=2, gpus=4, samples=1)
    (first, second) = seeded.nodes.values()
    cluster = ClusterState()
    assert (cluster.gpu_total(), cluster.interval()) == (0, None)
    cluster.apply_hello("a:1", first.hello)
    assert (cluster.gpu_total(), cluster.interval()) == (4, first.hello.interval)
    cluster.apply_hello("b:1", replace(second.hello, gpus=second.hello.gpus[:2],
                                       interval=0.5))
    assert (cluster.gpu_total(), cluster.interval()) == (6, 0.5)
    cluster.apply_hello("b:1", replace(second.hello, interval=2.0))  # said hello again
    assert (cluster.gpu_total(), cluster.interval()) == (8, first.hello.interval)
    cluster.forget_target("b:1")
    assert cluster.gpu_total() == 4
