"""Cluster-wide storage: aggregate throughput per shared file system, with history."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tuimon.model.cluster import ClusterState
from tuimon_core.filesystems import SHARED_FSTYPES
from tuimon_core.node_states import UP
from tuimon_core.protocol.overview_layout import fs_rows

__all__ = ["SHARED_FSTYPES", "FsAggregate", "StorageView"]

HISTORY = 120
# A shared file system at this share of its provisioned throughput or more is near its
# limit: the `storage` finding, and the storage pane's colour.
NEAR_PROVISIONED = 0.9
TOP = 3  # heaviest readers and writers named per file system


@dataclass
class FsAggregate:
    mount: str
    fstype: str
    read: float = 0.0  # bytes/s summed over nodes
    write: float = 0.0
    metadata_ops: float = 0.0
    nodes: int = 0
    size: int | None = None
    free: int | None = None
    top_readers: list[tuple[str, float]] = field(default_factory=list)
    top_writers: list[tuple[str, float]] = field(default_factory=list)
    read_hist: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    write_hist: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))


class StorageView:
    """Recomputed once a tick from the nodes' latest samples."""

    def __init__(self, provisioned: dict[str, float] | None = None) -> None:
        self.provisioned = dict(provisioned or {})  # mount -> bytes/s
        self.filesystems: dict[str, FsAggregate] = {}

    def update(self, cluster: ClusterState) -> None:
        # Per mount: [fstype, read, write, metadata ops, nodes, size, free, top readers,
        # top writers], summed from the overviews' shared file systems (their rows,
        # overview_layout.FsRow, read by column name: the columns' order is the name
        # table's, FS_ROW_FIELDS). Every node, every second: at 4096
        # nodes this loop is a third of the app's judgement, so the top three are kept
        # as it goes, not sorted out of a list of every node.
        sums: dict[str, list[Any]] = {}
        for node in cluster.nodes.values():
            ov = node.overview
            if ov is None or node.status != UP:
                continue
            name = node.name
            for row in fs_rows(ov):
                acc = sums.get(row.id)
                if acc is None:
                    acc = sums[row.id] = [row.fstype or "?", 0, 0, 0.0, 0, None, None, [], []]
                r = row.read or 0
                w = row.write or 0
                acc[1] += r
                acc[2] += w
                acc[3] += row.md_ops or 0.0
                acc[4] += 1
                if row.size is not None:
                    acc[5], acc[6] = row.size, row.free
                top = acc[7]
                if len(top) < TOP or r > top[-1][0]:
                    _keep_top(top, r, name)
                top = acc[8]
                if len(top) < TOP or w > top[-1][0]:
                    _keep_top(top, w, name)
        fresh: dict[str, FsAggregate] = {}
        for mount, (fstype, read, write, md_ops, nodes, size, free, readers, writers) \
                in sums.items():
            agg = fresh[mount] = FsAggregate(mount, fstype, read, write, md_ops, nodes, size,
                                             free)
            old = self.filesystems.get(mount)
            if old is not None:
                agg.read_hist, agg.write_hist = old.read_hist, old.write_hist
            agg.read_hist.append(read)
            agg.write_hist.append(write)
            agg.top_readers = [(n, v) for v, n in readers]
            agg.top_writers = [(n, v) for v, n in writers]
        self.filesystems = fresh


def near_provisioned(bytes_s: float, provisioned: float | None) -> bool:
    """Whether reads and writes of `bytes_s` take a file system near its provisioned
    throughput (a figure given with --provisioned; None: not known)."""
    return provisioned is not None and provisioned > 0 and \
        bytes_s >= NEAR_PROVISIONED * provisioned


def _keep_top(top: list[tuple[float, str]], value: float, name: str) -> None:
    """Put (value, name) into the descending list `top` of at most TOP, after the
    entries of equal value (ties keep the nodes' order)."""
    i = len(top)
    while i and top[i - 1][0] < value:
        i -= 1
    top.insert(i, (value, name))
    del top[TOP:]
