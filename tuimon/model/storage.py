"""Cluster-wide storage: aggregate throughput per shared file system, with history."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from tuimon.model.cluster import ClusterState
from tuimon_core.overview import SHARED_FSTYPES

__all__ = ["SHARED_FSTYPES", "FsAggregate", "StorageView"]

HISTORY = 120
_value = itemgetter(0)  # ties keep the nodes' order, as a stable sort does


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
        # Per mount: [fstype, read, write, metadata ops, nodes, size, free, readers,
        # writers], summed from the overviews' shared file systems (every node, a second).
        sums: dict[str, list[Any]] = {}
        for node in cluster.nodes.values():
            ov = node.overview
            if ov is None or node.status != "up":
                continue
            filesystems = ov.get("fs")
            if not filesystems:
                continue
            name = node.name
            for fs in filesystems:
                acc = sums.get(fs["id"])
                if acc is None:
                    acc = sums[fs["id"]] = [fs.get("fstype") or "?", 0, 0, 0.0, 0, None, None,
                                            [], []]
                r, w = fs.get("read") or 0, fs.get("write") or 0
                acc[1] += r
                acc[2] += w
                acc[3] += fs.get("md_ops") or 0.0
                acc[4] += 1
                if fs.get("size") is not None:
                    acc[5], acc[6] = fs["size"], fs.get("free")
                acc[7].append((r, name))
                acc[8].append((w, name))
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
            agg.top_readers = [(n, v) for v, n in heapq.nlargest(3, readers, key=_value)]
            agg.top_writers = [(n, v) for v, n in heapq.nlargest(3, writers, key=_value)]
        self.filesystems = fresh
