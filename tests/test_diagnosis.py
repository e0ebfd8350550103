"""Diagnosis rules on a seeded simulated cluster and on hand-made states."""

from __future__ import annotations

import re

import pytest

from tests.seeded import FixedClock, judged, seeded_cluster
from tuimon.model.cluster import ClusterState
from tuimon.model.diagnosis import REASON_CHARS, REJUDGE_S, Diagnosis, unreached
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.node_state import NodeState
from tuimon.model.storage import StorageView
from tuimon_core.hostlist import expand_hostlist, hostlist_within
from tuimon_core.protocol import GpuInfo, Hello, Sample
from tuimon_core.protocol.fields import MAX_FINDING_TEXT


async def test_the_seeded_clusters_trouble_is_found_and_located() -> None:
    cluster, sim = await seeded_cluster(16)
    topology = {m.name: sim.leaf_of(m.index) for m in sim.members}
    storage = StorageView({"/lustre/scratch": 1e9})  # a tiny provisioned throughput
    storage.update(cluster)
    _, findings = judged(cluster, topology, storage)
    kinds = {(f.kind, f.where) for f in findings}
    congested = {sim.leaf_of(m.index) for m in sim.members if m.model.trouble.io.congested}
    assert congested and {("congestion", leaf) for leaf in congested} <= kinds
    hot = [m for m in sim.members if m.model.trouble.hot_gpu is not None]
    assert ("thermal", f"{hot[0].name} GPU {hot[0].model.trouble.hot_gpu}") in kinds
    assert ("storage", "/lustre/scratch") in kinds
    assert findings == sorted(findings, key=lambda f: ({"critical": 0, "warning": 1}.get(
        f.severity, 2), -f.score, f.where))


def _node(cluster: ClusterState, target: str, name: str, ports: list[dict],
          gpus: list[dict] | None = None, seq: int = 1) -> None:
    cluster.apply_hello(target, Hello(name, "0", None, 1.0, 0.0, gpus=[
        GpuInfo(i, None, None, None, None, None, None, None) for i in range(len(gpus or []))]))
    cluster.apply_sample(target, Sample(seq, 0.0, 1.0, gpus=gpus or [],
                                        extra={"fabric": {"ports": ports}}))


def test_link_down_flapping_symbol_errors_gpu_faults_and_lost_nodes() -> None:
    cluster = ClusterState()
    _node(cluster, "a:1", "gpu001", [{"id": "mlx5_0:1", "state": 1, "state_name": "DOWN"}])
    _node(cluster, "b:1", "gpu002", [{"id": "mlx5_1:1", "state": 4,
                                      "errors_inc": {"link_downed": 2, "symbol_errors": 40}}],
          gpus=[{"util": 0.9, "last_xid": 79, "xid_total": 1},
                {"util": 0.9, "ecc_uncorrected": 3, "remap_failed": 1},
                {"failed": "GPU is lost"}])
    cluster.mark_stale("c:1", "cannot connect: Connection refused")
    clock = [1000.0]
    diag = Diagnosis(wall=lambda: clock[0])
    for _ in range(5):  # a link down is held a few seconds before it shows
        found = {(f.kind, f.where, f.severity) for f in diag.update(cluster, EfficiencyView(),
                                                                     StorageView())}
        clock[0] += 1.0
    assert ("link_down", "gpu001 mlx5_0:1", "critical") in found
    assert ("flapping", "gpu002 mlx5_1:1", "warning") in found
    assert ("symbol_errors", "gpu002 mlx5_1:1", "warning") in found
    assert ("xid", "gpu002 GPU 0", "critical") in found  # 79: fallen off the bus
    assert ("ecc", "gpu002 GPU 1", "critical") in found
    assert ("remap", "gpu002 GPU 1", "critical") in found
    assert ("gpu_failed", "gpu002 GPU 2", "critical") in found
    assert ("unreached", "c:1", "critical") in found  # never seen: not lost, unreached


def test_an_efficiency_drop_names_the_likely_causes_in_order() -> None:
    clock = [5000.0]
    eff = EfficiencyView(wall=lambda: clock[0])
    job = eff._job("train")
    job.world = 8
    for t in range(3600):
        sli = 0.9 if t < 3540 else 0.6  # the last minute far below the hour
        job.history.append((clock[0] - 3600 + t, 8.0, 8.0 * sli, 80))
    cluster = ClusterState()
    _node(cluster, "a:1", "gpu001", [{"id": "mlx5_0:1", "state": 4, "xmit_wait_s": 5e5}])
    _node(cluster, "b:1", "gpu009", [{"id": "mlx5_0:1", "state": 4, "xmit_wait_s": 100.0}])
    diag = Diagnosis({"gpu001": "leaf01", "gpu009": "leaf02"}, wall=lambda: clock[0])
    findings = diag.update(cluster, eff, StorageView())
    drop = next(f for f in findings if f.kind == "efficiency_drop")
    assert drop.severity == "critical" and "SLI 0.60, down from 0.9" in drop.message
    # The cause first: a line cut at 80 columns keeps it.
    assert drop.message.startswith("likely congestion leaf01 -> train SLI 0.60")


def test_multi_window_burn_alerts_become_findings() -> None:
    eff = EfficiencyView(wall=lambda: 10_000.0)
    eff.now = 10_000.0
    job = eff._job("train")
    for minute in range(120):  # two hours at SLI 0.05: burning 9.5x
        job.burn.add(10_000.0 - 7200 + 60 * minute, 60.0, 3.0)
    findings = Diagnosis().update(ClusterState(), eff, StorageView())
    burn = [f for f in findings if f.kind.startswith("burn_")]
    assert [(f.kind, f.severity, f.where) for f in burn] == [("burn_page", "critical", "train")]
    assert "9.5x" in burn[0].message


def test_an_efficiency_drop_stays_while_the_sli_stays_down() -> None:
    """The 1 h baseline absorbs a fault that lasts; the drop must not go with it."""
    clock = [100_000.0]
    eff = EfficiencyView(wall=lambda: clock[0])
    job = eff._job("train")
    job.world = 8

    def minute(sli: float) -> None:
        for _ in range(60):
            clock[0] += 1.0
            job.history.append((clock[0], 8.0, 8.0 * sli, 80))
            eff.now = clock[0]
    diag = Diagnosis(wall=lambda: clock[0])
    for _ in range(60):
        minute(0.92)
    seen = []
    for _m in range(120):  # two hours at 0.67: the hour's level falls to 0.67 too
        minute(0.67)
        seen.append(any(f.kind == "efficiency_drop" for f in
                        diag.update(ClusterState(), eff, StorageView())))
    assert all(seen), seen.index(False)
    for _ in range(3):  # recovered: the drop clears
        minute(0.92)
    assert not any(f.kind == "efficiency_drop" for f in
                   diag.update(ClusterState(), eff, StorageView()))


def test_a_port_is_congested_exactly_when_far_above_its_nodes_other_ports() -> None:
    """The congestion rule names the ports at or above CONGESTED_WAIT and OUTLIER_FACTOR
    times the median of the node's other ports, whatever the waits (ties, zeros, a busy
    fabric with every port alike, which it passes over without judging each port)."""
    import random
    import statistics

    from tuimon_core.node_rules import CONGESTED_WAIT, OUTLIER_FACTOR, NodeRules

    rng = random.Random(7)
    scales = [0.0, 1.0, 300.0, CONGESTED_WAIT, 2e5, 2e7]
    edge = OUTLIER_FACTOR * CONGESTED_WAIT  # at the bound and either side of it
    fixed = [[edge, CONGESTED_WAIT, CONGESTED_WAIT, CONGESTED_WAIT],
             [edge - 1, CONGESTED_WAIT, CONGESTED_WAIT, CONGESTED_WAIT],
             [edge, edge, CONGESTED_WAIT, CONGESTED_WAIT, CONGESTED_WAIT],
             [edge, 0.0, CONGESTED_WAIT], [CONGESTED_WAIT, 0.0, 0.0]]
    for case in range(3000):
        waits = fixed[case] if case < len(fixed) else [
            rng.choice(scales) * rng.choice([1, 1, 1, rng.uniform(0.5, 30)])
            for _ in range(rng.randint(3, 9))]
        ports = [{"id": f"mlx5_{i}:1", "xmit_wait_s": w} for i, w in enumerate(waits)]
        named = {f.port for f in NodeRules("n")._congestion(ports)}
        expected = {p["id"] for i, p in enumerate(ports)
                    if waits[i] >= CONGESTED_WAIT and waits[i] >= OUTLIER_FACTOR * max(
                        statistics.median(waits[:i] + waits[i + 1:]), 1.0)}
        assert named == expected, waits


def test_two_ports_far_above_their_node_are_named_at_once_by_a_new_viewer() -> None:
    """Two of a node's eight HCA ports at 20 M xmit_wait/s, the others quiet: the node
    judges it alone and sends how long it has held, so a viewer that connects now (a
    one-shot status) names both ports in its first judgement, as one that watched does,
    and its cluster rule does not name them again."""
    from agent.findings import NodeFindings
    from tuimon_core.findings_family import findings_from_wire, findings_to_wire
    from tuimon_core.node_rules import NodeRules

    ports = [{"id": f"mlx5_{i}:1", "state": 4, "xmit_wait_s": 2e7 if i in (2, 5) else 300.0}
             for i in range(8)]
    sample = Sample(1, 0.0, 1.0, gpus=[], extra={"fabric": {"ports": ports}})
    rules = NodeRules("gpu007")
    rules.observe(None, sample, 0.0)
    named = {f.port for f in rules.conditions(0.0) if f.kind == "congestion"}
    assert named == {"mlx5_2:1", "mlx5_5:1"}
    # The agent: ten seconds of it.
    clock = [0.0]
    node = NodeFindings("gpu007", lambda: clock[0])
    for seq in range(1, 11):
        clock[0] += 1.0
        sent = findings_to_wire(node.observe(None, Sample(seq, 0.0, 1.0, gpus=[],
                                                          extra={"fabric": {"ports": ports}})))
    assert all(row["held"] >= 9 for row in sent if row["kind"] == "congestion")
    # A viewer that connects now.
    cluster = ClusterState()
    _node(cluster, "a:1", "gpu007", ports)
    cluster.nodes["a:1"].conditions = sent
    _node(cluster, "b:1", "gpu008", [{**p, "xmit_wait_s": 300.0} for p in ports])
    findings = Diagnosis(wall=lambda: 5000.0).update(cluster, EfficiencyView(), StorageView())
    congestion = [f for f in findings if f.kind == "congestion"]
    assert sorted(f.where for f in congestion) == ["gpu007 mlx5_2:1", "gpu007 mlx5_5:1"]
    assert findings_from_wire(sent, "gpu007")[0].held_s >= 9


def test_a_whole_node_waiting_is_the_cluster_rules_to_name() -> None:
    """Every port of one node waits: no port stands out on the node, so the node names
    none; the cluster rule, comparing nodes, names the node (after its hold)."""
    from tuimon_core.node_rules import NodeRules

    hot = [{"id": f"mlx5_{i}:1", "state": 4, "xmit_wait_s": 2e7} for i in range(8)]
    rules = NodeRules("gpu007")
    rules.observe(None, Sample(1, 0.0, 1.0, gpus=[], extra={"fabric": {"ports": hot}}), 0.0)
    assert not [f for f in rules.conditions(0.0) if f.kind == "congestion"]
    cluster = ClusterState()
    _node(cluster, "a:1", "gpu007", hot)
    for i in range(1, 8):
        _node(cluster, f"n{i}:1", f"gpu00{i}" if i != 7 else "gpu010",
              [{**p, "xmit_wait_s": 300.0} for p in hot])
    clock = [1000.0]
    diag = Diagnosis(wall=lambda: clock[0])
    for _ in range(7):
        found = diag.update(cluster, EfficiencyView(), StorageView())
        clock[0] += 1.0
    (congestion,) = [f for f in found if f.kind == "congestion"]
    assert congestion.node == "gpu007" and "mlx5_0:1" in congestion.message


def test_a_finding_raised_and_cleared_is_an_event_and_the_node_screen_shows_its_window(
        ) -> None:
    """A port that went down twice in ten minutes: the events say so when the finding is
    raised and when it clears, on the judgement's clock (not only the diagnosis pane)."""
    from tuimon.model.judgement import Judgement

    cluster = ClusterState()
    flapping = [{"id": "mlx5_1:1", "state": 4, "errors_inc": {"link_downed": 4,
                                                             "symbol_errors": 873}}]
    _node(cluster, "b:1", "gpu002", flapping)
    clock = [10_000.0]
    judge = Judgement(cluster, StorageView(), EfficiencyView(wall=lambda: clock[0]),
                      Diagnosis(wall=lambda: clock[0]))
    judge.update()
    raised = [(e.kind, e.severity, e.node, e.ts) for e in cluster.events]
    assert ("flapping", "warning", "gpu002", 10_000.0) in raised, raised
    assert any(e.kind == "symbol_errors" and "+873" in e.message for e in cluster.events)
    before = len(cluster.events)
    judge.update()
    assert len(cluster.events) == before  # held: no new event each second
    clock[0] += 700.0  # past the ten-minute window and the hysteresis
    _node(cluster, "b:1", "gpu002", [{"id": "mlx5_1:1", "state": 4}], seq=2)
    for _ in range(3):
        judge.update()
        clock[0] += 100.0
    cleared = [e for e in cluster.events if e.message.startswith("cleared:")]
    assert {e.kind for e in cleared} >= {"flapping", "symbol_errors"}
    assert all(e.severity == "info" for e in cleared)


@pytest.mark.parametrize("every", [5.0, 3600.0])
def test_a_nodes_window_ends_without_a_new_sample_and_a_new_sample_is_judged_at_once(
        every: float) -> None:
    """The viewer judges a node that does not judge itself when its sample comes and
    again once per its interval, not every second: a flap ends when its window does
    even if the node sends nothing new (a Prometheus source every 5 s, an agent gone
    quiet; at most REJUDGE_S late, whatever its interval), and a fault in a new sample
    shows the same second."""
    cluster = ClusterState()
    hello = Hello("gpu002", "0", None, every, 0.0, gpus=[])
    cluster.apply_hello("b:1", hello)
    cluster.apply_sample("b:1", Sample(1, 0.0, every, gpus=[], extra={"fabric": {"ports": [
        {"id": "mlx5_1:1", "state": 4, "errors_inc": {"link_downed": 4}}]}}))
    clock = [10_000.0]
    diag = Diagnosis(wall=lambda: clock[0])

    def kinds() -> set[str]:
        return {f.kind for f in diag.update(cluster, EfficiencyView(), StorageView())}

    assert "flapping" in kinds()
    clock[0] += 600.0 - 2.0  # within the window: still flapping
    assert "flapping" in kinds()
    seen = []
    for _ in range(int(REJUDGE_S) + 62):  # past the window, then the hysteresis (60 s)
        clock[0] += 1.0
        seen.append("flapping" in kinds())
    assert seen[0] and not seen[-1], seen
    cluster.apply_sample("b:1", Sample(2, 0.0, every, gpus=[], extra={"fabric": {"ports": [
        {"id": "mlx5_1:1", "state": 1, "state_name": "DOWN"}]}}))
    clock[0] += 0.2  # a fraction of the interval after the last judgement
    for _ in range(5):  # a link down is held a few seconds before it shows
        found = kinds()
        clock[0] += 1.0
    assert "link_down" in found


def test_counts_in_a_finding_are_said_with_their_noun() -> None:
    """One pause-watchdog firing reads `fired 1 time`, three `fired 3 times`: a finding's
    words are read at 3 a.m. and a wrong plural reads as a wrong count."""
    from tuimon_core.node_rules import NodeRules

    rules = NodeRules("gpu007")
    said = []
    for seq, storms in ((1, 1), (2, 2)):
        ports = [{"id": "mlx5_1:1", "state": 4, "errors_inc": {"pause_storms": storms}}]
        rules.observe(None, Sample(seq, 0.0, 1.0, gpus=[], extra={"fabric": {"ports": ports}}),
                      float(seq))
        [storm] = [f for f in rules.conditions(float(seq)) if f.kind == "pfc_storm"]
        said.append(storm.message)
    assert "fired 1 time in 10 min" in said[0] and "fired 3 times in 10 min" in said[1], said


def test_a_leafs_congestion_names_its_nodes_as_a_host_list() -> None:
    """The nodes under a congested leaf are written as a host list one can paste into
    scontrol, pdsh or the map's filter (`gpu[001-003,005]`), not as "(4 nodes)"."""
    cluster = ClusterState()
    topology = {}
    for i in (1, 2, 3, 5, 9, 10, 11, 12):
        name = f"gpu{i:03d}"
        hot = i < 9
        _node(cluster, f"{name}:1", name,
              [{"id": "mlx5_0:1", "state": 4, "xmit_wait_s": 5e5 if hot else 100.0}])
        topology[name] = "leaf01" if hot else "leaf02"
    clock = [1000.0]
    diag = Diagnosis(topology, wall=lambda: clock[0])
    for _ in range(40):  # past the congestion's hold
        found = diag.update(cluster, EfficiencyView(), StorageView())
        clock[0] += 1.0
    [leaf] = [f for f in found if f.kind == "congestion" and f.leaf == "leaf01"]
    assert leaf.message.endswith("(gpu[001-003,005])"), leaf.message
    assert "vs 100/s elsewhere" in leaf.message, leaf.message


@pytest.mark.parametrize(("silent", "words"), [
    ({}, "(the only leaf in the topology)"),
    ({"gpu004": "leaf02"}, "(no other leaf reporting)"),  # its nodes not connected
], ids=["one leaf", "one reporting"])
def test_the_only_leaf_reporting_is_not_compared_with_an_elsewhere(
        silent: dict[str, str], words: str) -> None:
    """A topology of one leaf (a small cluster, a partial topology file), or one leaf
    whose nodes report: its congestion is named without a made-up "0/s elsewhere"."""
    cluster = ClusterState()
    for i in (1, 2, 3):
        _node(cluster, f"gpu{i:03d}:1", f"gpu{i:03d}",
              [{"id": "mlx5_0:1", "state": 4, "xmit_wait_s": 5e5}])
    clock = [1000.0]
    topology = {f"gpu{i:03d}": "leaf01" for i in (1, 2, 3)} | silent
    diag = Diagnosis(topology, wall=lambda: clock[0])
    for _ in range(40):
        found = diag.update(cluster, EfficiencyView(), StorageView())
        clock[0] += 1.0
    [leaf] = [f for f in found if f.kind == "congestion" and f.leaf == "leaf01"]
    assert "elsewhere" not in leaf.message, leaf.message
    assert words in leaf.message, leaf.message
    assert leaf.message.endswith("(gpu[001-003])"), leaf.message


def test_nodes_unreached_for_different_reasons_are_each_said_with_their_reason() -> None:
    """One host refusing, others timing out, one with no answer yet: the on-call reads
    which is which in the finding (status, the app, the relay all show this text), the
    most common reasons first, the rest grouped, a long reason cut, and the whole text
    within what a finding carries on the wire."""
    def node(name: str, reason: str | None) -> NodeState:
        return NodeState(f"{name}:9477", name, reason=reason)

    refused, timed_out = "cannot connect: connection refused", "timed out after 5 s"
    f = unreached([node("gpu001", timed_out), node("gpu002", timed_out),
                   node("gpu007", refused), node("gpu009", None)])
    assert f.message == ("4 nodes never reached: gpu[001-002] (timed out after 5 s); "
                         "gpu007 (cannot connect: connection refused); gpu009 (no answer yet)")
    assert f.nodes == ("gpu001", "gpu002", "gpu007", "gpu009")
    # One reason for all: said once. One reason and nodes not answered yet: not theirs.
    assert unreached([node("gpu001", refused), node("gpu002", refused)]).message == (
        "2 nodes never reached: gpu[001-002] (cannot connect: connection refused)")
    assert unreached([node("gpu001", refused), node("gpu002", None)]).message == (
        "2 nodes never reached: gpu001 (cannot connect: connection refused); "
        "gpu002 (no answer yet)")
    # Five reasons: the three holding most nodes, the other two's nodes together; a
    # reason past REASON_CHARS is cut, and two alike as far as shown are one.
    long = "x" * (REASON_CHARS + 50)
    many = [node("a1", long), node("a2", long + "y"), node("a3", long), node("b1", "b"),
            node("b2", "b"), node("c1", "c"), node("d1", "d"), node("e1", "e")]
    text = unreached(many).message
    assert text == ("8 nodes never reached: a[1-3] (" + "x" * (REASON_CHARS - 3) + "...); "
                    "b[1-2] (b); c1 (c); d1,e1 (2 other reasons)")
    # Hundreds of hosts with long reasons: within the wire's bound, the rest counted.
    fleet = [node(f"10.0.{i // 200}.{i % 200 * 7}", f"reason {i % 5} " + "z" * 80)
             for i in range(600)]
    text = unreached(fleet).message
    assert len(text) <= MAX_FINDING_TEXT, len(text)
    assert text.startswith("600 nodes never reached: ") and text.endswith("other reasons)")
    assert "more nodes (" in text
    # Hundreds of scattered hosts, one reason (no range to fold them into): the list is
    # cut at a host and counted, so the reason after it is still said within the bound
    # (cut at the end, as the wire would, it was lost).
    refused_all = [node(f"10.{i % 7}.{i // 200}.{i % 200 * 7}", refused) for i in range(300)]
    text = unreached(refused_all).message
    assert len(text) <= MAX_FINDING_TEXT, len(text)
    assert text.startswith("300 nodes never reached: 10.0.0.[0,")
    assert text.endswith(" more (cannot connect: connection refused)")
    shown = re.search(r": (.*) and (\d+) more \(", text)
    assert shown is not None
    hosts = expand_hostlist(shown.group(1))
    assert len(hosts) + int(shown.group(2)) == 300  # each host said or counted, once
    assert set(hosts) <= {n.name for n in refused_all}
    # The same hosts beside a second reason: the first group is cut the same way and the
    # second's host is still named.
    text = unreached([*refused_all, node("gpu001", timed_out)]).message
    assert len(text) <= MAX_FINDING_TEXT, len(text)
    assert text.endswith(" more (cannot connect: connection refused); "
                         "gpu001 (timed out after 5 s)")


def test_a_host_list_cut_to_its_room_says_how_many_it_left_out() -> None:
    """hostlist_within: whole where it fits; else the first hosts in numeric order (gpu2
    before gpu10, as the list folds them), cut at a host, and the rest counted; each
    host once; the count alone where no host fits."""
    assert hostlist_within([], 10) == ""
    assert hostlist_within(["gpu3", "gpu1", "gpu2"], 20) == "gpu[1-3]"
    assert hostlist_within(["gpu1", "gpu1", "gpu3"], 20) == "gpu[1,3]"
    every_third = [f"gpu{i}" for i in range(1, 398, 3)]  # 133 hosts, no range
    text = hostlist_within(every_third, 60)
    assert len(text) <= 60 and text.startswith("gpu[1,4,7,10,")
    shown, more = re.fullmatch(r"(.*) and (\d+) more", text).groups()  # type: ignore[union-attr]
    assert expand_hostlist(shown) == every_third[:len(expand_hostlist(shown))]
    assert len(expand_hostlist(shown)) + int(more) == len(every_third)
    assert hostlist_within(["gpu1", "gpu3"], 0) == "2 hosts"
    assert hostlist_within(["a-very-long-host-name"], 5) == "1 host"


def test_the_unreached_finding_follows_each_node_and_reason_as_they_change() -> None:
    """The diagnosis makes the unreached text again only when a node or its reason
    changes (folding thousands of hosts every pass cost tens of ms): what it says must
    still follow the nodes as they are now, never a pass behind."""
    cluster = ClusterState("c")
    cluster.mark_stale("gpu001:9477", "cannot connect: connection refused")
    cluster.mark_stale("gpu002:9477", "cannot connect: connection refused")

    clock = FixedClock(1_796_000_000.0)
    diagnosis = Diagnosis(wall=clock)  # one diagnosis, pass after pass, as the app's

    def text() -> str:
        for _ in range(6):  # a finding holds a few seconds before it shows
            found = diagnosis.update(cluster, EfficiencyView(), StorageView())
            clock.now += 1.0
        return next(f.message for f in found if f.kind == "unreached")

    assert text() == "2 nodes never reached: gpu[001-002] (cannot connect: connection refused)"
    cluster.mark_stale("gpu002:9477", "timed out after 5 s")
    assert text() == ("2 nodes never reached: gpu001 (cannot connect: connection refused); "
                      "gpu002 (timed out after 5 s)")
    cluster.mark_stale("gpu003:9477", "timed out after 5 s")
    assert text() == ("3 nodes never reached: gpu[002-003] (timed out after 5 s); "
                      "gpu001 (cannot connect: connection refused)")
