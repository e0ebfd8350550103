"""Cluster-wide storage: aggregate throughput per shared file system, with history."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tuimon.model.cluster import ClusterState
from tuimon_core.overview import SHARED_FSTYPES

__all__ = ["SHARED_FSTYPES", "FsAggregate", "StorageView"]

HISTORY = 120


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
        fresh: dict[str, FsAggregate] = {}
        readers: dict[str, list[tuple[str, float]]] = {}
        writers: dict[str, list[tuple[str, float]]] = {}
        for node in cluster.nodes.values():
            if node.overview is None or node.status != "up":
                continue
            for fs in node.overview.get("fs") or ():  # shared file systems only
                mount = fs["id"]
                agg = fresh.get(mount)
                if agg is None:
                    old = self.filesystems.get(mount)
                    agg = fresh[mount] = FsAggregate(mount, fs.get("fstype") or "?")
                    if old is not None:
                        agg.read_hist, agg.write_hist = old.read_hist, old.write_hist
                r, w = fs.get("read") or 0, fs.get("write") or 0
                agg.read += r
                agg.write += w
                agg.metadata_ops += fs.get("md_ops") or 0.0
                agg.nodes += 1
                if fs.get("size") is not None:
                    agg.size, agg.free = fs["size"], fs.get("free")
                readers.setdefault(mount, []).append((node.name, r))
                writers.setdefault(mount, []).append((node.name, w))
        for mount, agg in fresh.items():
            agg.read_hist.append(agg.read)
            agg.write_hist.append(agg.write)
            agg.top_readers = sorted(readers.get(mount, []), key=lambda x: -x[1])[:3]
            agg.top_writers = sorted(writers.get(mount, []), key=lambda x: -x[1])[:3]
        self.filesystems = fresh
