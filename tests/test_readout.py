"""The plain readout (`--once`, `--plain`): what a person reads in a log or over SSH."""

from __future__ import annotations

import dataclasses

from tests.seeded import seeded_cluster
from tuimon.readout import render

CLOUD = "ip-100-64-171-120.ec2.internal"
LONG = "gpu-" + "a" * 40 + ".rack7.row3.hall2.datacenter.example.org"


async def test_node_names_are_shown_whole_or_without_their_domain_never_cut_mid_word(
        ) -> None:
    cluster, sim = await seeded_cluster(3, gpus=1)
    for member, name in zip(sim.members, (CLOUD, LONG, "n1")):
        node = cluster.nodes[member.target]
        cluster.apply_hello(member.target, dataclasses.replace(node.hello, node=name))
    rows = {line.split()[0]: line for line in render(cluster).splitlines()
            if line.split() and line.split()[0] in (CLOUD, LONG.split(".")[0], "n1")}
    # Kubernetes and cloud names whole; a name past the column's cap without its domain.
    assert set(rows) == {CLOUD, LONG.split(".")[0], "n1"}, render(cluster)
    # One column: every row's status starts where the header's does.
    header = next(line for line in render(cluster).splitlines() if line.startswith("node "))
    at = header.index("status")
    assert all(row[at:].startswith(("up", "stale", "down")) for row in rows.values()), rows


async def test_the_util_column_reads_how_busy_a_gpu_is_whatever_measured_it() -> None:
    """Through Prometheus a GPU may come with engine activity and no utilisation (the
    busy measure is asked once a GPU): the column shows it, as the map does."""
    from tuimon_core.protocol import Sample

    cluster, sim = await seeded_cluster(1, gpus=2)
    target = sim.members[0].target
    node = cluster.nodes[target]
    gpus = [{"gr_active": 0.42, "temp": 50}, {"gr_active": 0.58, "temp": 51}]
    cluster.apply_sample(target, dataclasses.replace(node.sample, seq=node.sample.seq + 1,
                                                     gpus=gpus))
    assert isinstance(cluster.nodes[target].detail, Sample)
    row = next(line for line in render(cluster).splitlines()
               if line.startswith(node.name + " "))
    assert " 50%" in row, row


async def test_a_nodes_row_reads_only_the_fields_it_declares() -> None:
    """`tuimon prom --once` asks only ROW_READS of every node: each row of a faulty
    seeded cluster reads the same from only those fields as from its whole sample."""
    from tuimon.readout import ROW_READS, node_row

    cluster, _ = await seeded_cluster(nodes=16, gpus=8)

    def only(values: dict) -> dict:
        return {k: v for k, v in values.items() if k in ROW_READS or k == "id"}

    rows = 0
    for node in cluster.nodes.values():
        full = node_row(node, cluster.clock())
        sample = node.detail
        fabric = sample.extra.get("fabric") or {}
        node.detail = dataclasses.replace(
            sample, gpus=[only(g) for g in sample.gpus or ()], host=only(sample.host or {}),
            extra={**sample.extra, "fabric": {**fabric, "ports": [
                only(p) for p in fabric.get("ports") or ()]}})
        assert node_row(node, cluster.clock()) == full
        rows += "%" in full
    assert rows == 16


async def test_the_xid_column_counts_what_the_xid_finding_names() -> None:
    """Through Prometheus a GPU's XID comes as its last XID only (dcgm-exporter), never
    as an event: the column counts it as the finding does ("XID 79 (1 seen)"), not 0
    beside a critical finding; an agent's own count where it gives one."""
    from tests.seeded import judged

    cluster, sim = await seeded_cluster(1, gpus=2)
    target = sim.members[0].target
    node = cluster.nodes[target]

    def xid_column() -> str:
        header = next(line for line in render(cluster).splitlines()
                      if line.startswith("node "))
        row = next(line for line in render(cluster).splitlines()
                   if line.startswith(node.name + " "))
        return row.split()[header.split().index("xid")]

    assert node.xids == 0 and xid_column() == "0"
    gpus = [{"gr_active": 0.5}, {"gr_active": 0.5, "last_xid": 79}]
    # As Prometheus's frames come: no findings of the node's own, so judged here.
    extra = {k: v for k, v in node.sample.extra.items() if k != "findings"}
    cluster.apply_sample(target, dataclasses.replace(node.sample, seq=node.sample.seq + 1,
                                                     gpus=gpus, extra=extra))
    _, findings = judged(cluster)
    said = [f.message for f in findings if f.kind == "xid"]
    assert said and said[0].endswith("XID 79 (1 seen)"), said
    assert xid_column() == "1"
    gpus[1] = {"gr_active": 0.5, "last_xid": 79, "xid_total": 3}
    cluster.apply_sample(target, dataclasses.replace(node.sample, seq=node.sample.seq + 2,
                                                     gpus=gpus, extra=extra))
    assert xid_column() == "3"
