"""A Prometheus-compatible server (Prometheus, Thanos, Mimir, VictoriaMetrics: anything
with `/api/v1/query`) as a source of the live cluster, for sites with no agent of ours.

Each refresh runs the fixed set of instant queries in `prom_queries` (a few at a time,
with a timeout each), whatever the node count, and turns the answers into the same
`hello` and `sample` frames an agent sends: the app, recordings, diagnosis and
`tuimon status` work unchanged. Frames are encoded and decoded like an agent's, so a
value Prometheus holds that the protocol refuses (NaN, a negative count) is dropped by
the same checks. A node whose series vanish is stale; Prometheus unreachable makes every
node stale with the reason. The error budget comes from the job counters over the SLO
window, as the relay's ledger would send it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tuimon.model.cluster import ClusterState
from tuimon.sources import prom_queries as q
from tuimon.sources.agent_stream import describe_error
from tuimon_core.protocol import GpuInfo, Hello, ProtocolError, Sample, decode, encode
from tuimon_core.protocol.fields import GPU_FIELDS, HOST_FIELDS
from tuimon_core.version import __version__

log = logging.getLogger(__name__)

_GPU_KIND = {f.key: f.kind for f in GPU_FIELDS}
_HOST_KIND = {f.key: f.kind for f in HOST_FIELDS}
Series = list[tuple[dict[str, str], float]]


class PromError(Exception):
    """Prometheus could not answer; the message says which query and why."""


@dataclass
class PromOptions:
    token: str | None = None
    ssl_context: ssl.SSLContext | None = None
    # Extra label matchers added to every selector, e.g. 'cluster="prod"'.
    match: str = ""
    every: float = 5.0
    budget_every: float = 30.0
    slo_hours: float = 720.0
    timeout: float = 10.0
    concurrency: int = 4
    recorder: Callable[[str, bytes], None] | None = None


@dataclass
class _Node:
    name: str
    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    gpu_info: dict[int, dict[str, Any]] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)
    ports: dict[str, dict[str, Any]] = field(default_factory=dict)
    filesystems: dict[str, dict[str, Any]] = field(default_factory=dict)
    disks: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)


class PromSource:
    def __init__(self, url: str, cluster: ClusterState, session: aiohttp.ClientSession,
                 options: PromOptions | None = None) -> None:
        self.url = url.rstrip("/")
        self.cluster = cluster
        self.session = session
        self.options = options or PromOptions()
        self.queries_run = 0
        self.refreshes = 0
        self._seq = 0
        self._inventory: dict[str, tuple[Any, ...]] = {}
        self._last_budget = -math.inf
        self._sem = asyncio.Semaphore(self.options.concurrency)

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.refresh()
            except PromError as exc:
                log.warning("%s", exc)
                for target in list(self.cluster.nodes):
                    self.cluster.mark_stale(target, str(exc))
            await asyncio.sleep(max(0.5, self.options.every - (time.monotonic() - started)))

    async def query(self, promql: str) -> Series:
        headers = {"Authorization": f"Bearer {self.options.token}"} if self.options.token else {}
        async with self._sem:
            self.queries_run += 1
            try:
                async with self.session.get(
                        f"{self.url}/api/v1/query", params={"query": promql}, headers=headers,
                        ssl=self.options.ssl_context or True,
                        timeout=aiohttp.ClientTimeout(total=self.options.timeout)) as resp:
                    if resp.status == 401:
                        raise PromError(f"prometheus {self.url}: wrong or missing token (401)")
                    try:
                        body = await resp.json(content_type=None)
                    except ValueError:
                        raise PromError(f"prometheus {self.url}: HTTP {resp.status}, not "
                                        "a JSON answer") from None
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                raise PromError(f"prometheus {self.url}: "
                                f"{describe_error(exc)}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else None
            raise PromError(f"prometheus {self.url}: query failed: {error or body!r:.200}"
                            f" ({promql[:80]})")
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            return []
        out: Series = []
        for item in data.get("result") or []:
            try:
                labels = {str(k): str(v) for k, v in item["metric"].items()}
                value = float(item["value"][1])
            except (KeyError, TypeError, ValueError, IndexError):
                continue
            if math.isfinite(value):
                out.append((labels, value))
        return out

    async def refresh(self) -> None:
        names = list(q.LIVE_QUERIES)
        templates = [q.LIVE_QUERIES[n] for n in names]
        now = time.monotonic()
        with_budget = now - self._last_budget >= self.options.budget_every
        if with_budget:
            budget = q.budget_queries(self.options.slo_hours)
            names += list(budget)
            templates += list(budget.values())
        results = await asyncio.gather(*(self.query(q.render(t, self.options.match))
                                         for t in templates))
        answers = dict(zip(names, results))
        self.refreshes += 1
        nodes = self._assemble(answers)
        ts = time.time()
        # A job's world is not a label: the highest rank seen on any node stands for it.
        worlds: dict[str, int] = {}
        for node in nodes.values():
            for job, ranks in node.jobs.items():
                worlds[job] = max(worlds.get(job, 0), max(ranks) + 1)
        for name, node in nodes.items():
            self._emit(name, node, ts, worlds)
        for target, state in self.cluster.nodes.items():
            if target not in nodes and state.status == "up":
                self.cluster.mark_stale(target, "no series for this node in Prometheus")
        if with_budget:
            self._last_budget = now
            self.cluster.apply_budget(_budget(answers, self.options.slo_hours))

    # -- answers to nodes -----------------------------------------------------------

    def _assemble(self, a: dict[str, Series]) -> dict[str, _Node]:
        nodes: dict[str, _Node] = {}

        def node(labels: dict[str, str]) -> _Node | None:
            name = q.node_of(labels)
            if name is None:
                return None
            n = nodes.get(name)
            if n is None:
                n = nodes[name] = _Node(name)
            return n

        for source, table in (("dcgm", q.DCGM_GPU), ("gpu", q.TUIMON_GPU)):
            for labels, value in a.get(source, []):
                n = node(labels)
                index = _int(labels.get("gpu"))
                metric = labels.get("__name__", "")
                if n is None or index is None or metric not in table:
                    continue
                key, scale = table[metric]
                n.gpus.setdefault(index, {})[key] = value * scale
                info = n.gpu_info.setdefault(index, {})
                info.setdefault("uuid", labels.get("uuid") or labels.get("UUID"))
                info.setdefault("name", labels.get("modelName") or labels.get("name"))
                info.setdefault("pci_bus_id", labels.get("pci_bus_id"))
        for labels, _ in a.get("clock_events", []):
            n, index = node(labels), _int(labels.get("gpu"))
            if n is not None and index is not None and labels.get("reason"):
                n.gpus.setdefault(index, {}).setdefault("clock_events", []).append(
                    labels["reason"])
        for labels, value in a.get("host", []):
            n = node(labels)
            metric = labels.get("__name__", "")
            if n is not None and metric in q.TUIMON_HOST:
                key, scale = q.TUIMON_HOST[metric]
                n.host.setdefault(key, value * scale)
        for labels, value in a.get("host_cpu", []):
            n = node(labels)
            if n is not None:
                n.host.setdefault("cpu_util", min(1.0, max(0.0, value)))
        self._ports(a, node)
        self._storage(a, node)
        for key in ("wall", "compute", "samples", "steps"):
            for labels, value in a.get(f"job_{key}", []):
                n, rank = node(labels), _int(labels.get("rank"))
                job = labels.get("exported_job") or labels.get("job")
                if n is not None and rank is not None and job:
                    n.jobs.setdefault(job, {}).setdefault(rank, {})[key] = value
        return nodes

    def _ports(self, a: dict[str, Series], node: Callable[[dict[str, str]], _Node | None]) -> None:
        def port(labels: dict[str, str]) -> dict[str, Any] | None:
            n = node(labels)
            if n is None or not labels.get("device") or not labels.get("port"):
                return None
            pid = f"{labels['device']}:{labels['port']}"
            return n.ports.setdefault(pid, {"id": pid})

        for labels, value in a.get("port_gauges", []):
            p = port(labels)
            key = q.PORT_GAUGES.get(labels.get("__name__", ""))
            if p is not None and key:
                p[key] = value
        for answer, key in (("ib_tx", "tx_bytes_s"), ("ib_rx", "rx_bytes_s"),
                            ("ib_wait", "xmit_wait_s")):
            for labels, value in a.get(answer, []):
                p = port(labels)
                if p is not None:
                    p[key] = value
        for labels, value in a.get("ib_errors", []):
            p = port(labels)
            if p is not None and value > 0:
                p["errors_inc"] = {"symbol_errors": round(value)}

    def _storage(self, a: dict[str, Series],
                 node: Callable[[dict[str, str]], _Node | None]) -> None:
        for answer, key in (("fs_read", "read_bytes_s"), ("fs_write", "write_bytes_s")):
            for labels, value in a.get(answer, []):
                n = node(labels)
                mount = labels.get("mount") or labels.get("export")
                if n is not None and mount:
                    fs = n.filesystems.setdefault(mount, {
                        "id": mount, "fstype": labels.get("fstype") or "nfs"})
                    fs[key] = value
        for answer, key in (("disk_read", "read_bytes_s"), ("disk_write", "write_bytes_s")):
            for labels, value in a.get(answer, []):
                n = node(labels)
                if n is not None and labels.get("device"):
                    n.disks.setdefault(labels["device"], {"id": labels["device"],
                                                          "kind": "disk"})[key] = value

    # -- nodes to frames ------------------------------------------------------------

    def _emit(self, name: str, n: _Node, ts: float, worlds: dict[str, int]) -> None:
        indices = sorted(n.gpus)
        gpus_info = []
        gpus = []
        for i in indices:
            raw = n.gpus[i]
            info = n.gpu_info.get(i, {})
            if "mem_total" not in raw and "_fb_free" in raw and "mem_used" in raw:
                raw["mem_total"] = raw["mem_used"] + raw["_fb_free"]
            if "_throttle_bits" in raw and "clock_events" not in raw:
                bits = int(raw["_throttle_bits"])
                raw["clock_events"] = [v for b, v in q.THROTTLE_BITS.items() if bits & b]
            if raw.get("last_xid") == 0:
                raw["last_xid"] = None  # dcgm-exporter's 0 is "no XID"
            gpu = {k: _as(_GPU_KIND[k], v) for k, v in raw.items() if k in _GPU_KIND}
            if raw.get("_up") == 0:
                gpu = {"failed": "reported down by the agent (tuimon_gpu_up = 0)"}
            gpus.append(gpu)
            gpus_info.append(GpuInfo(index=i, uuid=info.get("uuid"), name=info.get("name"),
                                     mem_total=_as("int", raw.get("mem_total")),
                                     power_limit=raw.get("power_limit"),
                                     pci_bus_id=info.get("pci_bus_id"),
                                     max_sm_clock=raw.get("_max_sm_clock"),
                                     max_mem_clock=None))
        ports = []
        for p in n.ports.values():
            rate = p.get("rate")
            out = {k: v for k, v in p.items() if k != "phys_state" or v is not None}
            for side in ("tx", "rx"):
                if rate and p.get(f"{side}_bytes_s") is not None:
                    out[f"{side}_util"] = p[f"{side}_bytes_s"] / rate
            for k in ("state", "phys_state"):
                if k in out:
                    out[k] = int(out[k])
            out.pop("rate", None)
            ports.append(out)
        inventory = (tuple((g.index, g.uuid, g.name) for g in gpus_info),
                     tuple(sorted(n.ports)), tuple(sorted(n.filesystems)), tuple(sorted(n.disks)))
        target = name
        if self._inventory.get(target) != inventory:
            self._inventory[target] = inventory
            hello = Hello(node=name, agent_version=f"prometheus via tuimon {__version__}",
                          boot_id=None, interval=self.options.every, ts=ts, gpus=gpus_info,
                          families=["gpu", "host", "fabric", "storage", "steps"],
                          gpu_status=None if gpus_info else "no GPU series in Prometheus",
                          extra={"ports": [{"id": p["id"], "rate": p.get("rate")}
                                           for p in n.ports.values()],
                                 "filesystems": [{"id": f["id"], "fstype": f["fstype"]}
                                                 for f in n.filesystems.values()],
                                 "disks": [{"id": d, "kind": "disk"} for d in n.disks]})
            self._deliver(target, encode(hello))
        self._seq += 1
        extra: dict[str, Any] = {}
        if ports:
            extra["fabric"] = {"ports": ports, "nics": []}
        if n.filesystems or n.disks:
            extra["storage"] = {"filesystems": list(n.filesystems.values()),
                                "disks": list(n.disks.values())}
        if n.jobs:
            dt = self.options.every  # rates over the refresh interval, as sums per sample
            extra["steps"] = {"jobs": [
                {"id": job, "world": worlds.get(job, 1),
                 "ranks": [{"rank": r, "steps": max(1, round(v.get("steps", 0) * dt)),
                            "wall": v.get("wall", 0.0) * dt,
                            "compute": min(v.get("compute", 0.0), v.get("wall", 0.0)) * dt,
                            "samples": round(v.get("samples", 0.0) * dt)}
                           for r, v in sorted(ranks.items()) if v.get("wall", 0.0) > 0]}
                for job, ranks in n.jobs.items()], "received": 0, "rejected": 0}
        host = {k: _as(_HOST_KIND[k], v) for k, v in n.host.items() if k in _HOST_KIND}
        sample = Sample(seq=self._seq, ts=ts, interval=self.options.every, gpus=gpus,
                        host=host, extra=extra)
        self._deliver(target, encode(sample))

    def _deliver(self, target: str, data: bytes) -> None:
        if self.options.recorder is not None:
            self.options.recorder(target, data)
        try:
            message = decode(data)
        except ProtocolError as exc:
            log.warning("prometheus data for %s refused: %s", target, exc.reason)
            self.cluster.note_protocol_error(target, exc.reason)
            return
        self.cluster.apply_message(target, message, data)


def _budget(a: dict[str, Series], window_hours: float) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}

    def entry(labels: dict[str, str]) -> dict[str, Any] | None:
        job = labels.get("exported_job") or labels.get("job")
        if not job:
            return None
        return out.setdefault(job, {"window_h": window_hours, "error_ratio": {},
                                    "source": "prometheus"})

    for labels, value in a.get("budget_total", []):
        e = entry(labels)
        if e is not None:
            e["observed_h"] = value
    for labels, value in a.get("budget_effective", []):
        e = entry(labels)
        if e is not None and "observed_h" in e:
            e["consumed_h"] = max(0.0, e["observed_h"] - value)
    for w in ("5m", "30m", "1h", "6h", "1d", "3d"):
        for labels, value in a.get(f"ratio_{w}", []):
            e = entry(labels)
            if e is not None:
                e["error_ratio"][w] = min(1.0, max(0.0, value))
    return out


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _as(kind: str, v: Any) -> Any:
    if v is None:
        return None
    if kind == "int":
        return round(v) if isinstance(v, (int, float)) and v >= 0 else None
    return v


@contextlib.asynccontextmanager
async def prom_watching(url: str, cluster: ClusterState,
                        options: PromOptions | None = None) -> AsyncIterator[PromSource]:
    """Refresh the cluster from Prometheus for the life of the block (as `watching()`
    does for agents), then cancel and await the refresh task."""
    async with aiohttp.ClientSession() as session:
        source = PromSource(url, cluster, session, options)
        task = asyncio.create_task(source.run(), name="tuimon-prometheus")
        try:
            yield source
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
