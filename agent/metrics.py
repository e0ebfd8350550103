"""`/metrics`: the agent's latest sample as Prometheus text, built at scrape time.

A custom collector over a dedicated registry (prometheus_client's pattern for exporters
that mirror another system's state): nothing is stored twice, and a value that could
not be read is absent, not 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tuimon_core.protocol.fields import (
    DISK_COUNTERS_READ,
    FS_COUNTERS_READ,
    GPU_FIELDS,
    GPU_INFO_METRICS,
    GPU_UP_METRIC,
    HCA_INFO_METRICS,
    HOST_FIELDS,
    NIC_COUNTERS_READ,
    PORT_COUNTERS_READ,
    PORT_GAUGE_METRICS,
    PORT_UNREADABLE_METRIC,
)
from tuimon_core.serving import exposition
from tuimon_core.serving.finding_metrics import finding_families
from tuimon_core.serving.metrics import connection_metrics
from tuimon_core.version import __version__
from tuimon_core.wait_kinds import RANK_KINDS

if TYPE_CHECKING:
    from agent.node import NodeAgent

# (wire key, metric name, kind, help), from the one name table (tuimon_core.protocol.fields).
GPU_METRICS: tuple[tuple[str, str, str, str], ...] = tuple(
    (f.key, f.metric, "counter" if f.counter else "gauge", f.doc)
    for f in GPU_FIELDS if f.metric is not None)
HOST_METRICS: tuple[tuple[str, str, str, str], ...] = tuple(
    (f.key, f.metric, "counter" if f.counter else "gauge", f.doc)
    for f in HOST_FIELDS if f.metric is not None)

GPU_LABELS = ["node", "gpu", "uuid"]
PORT_LABELS = ["node", "device", "port"]

def _family(name: str, kind: str, doc: str,
            labels: list[str]) -> CounterMetricFamily | GaugeMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


class AgentCollector(Collector):
    """Builds every family from `agent.latest` and `agent.hello` at scrape time."""

    def __init__(self, agent: NodeAgent, guard: Any = None) -> None:
        self.agent = agent
        self.guard = guard

    def collect(self) -> Iterator[Metric]:
        agent = self.agent
        node = agent.config.node_name
        info = GaugeMetricFamily("tuimon_agent_info", "Agent version and node",
                                 labels=["node", "version"])
        info.add_metric([node, __version__], 1)
        yield info
        yield from self._agent_counters(node)
        sample = agent.latest
        hello = agent.hello
        nvml_up = GaugeMetricFamily("tuimon_nvml_up", "1 when NVML is readable on this node",
                                    labels=["node"])
        nvml_up.add_metric([node], 0 if agent.gpu.nvml is None else 1)
        yield nvml_up
        yield from finding_families(agent.findings.active, "the agent's node-local rules",
                                    to_wall=agent.wall_of)
        if sample is None or hello is None:
            return
        yield from self._gpus(node, sample.gpus or [], hello.gpus)
        yield from self._host(node, sample.host or {})
        yield from _fabric_metrics(node, sample.extra.get("fabric") or {}, hello, agent.fabric)
        yield from _platform_metrics(node, hello)
        yield from _roce_metrics(node, agent.fabric)
        yield from _storage_metrics(node, sample.extra.get("storage") or {}, agent.storage)
        yield from _step_metrics(node, agent.steps)

    def _agent_counters(self, node: str) -> Iterator[Metric]:
        agent = self.agent
        samples = CounterMetricFamily("tuimon_agent_samples", "Samples taken", labels=["node"])
        samples.add_metric([node], agent.stats.samples)
        yield samples
        overruns = CounterMetricFamily(
            "tuimon_agent_sample_overruns", "Sample deadlines missed", labels=["node"])
        overruns.add_metric([node], agent.stats.overruns)
        yield overruns
        cpu = GaugeMetricFamily("tuimon_agent_sample_cpu_seconds",
                                "CPU time the last sample took", labels=["node"])
        cpu.add_metric([node], agent.stats.last_sample_cpu)
        yield cpu
        clients = GaugeMetricFamily("tuimon_agent_stream_clients", "Connected stream clients",
                                    labels=["node"])
        clients.add_metric([node], len(agent.hub.clients))
        yield clients
        if self.guard is not None:
            yield from connection_metrics("tuimon_agent", node, self.guard)
        dropped = CounterMetricFamily("tuimon_agent_dropped_frames",
                                      "Frames dropped for slow stream clients", labels=["node"])
        dropped.add_metric([node], agent.hub.dropped_total)
        yield dropped
        events = CounterMetricFamily("tuimon_agent_events", "Events emitted, by kind",
                                     labels=["node", "kind"])
        for kind, n in sorted(agent.events_total.items()):
            events.add_metric([node, kind], n)
        yield events

    def _gpus(self, node: str, gpus: list[dict[str, Any]], inventory: list[Any]) -> Iterator[
            Metric]:
        labels = []
        for i in range(len(gpus)):
            uuid = inventory[i].uuid if i < len(inventory) and inventory[i].uuid else ""
            labels.append([node, str(i), uuid])
        up = GaugeMetricFamily(GPU_UP_METRIC, "1 when the GPU could be read", labels=GPU_LABELS)
        for values, lab in zip(gpus, labels):
            up.add_metric(lab, 0 if values.get("failed") else 1)
        yield up
        for key, name, kind, doc in GPU_METRICS:
            fam = _family(name, kind, doc, GPU_LABELS)
            for values, lab in zip(gpus, labels):
                v = values.get(key)
                if v is not None:
                    fam.add_metric(lab, v)
            yield fam
        for attr, name, doc in GPU_INFO_METRICS:  # the inventory's facts
            fam = GaugeMetricFamily(name, doc, labels=GPU_LABELS)
            for g, lab in zip(inventory, labels):
                if getattr(g, attr) is not None:
                    fam.add_metric(lab, getattr(g, attr))
            yield fam
        yield from _mig_metrics(gpus, labels)
        events = GaugeMetricFamily("tuimon_gpu_clock_event_active",
                                   "1 for each active clock-event (throttle) reason",
                                   labels=[*GPU_LABELS, "reason"])
        for values, lab in zip(gpus, labels):
            for reason in values.get("clock_events") or ():
                events.add_metric([*lab, reason], 1)
        yield events

    def _host(self, node: str, host: dict[str, Any]) -> Iterator[Metric]:
        for key, name, kind, doc in HOST_METRICS:
            fam = _family(name, kind, doc, ["node"])
            v = host.get(key)
            if v is not None:
                fam.add_metric([node], v)
            yield fam


def _mig_metrics(gpus: list[dict[str, Any]], labels: list[list[str]]) -> Iterator[Metric]:
    """Each MIG instance's memory and processes, under its parent GPU's labels."""
    mig_labels = [*GPU_LABELS, "gpu_instance", "profile"]
    families = (("mem_used", "tuimon_gpu_mig_memory_used_bytes", "MIG instance memory in use"),
                ("mem_total", "tuimon_gpu_mig_memory_total_bytes", "MIG instance memory"),
                ("procs", "tuimon_gpu_mig_processes", "Compute processes in the MIG instance"))
    for key, name, doc in families:
        fam = GaugeMetricFamily(name, doc, labels=mig_labels)
        for values, lab in zip(gpus, labels):
            for m in values.get("mig") or ():
                if m.get(key) is not None:
                    fam.add_metric([*lab, str(m["gi"]), m.get("profile") or ""], m[key])
        yield fam


def _fabric_metrics(node: str, fabric: dict[str, Any], hello: Any,
                    collector: Any) -> Iterator[Metric]:
    info = {p["id"]: p for p in hello.extra.get("ports") or ()}
    ports = fabric.get("ports") or []

    def labels(p: dict[str, Any]) -> list[str]:
        device, _, port = p["id"].rpartition(":")
        return [node, device, port]

    # Each port's totals read once: the collector replaces a port's whole dict at each
    # read, in its own thread, and a scrape must see each counter exported or marked
    # unreadable (below) from the same read, never neither.
    totals = {p["id"]: collector.totals.get(p["id"], {}) for p in ports}
    for c in PORT_COUNTERS_READ:
        fam = CounterMetricFamily(c.metric, c.doc, labels=PORT_LABELS)
        for p in ports:
            value = totals[p["id"]].get(c.key)
            # A saturated legacy counter is stuck, not counting: absent, like unreadable.
            if value is not None and c.key not in (p.get("saturated") or ()):
                fam.add_metric(labels(p), value)
        yield fam
    rate, state, phys = (GaugeMetricFamily(name, doc, labels=PORT_LABELS)
                         for _, name, _, doc in PORT_GAUGE_METRICS)
    saturated = GaugeMetricFamily("tuimon_ib_port_counter_saturated",
                                  "1 for each legacy counter stuck at its maximum",
                                  labels=[*PORT_LABELS, "counter"])
    hw = CounterMetricFamily("tuimon_ib_port_hw_counter", "mlx5 hw_counters (RoCE congestion "
                             "and retransmission)", labels=[*PORT_LABELS, "counter"])
    # A reader that counts what an error counter grew by must not take its absence for
    # 0: back at its old total, it would count the whole total as new errors.
    unreadable = GaugeMetricFamily(PORT_UNREADABLE_METRIC,
                                   "1 for each counter that could not be read (absent from "
                                   "its family)", labels=[*PORT_LABELS, "counter"])
    for p in ports:
        lab = labels(p)
        # From the totals the counters are exported from (a scrape while the next sample
        # is collected sees each counter or its mark).
        for key, value in totals[p["id"]].items():
            if value is None:  # there, and could not be read (no file: not in totals)
                unreadable.add_metric([*lab, key], 1)
        r = info.get(p["id"], {}).get("rate")
        if r is not None:
            rate.add_metric(lab, r)
        if p.get("state") is not None:
            state.add_metric(lab, p["state"])
        if p.get("phys_state") is not None:
            phys.add_metric(lab, p["phys_state"])
        for counter in p.get("saturated") or ():
            saturated.add_metric([*lab, counter], 1)
        for counter, value in collector.hw_totals.get(p["id"], {}).items():
            if value is not None:
                hw.add_metric([*lab, counter], value)
    yield from (rate, state, phys, saturated, hw, unreadable)
    nics = fabric.get("nics") or []
    for c in NIC_COUNTERS_READ:
        fam = CounterMetricFamily(c.metric, c.doc, labels=["node", "device"])
        for n in nics:
            value = collector.nic_totals.get(n["id"], {}).get(c.key)
            if value is not None:
                fam.add_metric([node, n["id"]], value)
        yield fam


def _storage_metrics(node: str, storage: dict[str, Any], collector: Any) -> Iterator[Metric]:
    disks = storage.get("disks") or []
    for c in DISK_COUNTERS_READ:
        fam = CounterMetricFamily(c.metric, c.doc, labels=["node", "device"])
        for d in disks:
            value = collector.disk_totals.get(d["id"], {}).get(c.key)
            if value is not None:
                fam.add_metric([node, d["id"]], value)
        yield fam
    fs_labels = ["node", "mount", "fstype"]
    filesystems = storage.get("filesystems") or []
    for c in FS_COUNTERS_READ:
        fam = CounterMetricFamily(c.metric, c.doc, labels=fs_labels)
        for f in filesystems:
            value = collector.fs_totals.get(f["id"], {}).get(c.key)
            if value is not None:
                fam.add_metric([node, f["id"], f["fstype"]], value)
        yield fam
    for key, name, doc in (("size", "tuimon_fs_size_bytes", "File system size"),
                           ("free", "tuimon_fs_free_bytes", "Free bytes"),
                           ("avail", "tuimon_fs_avail_bytes", "Bytes available to users"),
                           ("inodes", "tuimon_fs_inodes", "Inodes in all"),
                           ("inodes_free", "tuimon_fs_inodes_free", "Free inodes")):
        gauge = GaugeMetricFamily(name, doc, labels=fs_labels)
        for f in filesystems:
            if f.get(key) is not None:
                gauge.add_metric([node, f["id"], f["fstype"]], f[key])
        yield gauge


def _step_metrics(node: str, steps: Any) -> Iterator[Metric]:
    labels = ["job", "rank", "node"]
    families = (
        ("wall", "tuimon_job_wall_seconds", "Step wall time reported by training ranks"),
        ("compute", "tuimon_job_compute_seconds",
         "Step compute time (wall minus waiting) reported by training ranks"),
        ("samples", "tuimon_job_samples", "Samples processed, reported by training ranks"),
        ("tokens", "tuimon_job_tokens", "Tokens processed, reported by training ranks"),
        ("steps", "tuimon_job_steps", "Steps reported by training ranks"),
    )
    for attr, name, doc in families:
        fam = CounterMetricFamily(name, doc, labels=labels)
        for (job, rank), t in sorted(steps.totals.items()):
            fam.add_metric([job, str(rank), node], getattr(t, attr))
        yield fam
    # Every kind for every rank, zero until waited on: a rate() by kind is defined from
    # the rank's first step.
    waits = CounterMetricFamily(
        "tuimon_job_wait_seconds", "Step time spent waiting, by what was waited on ("
        + ", ".join(RANK_KINDS) + "), reported by training ranks", labels=[*labels, "kind"])
    for (job, rank), t in sorted(steps.totals.items()):
        for kind in RANK_KINDS:
            waits.add_metric([job, str(rank), node, kind], t.waits.get(kind, 0.0))
    yield waits
    rejected = CounterMetricFamily("tuimon_agent_step_reports_rejected",
                                   "Step datagrams refused, all reasons", labels=["node"])
    rejected.add_metric([node], steps.rejected)
    yield rejected
    refused = CounterMetricFamily(
        "tuimon_agent_step_reports_refused", "Step datagrams refused, by reason (invalid, "
        "name_too_long, too_many_jobs, too_many_ranks, not_owner, flood)",
        labels=["node", "reason"])
    for reason, n in sorted(steps.refused.items()):
        refused.add_metric([node, reason], n)
    yield refused
    lost = CounterMetricFamily("tuimon_agent_step_reports_lost",
                               "Step reports missing from ranks' sequence numbers",
                               labels=["node"])
    lost.add_metric([node], steps.lost)
    yield lost
    clipped = CounterMetricFamily(
        "tuimon_agent_step_reports_clipped",
        "Step reports credited less time than they claimed (more than real time passed)",
        labels=["node"])
    clipped.add_metric([node], steps.clipped)
    yield clipped


def _platform_metrics(node: str, hello: Any) -> Iterator[Metric]:
    """What the node is made of (the hello's): the fleet compares these."""
    extra, host = hello.extra, hello.host or {}
    info = GaugeMetricFamily("tuimon_node_platform_info", "1, labelled with the kernel, "
                             "NVIDIA and CUDA driver versions and the GPUDirect RDMA module",
                             labels=["node", "kernel", "driver", "cuda", "gpudirect"])
    info.add_metric([node, host.get("kernel") or "", hello.driver_version or "",
                     extra.get("cuda_driver_version") or "", extra.get("gpudirect") or ""], 1)
    yield info
    bus = GaugeMetricFamily("tuimon_gpus_on_pci_bus", "NVIDIA GPUs on the PCI bus held by "
                            "the node (what NVML should see)", labels=["node"])
    bus.add_metric([node], len(extra.get("pci_gpus") or ()))
    yield bus
    links = [(key, GaugeMetricFamily(name, doc, labels=["node", "device"]))
             for key, name, doc in HCA_INFO_METRICS]
    seen = set()
    for p in extra.get("ports") or ():
        device = p.get("device")
        if device in seen:
            continue
        seen.add(device)
        for key, fam in links:
            if p.get(key) is not None:
                fam.add_metric([node, str(device)], p[key])
    yield from (fam for _, fam in links)


def _roce_metrics(node: str, collector: Any) -> Iterator[Metric]:
    """RoCE ports' lossless counters, cumulative, from their netdevs' statistics."""
    frames = CounterMetricFamily("tuimon_roce_pause_frames", "PFC and global pause frames",
                                 labels=[*PORT_LABELS, "direction"])
    paused = CounterMetricFamily("tuimon_roce_paused_seconds", "Time paused: rx, held off "
                                 "by the peer; tx, holding the peer off",
                                 labels=[*PORT_LABELS, "direction"])
    storms = CounterMetricFamily("tuimon_roce_pause_storm_events", "PFC storm watchdog "
                                 "events", labels=[*PORT_LABELS, "level"])
    # Each drop counted once (ethtool_stats.PauseSummary): all priorities, what arrived
    # (the share's denominator), and the PFC priorities' drops alone.
    drops = {key: CounterMetricFamily(name, doc, labels=PORT_LABELS) for key, name, doc in (
        ("discards", "tuimon_roce_discards", "Packets dropped for lack of receive buffer, "
         "each counted once (rx_prio<N>_discards summed, else rx_discards_phy)"),
        ("arrived", "tuimon_roce_arrived_packets", "Packets that reached the port, kept or "
         "dropped, from the same counters as tuimon_roce_discards"),
        ("lossless_discards", "tuimon_roce_lossless_discards", "Packets dropped on the "
         "priorities with PFC on: lossless traffic lost"))}
    for pid, totals in collector.pause_totals.items():
        device, _, port = pid.rpartition(":")
        lab = [node, device, port]
        for direction in ("rx", "tx"):
            if f"pause_{direction}" in totals:
                frames.add_metric([*lab, direction], totals[f"pause_{direction}"])
            if f"pause_{direction}_us" in totals:
                paused.add_metric([*lab, direction], totals[f"pause_{direction}_us"] / 1e6)
        for level in ("warning", "error"):
            if f"storm_{level}" in totals:
                storms.add_metric([*lab, level], totals[f"storm_{level}"])
        for key, family in drops.items():
            if key in totals:
                family.add_metric(lab, totals[key])
    yield from (frames, paused, storms, *drops.values())


def make_registry(agent: NodeAgent, guard: Any = None) -> CollectorRegistry:
    """A registry of our own: no process or platform collectors from the default one."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent, guard))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return exposition.render(registry)
