"""Nodes -> the frames an agent would send: a `hello` where what a node is changed, a
`sample` with its GPUs, host, ports, file systems and jobs' steps (whole steps, the
fraction carried; the node's windows and its efficiency drop judged by the agent's own
rule). Pure: no HTTP, no model. Also the budget entries from the job counters over the
SLO window, as the relay's ledger sends them."""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from tuimon.model.slo import BURN_WINDOWS_S
from tuimon.sources import prom_queries as q
from tuimon.sources.prom_answers import Series
from tuimon.sources.prom_assembly import Node
from tuimon.sources.prom_values import as_field, whole
from tuimon_core.efficiency_drop import LONG_S, SHORT_S, DropJudge, judge_windows
from tuimon_core.protocol import GpuInfo, Hello, Sample
from tuimon_core.protocol.fields import (
    GPU_FIELDS,
    GPU_UP_METRIC,
    HOST_FIELDS,
    PORT_PHYS_STATES,
    PORT_STATES,
    link_util,
)
from tuimon_core.version import __version__
from tuimon_core.wait_kinds import rank_kind, split_wait

# Each field's type, by key: a series' value is made what its field holds (whole numbers
# where the field is an Int, within its bounds) before the frame goes to the decoder.
_GPU_KIND = {f.key: f.type for f in GPU_FIELDS}
_HOST_KIND = {f.key: f.type for f in HOST_FIELDS}
_UTIL_KEYS = (("tx_bytes_s", "tx_util"), ("rx_bytes_s", "rx_util"))

# Each node's last hour (JOB_HOUR) stands for this many budget intervals after its read;
# older (its queries failing since), no node's windows are sent.
HOUR_FRESH_EVERY = 3

_ACTIVITY = ("gr_active", "sm_active", "tensor_active", "dram_active")
# Values each MIG instance repeats for the whole GPU: taken once.
_WHOLE_GPU = ("power", "power_limit", "energy", "temp", "sm_clock", "mem_clock", "pstate",
              "last_xid", "_throttle_bits", "ecc_corrected", "ecc_uncorrected",
              "remapped_rows", "remap_failed", "remap_pending")
_SLICES = re.compile(r"(\d+)g\.")
_NONE: dict[str, Any] = {}  # a GPU the inventory has not named (read, never written)


class FrameMaker:
    """What the frames need from one refresh to the next: each node's hello as last
    said, its sample as last sent, the fraction of a step each rank's rates counted and
    not sent yet, each node's last hour, and the drop judge of each node and job (as
    its agent would keep them). `clock` arguments are monotonic seconds; `ts` Unix."""

    def __init__(self, every: float = 5.0, budget_every: float = 30.0) -> None:
        self.every = every
        self.budget_every = budget_every
        self._seq = 0
        self._said: dict[str, tuple[Any, ...]] = {}  # node -> what its last hello said
        self._sent: dict[str, Node] = {}  # each node as last sent (unchanged)
        # node -> (job, rank) -> the fraction of a step its rates counted, not yet sent
        self._step_carry: dict[str, dict[tuple[str, int], float]] = {}
        self.hours: dict[str, dict[str, dict[str, Any]]] = {}
        self.hours_at: float | None = None
        self._drops: dict[tuple[str, str], DropJudge] = {}

    @property
    def sent_names(self) -> list[str]:
        return list(self._sent)

    def set_hours(self, hours: dict[str, dict[str, dict[str, Any]]], clock: float) -> None:
        """Each node's last hour of each job, as the last read that answered both wall
        and compute found them."""
        self.hours, self.hours_at = hours, clock
        for gone in [k for k in self._drops if k[1] not in hours.get(k[0], ())]:
            del self._drops[gone]  # a job gone from the node: its judge with it

    def unchanged(self, name: str, node: Node, held: bool) -> bool:
        """Is this node as it was sent last, where the viewer `held` its whole sample
        (up, its detail kept)? The server has scraped it no newer since (a scrape every
        15 or 30 s, a refresh every 5 s): sending the same values again would cost the
        viewer a sample's work and say nothing. A node with jobs is sent every refresh
        (its steps are counted per refresh), and so is one with new port errors."""
        if any("errors_inc" in p for p in node.ports.values()):
            return False  # new errors, even as many as the last time
        return not node.jobs and held and self._sent.get(name) == node

    def keep_only(self, names: Collection[str]) -> None:
        """Forget what was sent of nodes no longer named."""
        self._sent = {name: n for name, n in self._sent.items() if name in names}
        self._step_carry = {name: c for name, c in self._step_carry.items() if name in names}

    def frames(self, name: str, n: Node, ts: float, worlds: dict[str, int], gap: float,
               clock: float) -> list[Hello | Sample]:
        """The node's frames now (a hello first where what it is changed); `gap`: the
        seconds its jobs' rates are summed over (since the refresh before)."""
        out: list[Hello | Sample] = []
        indices = sorted(n.gpus)
        facts = []  # each GPU's index, inventory and values: its GpuInfo where it changed
        gpus = []
        kinds = _GPU_KIND
        for i in indices:
            # Read, not changed: the node stays as the server gave it, to compare with
            # the next (a MIG parent is a new map).
            raw = mig_parent(n.gpus[i], n.mig[i]) if i in n.mig else n.gpus[i]
            info = n.gpu_info.get(i, _NONE)
            gpu = {k: as_field(kinds[k], v) for k, v in raw.items() if k in kinds}
            if "mem_total" not in raw and "_fb_free" in raw and "mem_used" in raw:
                gpu["mem_total"] = as_field(kinds["mem_total"], raw["mem_used"] + raw[
                    "_fb_free"] + raw.get("mem_reserved", 0))
            if "_throttle_bits" in raw and "clock_events" not in raw:
                bits = int(raw["_throttle_bits"])
                gpu["clock_events"] = as_field(kinds["clock_events"], [
                    v for b, v in q.THROTTLE_BITS.items() if bits & b])
            if raw.get("last_xid") == 0:
                gpu["last_xid"] = None  # dcgm-exporter's 0 is "no XID"
            facts.append((i, info, raw, gpu.get("mem_total")))
            if raw.get("_up") == 0:
                gpu = {"failed": f"reported down by the agent ({GPU_UP_METRIC} = 0)"}
            gpus.append(gpu)
        ports = []
        for p in n.ports.values():
            port = dict(p)
            rate = port.pop("rate", None)
            if rate:
                for read, util_key in _UTIL_KEYS:
                    util = link_util(p.get(read), rate)
                    if util is not None:  # at most 1, as the agent says it
                        port[util_key] = util
            if "state" in port:  # named as the agent names it from sysfs
                state = port["state"] = int(port["state"])
                if "state_name" not in port:
                    port["state_name"] = PORT_STATES.get(state, str(state))
            if "phys_state" in port:
                if port["phys_state"] is None:
                    del port["phys_state"]
                else:
                    state = port["phys_state"] = int(port["phys_state"])
                    if "phys_state_name" not in port:
                        port["phys_state_name"] = PORT_PHYS_STATES.get(state, str(state))
            ports.append(port)
        said = (tuple((i, info.get("uuid"), info.get("name"), raw.get("power_limit"),
                       raw.get("_max_sm_clock")) for i, info, raw, _ in facts),
                tuple(sorted((pid, p.get("rate")) for pid, p in n.ports.items())),
                tuple(sorted((f["id"], f["fstype"]) for f in n.filesystems.values())),
                tuple(sorted(n.disks)))
        if self._said.get(name) != said:
            self._said[name] = said
            gpus_info = [GpuInfo(index=i, uuid=info.get("uuid"), name=info.get("name"),
                                 mem_total=mem_total, power_limit=raw.get("power_limit"),
                                 pci_bus_id=info.get("pci_bus_id"),
                                 max_sm_clock=raw.get("_max_sm_clock"), max_mem_clock=None)
                         for i, info, raw, mem_total in facts]
            out.append(Hello(
                node=name, agent_version=f"prometheus via tuimon {__version__}",
                boot_id=None, interval=self.every, ts=ts, gpus=gpus_info,
                families=["gpu", "host", "fabric", "storage", "steps"],
                # No GPU series is not a failure: the host may have none.
                gpu_status=None,
                extra={"ports": [{"id": p["id"], "rate": p.get("rate")}
                                 for p in n.ports.values()],
                       "filesystems": [{"id": f["id"], "fstype": f["fstype"],
                                        "source": f.get("source")}
                                       for f in n.filesystems.values()],
                       "disks": [{"id": d, "kind": "disk"} for d in n.disks]}))
        self._seq += 1
        extra: dict[str, Any] = {}
        if ports:
            extra["fabric"] = {"ports": ports, "nics": []}
        if n.filesystems or n.disks:
            # Copies: the check cleans a hostile name in place, and the node is kept as
            # the server gave it, to compare with the next (unchanged).
            extra["storage"] = {"filesystems": [dict(f) for f in n.filesystems.values()],
                                "disks": [dict(d) for d in n.disks.values()]}
        if n.jobs:
            carry = self._step_carry.get(name, {})
            kept: dict[tuple[str, int], float] = {}
            extra["steps"] = {"jobs": [
                {"id": job, "world": worlds.get(job, 1),
                 "ranks": _ranks(job, ranks, carry, kept, gap),
                 **self._windows(name, job, ranks, ts, clock)}
                for job, ranks in n.jobs.items()], "received": 0, "rejected": 0}
            self._step_carry[name] = kept
        host = {k: as_field(_HOST_KIND[k], v) for k, v in n.host.items() if k in _HOST_KIND}
        out.append(Sample(seq=self._seq, ts=ts, interval=self.every, gpus=gpus, host=host,
                          extra=extra))
        self._sent[name] = n
        return out

    def _windows(self, name: str, job: str, ranks: dict[int, dict[str, float]],
                 now: float, clock: float) -> dict[str, Any]:
        """The node's `windows` of the job and its `drop`, as its agent sends them: the
        last minute from the live rates over [1m] (taken as the whole minute), the last
        hour from JOB_HOUR (covering the run time its ranks counted in it), once read;
        the drop judged from both."""
        at = self.hours_at
        if not ranks or at is None or clock - at > HOUR_FRESH_EVERY * self.budget_every:
            return {}  # no hour known lately: no windows, the viewer judges its own
        minute: dict[str, Any] = {"s": SHORT_S, "covered": SHORT_S, "wall": 0.0,
                                  "compute": 0.0, "samples": 0, "waits": {}}
        for v in ranks.values():
            wall = v.get("wall", 0.0) * SHORT_S
            minute["wall"] += wall
            minute["compute"] += min(v.get("compute", 0.0) * SHORT_S, wall)
            minute["samples"] += whole(v.get("samples", 0.0) * SHORT_S) or 0
            for k, w in v.items():
                if k.startswith("wait:"):
                    minute["waits"][k[5:]] = minute["waits"].get(k[5:], 0.0) + w * SHORT_S
        hour = self.hours.get(name, {}).get(job)
        if hour is None:  # too young for an increase over the hour: the viewer judges
            return {}
        wall = max(0.0, hour.get("wall", 0.0))
        long = {"s": LONG_S, "covered": min(LONG_S, wall / len(ranks)), "wall": wall,
                "compute": min(max(0.0, hour.get("compute", 0.0)), wall),
                "samples": whole(max(0.0, hour.get("samples", 0.0))) or 0,
                "waits": {k: w for k, w in hour["waits"].items() if w > 0}}
        judge = self._drops.get((name, job))
        if judge is None:
            judge = self._drops[(name, job)] = DropJudge()
        drop = judge_windows(judge, minute, long, now)
        return {"windows": [minute, long], **({"drop": drop} if drop else {})}


def _ranks(job: str, ranks: dict[int, dict[str, float]],
           carry: dict[tuple[str, int], float], kept: dict[tuple[str, int], float],
           dt: float) -> list[dict[str, Any]]:
    """The ranks' sums over the last `dt` seconds, from their rates: whole steps (the
    fraction carried to the next refresh) and the time those steps took, so that a
    rank's compute per step is its counters' (compute rate over step rate), not a
    second's compute over a step rounded up: 0.67 s where a step computes 1.40 s.
    A rank without a step counter is credited the time since the last refresh as one
    step."""
    out = []
    for r, v in sorted(ranks.items()):
        if v.get("wall", 0.0) <= 0:
            continue
        rate = v.get("steps", 0.0)
        if rate > 0:
            counted = carry.get((job, r), 0.0) + rate * dt
            steps = min(int(counted), 1 << 30)
            kept[(job, r)] = counted - steps
            # Less than a step since: its time comes with the next (the rank still
            # reports, and its node still speaks for the job's windows).
            span = steps / rate
        else:
            steps, span = 1, dt
        out.append({"rank": r, "steps": steps, "wall": v["wall"] * span,
                    "compute": min(v.get("compute", 0.0), v["wall"]) * span,
                    "samples": whole(v.get("samples", 0.0) * span),
                    "waits": {k[5:]: w * span for k, w in v.items()
                              if k.startswith("wait:")}})
    return out


def mig_parent(raw: dict[str, Any], instances: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """A GPU in MIG mode from its instances' series: memory summed, the whole GPU's values
    once, activity weighted by each instance's share of the GPU (its slices)."""
    out = dict(raw)
    out["mig_mode"] = 1
    mig = []
    weights = 0.0
    activity: dict[str, float] = {}
    used: float | None = None  # None: no instance's memory used was asked
    total = 0.0
    for gi, v in sorted(instances.items()):
        match = _SLICES.match(v.get("profile") or "")
        slices = float(match.group(1)) if match else 1.0
        inst_used = v.get("mem_used")
        inst_total = v.get("mem_total")
        if inst_total is None and inst_used is not None and v.get("_fb_free") is not None:
            inst_total = inst_used + v["_fb_free"] + v.get("mem_reserved", 0.0)
        if inst_used is not None:
            used = (used or 0.0) + inst_used
        total += inst_total or 0.0
        entry = {"gi": gi, "ci": None, "profile": v.get("profile"),
                 "mem_used": whole(inst_used), "mem_total": whole(inst_total)}
        for key in _ACTIVITY:
            if v.get(key) is not None:
                entry[key] = v[key]
                activity[key] = activity.get(key, 0.0) + v[key] * slices
        weights += slices
        mig.append(entry)
        for key in _WHOLE_GPU:
            if v.get(key) is not None:
                out[key] = max(out.get(key, v[key]), v[key])
    out["mig"] = mig
    if used is not None:
        out["mem_used"] = used
    if total:
        out["mem_total"] = max(total, out.get("mem_total") or 0.0)
    if used is not None or total:
        out.pop("_fb_free", None)
    for key, weighted in activity.items():
        out.setdefault(key, weighted / weights)
    return out


def budget(a: dict[str, Series], window_hours: float) -> dict[str, dict[str, Any]]:
    """Each job's budget entry from the budget queries' answers."""
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
    for labels, value in a.get("budget_waits", []):
        e = entry(labels)
        kind = labels.get("kind")
        if e is not None and kind and value > 0:
            spent = e.setdefault("spent_h", {})
            spent[rank_kind(kind)] = spent.get(rank_kind(kind), 0.0) + value
    for e in out.values():  # as the ledger: shares of the hours lost, the rest `other`
        if "consumed_h" in e:
            e["spent_h"] = split_wait(e.get("spent_h"), e["consumed_h"])
    for w in BURN_WINDOWS_S:
        for labels, value in a.get(f"ratio_{w}", []):
            e = entry(labels)
            if e is not None:
                e["error_ratio"][w] = min(1.0, max(0.0, value))
    return out
