"""Diagnosis: what is wrong right now, where, and how bad, from the latest state.

Each rule names the node, GPU, port, leaf switch or file system at fault. An efficiency
drop (10 points below its 1 h level) comes with the concurrent signals ranked as likely
causes. Rules read the model only; the app shows the findings above the events.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass

from tuimon.model.cluster import ClusterState
from tuimon.model.efficiency import EfficiencyView
from tuimon.model.storage import StorageView

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
CRITICAL_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})
FLAP_WINDOW_S = 600.0
CONGESTED_WAIT = 1e4  # xmit_wait ticks/s: sustained above this, senders starve
DROP_POINTS = 0.10


@dataclass(frozen=True, slots=True)
class Finding:
    severity: str  # critical | warning | info
    kind: str  # straggler, thermal, power, xid, ecc, remap, link_down, flapping, ...
    where: str  # "gpu012 GPU 3", "gpu012 mlx5_2:1", "leaf03", "/lustre/scratch"
    message: str
    score: float = 0.0  # how strongly it explains an efficiency drop


class Diagnosis:
    def __init__(self, topology: dict[str, str] | None = None,
                 wall=time.time) -> None:  # type: ignore[no-untyped-def]
        self.topology = dict(topology or {})
        self.findings: list[Finding] = []
        self._downs: dict[str, deque[float]] = {}
        self._wall = wall

    def update(self, cluster: ClusterState, eff: EfficiencyView,
               storage: StorageView) -> list[Finding]:
        now = self._wall()
        out: list[Finding] = []
        out += self._nodes(cluster)
        out += self._gpus(cluster)
        out += self._ports(cluster, now)
        out += self._congestion(cluster)
        out += self._storage(cluster, storage)
        out += self._stragglers(eff)
        out += self._efficiency(eff, out, now)
        out.sort(key=lambda f: (SEVERITY_ORDER.get(f.severity, 3), -f.score, f.where))
        self.findings = out
        return out

    # -- rules -------------------------------------------------------------------------

    def _nodes(self, cluster: ClusterState) -> list[Finding]:
        return [Finding("critical", "node_lost", n.name,
                        f"{n.name} {n.status}: {n.reason or 'no frames'}", 0.5)
                for n in cluster.nodes.values() if n.status in ("stale", "down")]

    def _gpus(self, cluster: ClusterState) -> list[Finding]:
        out = []
        for n in cluster.nodes.values():
            if n.status != "up":
                continue
            capped = []
            for i, g in enumerate(n.gpu_values()):
                where = f"{n.name} GPU {i}"
                if g.get("failed"):
                    out.append(Finding("critical", "gpu_failed", where,
                                       f"{where} failed: {g['failed']}", 0.6))
                    continue
                events = set(g.get("clock_events") or ())
                if events & {"hw_thermal_slowdown", "sw_thermal_slowdown"}:
                    out.append(Finding("warning", "thermal", where,
                                       f"{where} thermal throttling at {g.get('temp') or 0:.0f} °C",
                                       0.4))
                elif events & {"sw_power_cap", "hw_power_brake_slowdown", "hw_slowdown"}:
                    capped.append((i, ", ".join(sorted(events - {"gpu_idle"}))))
                xid = g.get("last_xid")
                if xid:
                    sev = "critical" if xid in CRITICAL_XIDS else "warning"
                    out.append(Finding(sev, "xid", where,
                                       f"{where} XID {xid} ({g.get('xid_total') or 1} seen)",
                                       0.3))
                if (g.get("ecc_uncorrected") or 0) > 0:
                    out.append(Finding("critical", "ecc", where, f"{where} "
                                       f"{g['ecc_uncorrected']} uncorrected ECC errors", 0.3))
                if g.get("remap_failed"):
                    out.append(Finding("critical", "remap", where,
                                       f"{where} row remapping failed: drain and reset", 0.3))
            if capped:  # one finding per node: a power cap is usually the node's, not a GPU's
                gpus = ",".join(str(i) for i, _ in capped)
                out.append(Finding("info", "power", f"{n.name} GPU {gpus}",
                                   f"{n.name} GPU {gpus} power-capped ({capped[0][1]})", 0.2))
        return out

    def _ports(self, cluster: ClusterState, now: float) -> list[Finding]:
        out = []
        for n in cluster.nodes.values():
            if n.status != "up" or n.sample is None:
                continue
            for p in (n.sample.extra.get("fabric") or {}).get("ports") or []:
                where = f"{n.name} {p['id']}"
                inc = p.get("errors_inc") or {}
                downs = self._downs.setdefault(where, deque())
                if inc.get("link_downed"):
                    downs.extend([now] * int(inc["link_downed"]))
                while downs and downs[0] < now - FLAP_WINDOW_S:
                    downs.popleft()
                if p.get("state") not in (None, 4):
                    out.append(Finding("critical", "link_down", where,
                                       f"{where} link {p.get('state_name') or 'down'}", 0.8))
                elif len(downs) >= 2:
                    out.append(Finding("warning", "flapping", where, f"{where} link went "
                                       f"down {len(downs)} times in 10 min", 0.6))
                if inc.get("symbol_errors"):
                    out.append(Finding("warning", "symbol_errors", where,
                                       f"{where} +{inc['symbol_errors']} symbol errors "
                                       "(cable or transceiver)", 0.4))
        return out

    def _congestion(self, cluster: ClusterState) -> list[Finding]:
        per_leaf: dict[str, list[float]] = {}
        for n in cluster.nodes.values():
            if n.status != "up" or n.sample is None:
                continue
            waits = [p["xmit_wait_s"] for p in (n.sample.extra.get("fabric") or {}).get(
                "ports") or [] if p.get("xmit_wait_s") is not None]
            if waits:
                per_leaf.setdefault(self.topology.get(n.name, "all nodes"), []).append(
                    statistics.median(waits))
        if not per_leaf:
            return []
        medians = {leaf: statistics.median(v) for leaf, v in per_leaf.items()}
        hot = {leaf: m for leaf, m in medians.items() if m >= CONGESTED_WAIT}
        if not hot:
            return []
        if len(medians) > 1 and len(hot) == len(medians):
            return [Finding("warning", "congestion", "spine", "congestion under every leaf: "
                            "look at the spine or the job's traffic pattern", 0.9)]
        out = []
        for leaf, m in sorted(hot.items(), key=lambda x: -x[1]):
            others = [v for k, v in medians.items() if k != leaf]
            base = statistics.median(others) if others else 0.0
            if not others or m >= 10 * max(base, 1.0):
                out.append(Finding("warning", "congestion", leaf,
                                   f"congestion concentrated under {leaf}: xmit_wait "
                                   f"{m:,.0f}/s vs {base:,.0f}/s elsewhere "
                                   f"({len(per_leaf[leaf])} nodes)", 1.0))
        return out

    def _storage(self, cluster: ClusterState, storage: StorageView) -> list[Finding]:
        out = []
        for mount, fs in storage.filesystems.items():
            prov = storage.provisioned.get(mount)
            if prov and fs.read + fs.write >= 0.9 * prov:
                out.append(Finding("warning", "storage", mount,
                                   f"{mount} at {100 * (fs.read + fs.write) / prov:.0f}% of its "
                                   "provisioned throughput", 0.7))
        slow: dict[str, list[float]] = {}
        for n in cluster.nodes.values():
            if n.status != "up" or n.sample is None:
                continue
            for f in (n.sample.extra.get("storage") or {}).get("filesystems") or []:
                lat = (f.get("latency") or {}).get("READ")
                if lat is not None:
                    slow.setdefault(f["id"], []).append(lat)
        for mount, lats in slow.items():
            m = statistics.median(lats)
            if m > 0.05:
                out.append(Finding("warning", "storage_latency", mount,
                                   f"{mount} NFS reads take {m * 1000:.0f} ms", 0.5))
        return out

    def _stragglers(self, eff: EfficiencyView) -> list[Finding]:
        out = []
        for job in eff.jobs.values():
            for s in job.stragglers:
                where = f"{s.node} GPU {s.gpu}" if s.gpu is not None else s.node
                out.append(Finding("warning", "straggler", where,
                                   f"{where} (rank {s.rank} of {job.job}) computes "
                                   f"x{s.ratio:.2f} the median of its peers", 0.7))
        return out

    def _efficiency(self, eff: EfficiencyView, signals: list[Finding],
                    now: float) -> list[Finding]:
        out = []
        now = eff.now  # the agents' clock, as the efficiency windows use
        for job in eff.jobs.values():
            for severity, long_w, short_w, threshold in (job.burn.firing(now)
                                                         if job.burn else []):
                rate = job.burn.burn_rates(now)[long_w] or 0.0
                out.append(Finding("critical" if severity == "page" else "warning",
                                   f"burn_{severity}", job.job,
                                   f"{job.job} burns its error budget at {rate:.1f}x over "
                                   f"{long_w} and {short_w} (threshold {threshold:.1f}x, "
                                   f"{severity})", 0.0))
                break  # the most urgent condition is enough
            short, _ = job.window(60, now)
            long, _ = job.window(3600, now)
            if short is None or long is None or long - short < DROP_POINTS:
                continue
            causes = sorted((f for f in signals if f.score > 0), key=lambda f: -f.score)[:3]
            because = "; likely: " + " > ".join(f"{c.kind} {c.where}" for c in causes) \
                if causes else ""
            out.append(Finding("critical", "efficiency_drop", job.job,
                               f"{job.job} SLI {short:.2f} vs {long:.2f} over 1 h{because}",
                               0.0))
        return out
