"""Prometheus answers -> nodes: the series of each query laid onto the node, GPU, MIG
instance, port, file system and job they name, as an agent would hold them. Pure: no
HTTP, no model; what it learns across refreshes (each node's label matchers, the ports'
states at the last read of their counters) it keeps itself. `tuimon prom`'s scheduler
(tuimon.sources.prometheus) and the tests on recorded answers drive it alike."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tuimon.sources import prom_queries as q
from tuimon.sources.prom_answers import Series
from tuimon.sources.prom_nodes import NodeNames
from tuimon.sources.prom_port_errors import PortReadings
from tuimon.sources.prom_values import DCGM_INT32_BLANK, INDEX, as_int, dcgm_blank, whole
from tuimon_core.protocol.fields import PORT_ERROR_COUNTERS, PORT_UNREADABLE_METRIC
from tuimon_core.wait_kinds import rank_kind

# At most this many nodes: past it, the nodes known first are kept and a finding says how
# many were left out (docs/security.md).
MAX_NODES = 16_384
# The label matchers kept per node for its screen's detail query: an agent and an
# exporter, say; a few at most.
MAX_MATCHERS = 4


@dataclass
class Node:
    # The values likeliest to differ from the last refresh's first: FrameMaker.unchanged
    # compares every node with the one last sent, field by field in this order, and stops
    # at the first that differs (a port's rates, where a GPU is idle).
    name: str
    ports: dict[str, dict[str, Any]] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    gpu_info: dict[int, dict[str, Any]] = field(default_factory=dict)
    # GPU index -> GPU instance id -> values (dcgm-exporter in MIG mode)
    mig: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    filesystems: dict[str, dict[str, Any]] = field(default_factory=dict)
    disks: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    # Told by the presence answer (gpu_nodes): it has GPUs, whose series asked now may
    # be none (those the inventory knows are laid on it).
    present: bool = False


@dataclass
class Kept(Node):
    """What the inventory says of one node, read once per inventory and laid at every
    refresh onto the node the live answers made (onto its GPUs, MIG instances and ports
    there are now: it brings back none that has gone)."""

    exported: set[str] = field(default_factory=set)  # health counters, at 0 where absent
    # GPUs with a series asked only while drawn, and no other (once laid on the node the
    # live answers made at the inventory's refresh: `fresh` until then).
    drawn: set[int] = field(default_factory=set)
    fresh: bool = True
    port_rates: dict[str, float] = field(default_factory=dict)
    matchers: set[str] = field(default_factory=set)  # its screen's detail query


@dataclass
class Assembled:
    """One refresh's nodes, with what came beside them."""

    nodes: dict[str, Node]
    # node -> job -> the last hour's sums on it (JOB_HOUR), where this refresh asked them
    hours: dict[str, dict[str, dict[str, Any]]] | None
    over: set[str]  # nodes named past MAX_NODES (left out)


_N = TypeVar("_N", bound=Node)


def namer(resolver: NodeNames, into: dict[str, _N], make: Callable[[str], _N],
          most: int | None = None, known: Collection[str] = (),
          over: set[str] | None = None) -> Callable[[dict[str, str]], _N | None]:
    """A series' node in `into`, made when a series first names it. Asked once per
    series (a quarter of a million a refresh at 4096 nodes): by the identity labels'
    values, the node found for them before. With `most`: a name not `known` before is
    made only while the known and the new together are fewer; the others go to
    `over` (at most `most` of them are remembered)."""
    key_of = resolver.identity_key
    found: dict[tuple[str | None, ...], _N | None] = {}
    new = [0]

    def node(labels: dict[str, str]) -> _N | None:
        key = key_of(labels)
        try:
            return found[key]
        except KeyError:
            pass
        name = resolver.of(labels)
        n = None if name is None else into.get(name)
        if name is not None and n is None:
            if most is not None and name not in known:
                if len(known) + new[0] >= most:
                    if over is not None and len(over) < most:
                        over.add(name)
                    found[key] = None
                    return None
                new[0] += 1
            n = into[name] = make(name)
        found[key] = n
        return n
    return node


def learn_matcher(known: set[str], resolver: NodeNames, labels: dict[str, str]) -> None:
    if len(known) < MAX_MATCHERS:
        matcher = resolver.matcher(labels)
        if matcher is not None:
            known.add(matcher)


def read_gpus(series: Series, node: Callable[[dict[str, str]], Node | None],
              skip: Collection[str] = frozenset(),
              learn: Callable[[str, dict[str, str]], None] | None = None) -> set[str]:
    """GPU values, ours or dcgm-exporter's, onto their nodes (not those in `skip`).
    Returns the nodes it wrote to. `learn(node, labels)` is told each series of a node
    it is given for (one whose screen is open and has no label matcher yet)."""
    ranks: dict[tuple[str, int, int | None, str], int] = {}
    wrote: set[str] = set()
    table = q.GPU_SERIES
    for labels, value in series:
        entry = table.get(labels.get("__name__", ""))
        # A quarter of a million series a refresh at 4096 nodes: no call per index.
        text = labels.get("gpu")
        index = INDEX.get(text) if text is not None else None
        if index is None:
            index = as_int(text)
        if index is None or entry is None:
            continue
        n = node(labels)
        if n is None or n.name in skip:
            continue
        key, scale, add, rank = entry
        if value >= DCGM_INT32_BLANK and rank >= 0 and dcgm_blank(key, value):
            continue  # DCGM's "not supported" leaking through the exporter
        text = labels.get("GPU_I_ID")
        gi = None if text is None else as_int(text)
        gpus = n.gpus
        if learn is not None:
            learn(n.name, labels)
        wrote.add(n.name)
        values = gpus.get(index)
        if values is None:
            values = gpus[index] = {}
        if gi is not None:  # one MIG instance of the GPU
            values = n.mig.setdefault(index, {}).setdefault(gi, {})
            profile = labels.get("GPU_I_PROFILE")
            if profile and profile != "<<<NULL>>>":
                values["profile"] = profile
        if add:
            values[key] = values.get(key, 0.0) + value * scale
        elif key not in values:
            values[key] = value * scale
            if rank:  # kept only where not 0, the rank of most names
                ranks[(n.name, index, gi, key)] = rank
        else:
            # Of several names for one value, the table's first present wins (one
            # written with no rank kept, of rank 0 or by an earlier answer, as 0).
            slot = (n.name, index, gi, key)
            if rank <= ranks.get(slot, 0):
                values[key] = value * scale
                ranks[slot] = rank
    return wrote


def _job_of(labels: dict[str, str]) -> str | None:
    return labels.get("exported_job") or labels.get("job")


def job_hours(a: dict[str, Series], node: Callable[[dict[str, str]], Node | None]
              ) -> dict[str, dict[str, dict[str, Any]]]:
    """Each node's last hour of each job (JOB_HOUR's answers)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key in ("wall", "compute", "samples"):
        for labels, value in a.get(f"hour_{key}", []):
            job = _job_of(labels)
            n = node(labels) if job else None
            if n is not None and job:
                out.setdefault(n.name, {}).setdefault(job, {"waits": {}})[key] = value
    for labels, value in a.get("hour_waits", []):
        job = _job_of(labels)
        kind = labels.get("kind")
        n = node(labels) if job and kind else None
        if n is not None and job and kind:
            waits = out.setdefault(n.name, {}).setdefault(job, {"waits": {}})["waits"]
            waits[rank_kind(kind)] = waits.get(rank_kind(kind), 0.0) + value
    # A job's hour only with both its wall and its compute: one alone is no SLI.
    return {name: kept for name, jobs in out.items()
            if (kept := {job: h for job, h in jobs.items()
                         if "wall" in h and "compute" in h})}


def merge(into: Node, other: Node) -> None:
    for index, values in other.gpus.items():
        into.gpus.setdefault(index, {}).update(values)
    for index, info in other.gpu_info.items():
        into.gpu_info.setdefault(index, info)
    for index, instances in other.mig.items():
        into.mig.setdefault(index, {}).update(instances)
    # A port both name: its values from each (one exporter's state, the other's counters).
    for pid, port in other.ports.items():
        into.ports[pid] = {**port, **into.ports.get(pid, {})}
    for attr in ("host", "filesystems", "disks", "jobs"):
        getattr(into, attr).update({k: v for k, v in getattr(other, attr).items()
                                    if k not in getattr(into, attr)})
    into.present = into.present or other.present


class Assembler:
    """One refresh's answers -> its nodes. Keeps, across refreshes, the label matchers
    that select each node's series (for its screen's detail query) and the ports' error
    counters as last read (PortReadings)."""

    def __init__(self, errors_every: float | None = 15.0) -> None:
        self.matchers: dict[str, set[str]] = {}  # node -> label matchers of its series
        self.ports = PortReadings(errors_every)

    def assemble(self, a: dict[str, Series], resolver: NodeNames, *, clock: float,
                 kept: dict[str, Kept] | None = None, known: Collection[str] = (),
                 detail: Collection[str] = frozenset(),
                 dense: frozenset[str] = q.DENSE_GPU) -> Assembled:
        """The nodes these answers name (at most MAX_NODES, the `known` first), with the
        inventory's `kept` laid on them; `detail`: the nodes whose screen is open (their
        every series in the `gpu_detail` answer); `dense`: the GPU fields asked of every
        GPU; `clock`: monotonic seconds now. The port errors are counted after
        (count_port_errors), once the caller has the nodes it keeps."""
        nodes: dict[str, Node] = {}
        # Made only when a series carries something (a series with no GPU, port or host
        # value makes no phantom node); at most MAX_NODES, those known before first.
        over: set[str] = set()
        node = namer(resolver, nodes, Node, MAX_NODES, known, over)
        matchers = self.matchers

        def learn(name: str, labels: dict[str, str]) -> None:
            if name in detail and name not in matchers:
                learn_matcher(matchers.setdefault(name, set()), resolver, labels)

        # A node whose screen is open has every series in the detail answer: the others
        # would count its summed fields twice.
        detailed = read_gpus(a.get("gpu_detail", []), node)
        for answer in ("gpu", "gpu_busy", "gpu_sparse"):
            read_gpus(a.get(answer, []), node, skip=detailed,
                      learn=learn if detail else None)
        for labels, _ in a.get("clock_events", []):
            index = as_int(labels.get("gpu"))
            if index is not None and labels.get("reason"):
                n = node(labels)
                if n is not None:
                    n.gpus.setdefault(index, {}).setdefault("clock_events", []).append(
                        labels["reason"])
        for labels, value in a.get("host", []):
            metric = labels.get("__name__", "")
            if metric in q.HOST:
                n = node(labels)
                if n is not None:
                    key, scale, _ = q.HOST[metric]
                    n.host.setdefault(key, value * scale)
        for labels, value in a.get("host_cpu", []):
            n = node(labels)
            if n is not None:
                n.host.setdefault("cpu_util", min(1.0, max(0.0, value)))
        for labels, _ in a.get("gpu_nodes", []):
            n = node(labels)
            if n is not None:
                n.present = True
                learn(n.name, labels)  # its screen's
        self._ports(a, node)
        self.ports.keep_read(nodes, "ib_errors" in a, clock)
        for name, n in nodes.items():
            k = (kept or {}).get(name)
            if k is not None:
                self._apply_kept(n, k, name in detailed, dense)
        _storage(a, node)
        for key in ("wall", "compute", "samples", "steps"):
            for labels, value in a.get(f"job_{key}", []):
                rank = as_int(labels.get("rank"))
                job = _job_of(labels)
                if rank is not None and job:
                    n = node(labels)
                    if n is not None:
                        n.jobs.setdefault(job, {}).setdefault(rank, {})[key] = value
        for labels, value in a.get("job_waits", []):
            rank = as_int(labels.get("rank"))
            job = _job_of(labels)
            kind = labels.get("kind")
            if rank is None or not job or not kind:
                continue
            n = node(labels)
            if n is not None:
                rates = n.jobs.setdefault(job, {}).setdefault(rank, {})
                key = f"wait:{rank_kind(kind)}"  # at most the known kinds, whatever comes
                rates[key] = rates.get(key, 0.0) + value
        # Only the nodes the live answers made: the hour's increase still names a node
        # for an hour after its series stopped, and must not bring it back up.
        hours = (job_hours(a, lambda labels: nodes.get(resolver.of(labels) or ""))
                 if "hour_wall" in a and "hour_compute" in a else None)
        # `gpu001.cluster.local` and `gpu001` are one machine.
        for long, short in NodeNames.short_forms(nodes).items():
            merge(nodes[short], nodes.pop(long))
            matchers.setdefault(short, set()).update(matchers.pop(long, set()))
            if hours is not None and long in hours:
                hours[short] = {**hours.pop(long), **hours.get(short, {})}
        self.ports.fill_active(nodes, clock)
        return Assembled(nodes, hours, over)

    def count_port_errors(self, nodes: dict[str, Node], clock: float) -> None:
        self.ports.count(nodes, clock)

    def keep_matchers(self, names: Collection[str]) -> None:
        """Forget the matchers of nodes no longer named."""
        self.matchers = {name: m for name, m in self.matchers.items() if name in names}

    def _apply_kept(self, n: Node, kept: Kept, detailed: bool, dense: frozenset[str]) -> None:
        if kept.fresh:  # a GPU with series asked now is gone when they are
            kept.fresh = False
            unasked = q.DRAWN_ONLY_GPU - dense
            kept.drawn -= {i for i, g in n.gpus.items()
                           if i in n.mig or not unasked.issuperset(g)}
        if not detailed and dense != q.DENSE_GPU:
            for index in kept.drawn:  # there, though no series this refresh asked says so
                n.gpus.setdefault(index, {})
        if not detailed:  # an open screen's node has all of it in the detail answer
            for index, values in kept.gpus.items():
                live = n.gpus.get(index)
                if live is not None:
                    live.update(values)
            for index, instances in kept.mig.items():
                live_mig = n.mig.get(index)
                if live_mig is None:
                    continue
                for gi, values in instances.items():
                    if gi in live_mig:
                        live_mig[gi].update(values)
        for index, info in kept.gpu_info.items():
            if index in n.gpus:
                n.gpu_info.setdefault(index, info)
        if kept.matchers:
            known = self.matchers.setdefault(n.name, set())
            for matcher in kept.matchers:
                if len(known) < MAX_MATCHERS:
                    known.add(matcher)
        # The health counters its exporters export, at 0 on the GPUs the sparse answer
        # left out: the rules that count their increase need the zero they start from
        # (the first XID-free NVLink error is an increase of one, not a new counter).
        for key in kept.exported:
            for values in n.gpus.values():
                values.setdefault(key, 0.0)
        for pid, rate in kept.port_rates.items():
            port = n.ports.get(pid)
            if port is not None:
                port["rate"] = rate

    def _ports(self, a: dict[str, Series],
               node: Callable[[dict[str, str]], Node | None]) -> None:
        def port(labels: dict[str, str]) -> dict[str, Any] | None:
            if not labels.get("device") or not labels.get("port"):
                return None
            n = node(labels)
            if n is None:
                return None
            pid = f"{labels['device']}:{labels['port']}"
            p = n.ports.get(pid)
            if p is None:
                p = n.ports[pid] = {"id": pid}
            return p

        for labels, value in [*a.get("port_state", []), *a.get("port_phys_state", [])]:
            key = q.PORT_GAUGES.get(labels.get("__name__", ""))
            p = port(labels) if key else None
            if p is not None and key:
                p[key] = value
        for answer, key in (("ib_tx", "tx_bytes_s"), ("ib_rx", "rx_bytes_s"),
                            ("ib_wait", "xmit_wait_s")):
            for labels, value in a.get(answer, []):
                p = port(labels)
                if p is not None:
                    p[key] = value
        readings = self.ports
        for labels, value in a.get("ib_errors", []):  # a port's counters, where not 0
            name = labels.get("__name__", "")
            if name == PORT_UNREADABLE_METRIC:  # our agent could not read this one
                kind = labels.get("counter", "")
                p = port(labels) if kind in PORT_ERROR_COUNTERS else None
                if p is not None:
                    readings.unreadable(p, kind)
                continue
            entry = q.PORT_ERROR_SERIES.get(name)
            read = q.PORT_READ_SERIES.get(name)
            p = port(labels) if entry is not None or read is not None else None
            if p is None:
                continue
            # Both exporters on one node: ours, as for every other value.
            ours = entry[1] if entry is not None else bool(read)
            readings.counter(p, ours, None if entry is None else entry[0], value)


def _storage(a: dict[str, Series], node: Callable[[dict[str, str]], Node | None]) -> None:
    # node_exporter's mountstats name an NFS mount by its export; the mount point and
    # the type (nfs or nfs4) come from mountpoint_info or node_filesystem.
    mounts: dict[tuple[str | None, str], tuple[str, str | None]] = {}
    for labels, _ in a.get("nfs_mounts", []):
        if labels.get("export") and labels.get("mountpoint"):
            mount_key = (labels.get("instance"), labels["export"])
            mounts.setdefault(mount_key, (labels["mountpoint"], None))
    capacity: dict[tuple[str | None, str], dict[str, Any]] = {}
    for answer, key in (("fs_size", "size"), ("fs_avail", "avail")):
        for labels, value in a.get(answer, []):
            mp, device = labels.get("mountpoint"), labels.get("device")
            if not mp:
                continue
            entry = capacity.setdefault((labels.get("instance"), mp), {
                "fstype": labels.get("fstype"), "labels": labels})
            entry[key] = value
            if device:
                old = mounts.get((labels.get("instance"), device))
                mounts[(labels.get("instance"), device)] = (
                    old[0] if old else mp, labels.get("fstype"))
    for answer, key in (("fs_read", "read_bytes_s"), ("fs_write", "write_bytes_s")):
        for labels, value in a.get(answer, []):
            mount = labels.get("mount")
            fstype = labels.get("fstype")
            export = labels.get("export")
            if not mount and export:
                mount, fstype = mounts.get((labels.get("instance"), export), (export, None))
            if not mount:
                continue
            n = node(labels)
            if n is None:
                continue
            fs = n.filesystems.setdefault(mount, {"id": mount, "fstype": fstype or "nfs"})
            if fstype:
                fs["fstype"] = fstype
            if export:
                fs["source"] = export
            fs[key] = fs.get(key, 0.0) + value  # tcp and udp transports of one mount
    for (_, mp), entry in capacity.items():
        n = node(entry["labels"])
        if n is None:
            continue
        fs = n.filesystems.setdefault(mp, {"id": mp, "fstype": entry["fstype"] or "-"})
        fs["fstype"] = entry["fstype"] or fs["fstype"]
        if entry.get("size") is not None:
            fs["size"] = whole(entry["size"])
        if entry.get("avail") is not None:
            fs["avail"] = whole(entry["avail"])
    for answer, key in (("disk_read", "read_bytes_s"), ("disk_write", "write_bytes_s")):
        for labels, value in a.get(answer, []):
            if labels.get("device"):
                n = node(labels)
                if n is not None:
                    n.disks.setdefault(labels["device"], {"id": labels["device"],
                                                          "kind": "disk"})[key] = value
