"""The PromQL a Prometheus source runs, and how each result maps onto protocol fields.

A fixed set of instant queries per refresh, whatever the node count: each query selects
a family of series for every node at once (a `__name__` regex, or one `rate()` with the
agent's and node_exporter's names joined by `or`), aggregated (`max by`) down to the
labels that say whose a series is (prom_nodes.identity_labels) and which GPU or port:
an exporter's other labels (driver version, process name, device, ...) are never
transferred. What is asked of every GPU is split by need:

- every refresh, every GPU: what the maps, the busy proxy and the node rules read
  (DENSE_GPU);
- every refresh, only GPUs with something to say: health counters and marks (`> 0`,
  SPARSE_GPU), as are the ports' errors and the failed scrapes (`up == 0`);
- every INVENTORY_EVERY_S, kept between: what changes rarely (SLOW_GPU, the GPUs' names
  and UUIDs, the ports' rates);
- the rest, only for the nodes whose screen is open (`detail_query`).

Three vocabularies are understood, all from the one name table
(tuimon_core.protocol.fields):

- tuimon's own agent metrics (labels `node`, `gpu`, `uuid`, ...; docs/metrics.md);
- NVIDIA dcgm-exporter 2.x to 4.x (`DCGM_FI_DEV_*`, `DCGM_FI_PROF_*`; labels `gpu`,
  `UUID`, `modelName`, `Hostname` or `hostname`, MIG's `GPU_I_ID` and `GPU_I_PROFILE`);
- node_exporter (`node_infiniband_*`, `node_disk_*`, `node_mountstats_nfs_*`,
  `node_filesystem_*`, `node_uname_info`, `node_cpu_seconds_total`, `node_memory_*`).

`{m}` in a template is replaced by the site's extra label matchers (`--match`), so one
Prometheus can hold several clusters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tuimon.model.slo import BURN_WINDOWS_S
from tuimon_core.filesystems import SHARED_FSTYPES
from tuimon_core.heat_levels import BUSY_FIELDS
from tuimon_core.protocol.fields import (
    CLOCK_EVENT_REASONS,
    DISK_COUNTERS_READ,
    FS_COUNTERS_READ,
    GPU_FIELDS,
    GPU_INFO_METRIC,
    GPU_UP_METRIC,
    HOST_FIELDS,
    MIB,
    PORT_COUNTERS_READ,
    PORT_ERROR_COUNTERS,
    PORT_GAUGE_METRICS,
    PORT_HEALTHY,
    PORT_UNREADABLE_METRIC,
    Counter,
)

# Prometheus name -> (wire key, factor to the wire's unit, added to the others)
Mapping = dict[str, tuple[str, float, bool]]

# dcgm-exporter has no total memory before 3.x's FB_TOTAL, and not always then: used +
# free + reserved (where given), once a minute, as a series of this name
# (FB_TOTAL_QUERY, below).
FB_TOTAL = "tuimon:dcgm_fb_total"

TUIMON_GPU: Mapping = {f.exposed: (f.key, 1.0, False) for f in GPU_FIELDS if f.exposed}
TUIMON_GPU.update({GPU_UP_METRIC: ("_up", 1.0, False),
                   GPU_INFO_METRIC["max_sm_clock"]: ("_max_sm_clock", 1.0, False)})
DCGM_GPU: Mapping = {d.name: (f.key, d.scale, d.add) for f in GPU_FIELDS for d in f.dcgm}
DCGM_GPU.update({
    "DCGM_FI_DEV_FB_FREE": ("_fb_free", MIB, False),
    # The clock-event (throttle) bit mask; renamed in DCGM 3.
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("_throttle_bits", 1.0, False),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("_throttle_bits", 1.0, False),
})
# Which of several dcgm names for one field wins: the earlier in the table.
DCGM_RANK = {d.name: i for f in GPU_FIELDS for i, d in enumerate(f.dcgm)}
# Series the queries make (not an exporter's), read as dcgm-exporter's; the exporter's
# own total wins over the one made.
DCGM_MADE: Mapping = {FB_TOTAL: ("mem_total", MIB, False)}
DCGM_RANK[FB_TOTAL] = len(DCGM_RANK)
# Every GPU series by name: (wire key, factor, added, rank). Rank -1 is our agent's own
# name (it wins, and DCGM's blank marks do not apply); else DCGM_RANK's.
GPU_SERIES: dict[str, tuple[str, float, bool, int]] = {
    **{name: (*entry, -1) for name, entry in TUIMON_GPU.items()},
    **{name: (*entry, DCGM_RANK.get(name, 0)) for name, entry in {**DCGM_MADE,
                                                                  **DCGM_GPU}.items()},
}

HOST: Mapping = {f.exposed: (f.key, 1.0, False) for f in HOST_FIELDS if f.exposed}
HOST.update({f.node_exporter: (f.key, 1.0, False) for f in HOST_FIELDS if f.node_exporter})

PORT_GAUGES: dict[str, str] = {name: key for key, ours, theirs, _ in PORT_GAUGE_METRICS
                                for name in (ours, theirs)}
# Asked of every port with its error counters: where a port's state answers, its
# counters were read in the scrape the answer holds, so one absent from the answer is 0;
# where it does not (a failed scrape, a target gone: its series stale), they are
# unknown. (Not a counter: our agent leaves out one stuck at its maximum.) Name -> ours.
PORT_READ_SERIES: dict[str, bool] = {name: name == ours for key, ours, theirs, _
                                     in PORT_GAUGE_METRICS if key == "state"
                                     for name in (ours, theirs)}

# dcgm-exporter's clock-event (throttle) bit mask, as NVML names the bits.
THROTTLE_BITS = dict(CLOCK_EVENT_REASONS)

_COUNTER = {c.key: c for c in PORT_COUNTERS_READ}
# The port error counters, by either exporter's name: name -> (the wire's kind in
# `errors_inc`, whether the name is our agent's).
PORT_ERROR_SERIES: dict[str, tuple[str, bool]] = {
    **{c.metric + "_total": (c.key, True) for c in PORT_COUNTERS_READ if not c.rate},
    **{c.node_exporter: (c.key, False) for c in PORT_COUNTERS_READ
       if not c.rate and c.node_exporter},
}
# File systems worth showing from node_filesystem (capacity, and the mount point of an
# NFS export, which node_exporter's mountstats metrics do not carry).
# A regex in a PromQL string literal: `fuse\.weka`, its backslash escaped again.
SHARED_FSTYPES_RE = "|".join(re.escape(t).replace("\\", "\\\\") for t in sorted(SHARED_FSTYPES))


def _names(table: Iterable[str]) -> str:
    return "|".join(table)


# What every refresh asks of every GPU: what the node rules read (the agent's own up
# mark, the PCIe link now: it drops while idle, and the replay rule's limit follows
# it), how busy it is (BUSY, below: the efficiency strip reads it), and the maps' other
# cells (memory, temperature, power, clock)...
DENSE_GPU = frozenset({"mem_used", "temp", "power", "sm_clock", "_up", "pcie_gen",
                       "pcie_width"})
# ...of which these only while a map draws them (ClusterState.drawn, the metric on
# screen), or of a node whose screen is open (detail_query): under the busy map, a
# refresh asks one series of every GPU (how busy) where it asked five.
DRAWN_ONLY_GPU = frozenset({"mem_used", "power", "sm_clock", "temp"})
# A node whose GPUs answer none of what is asked now (MIG instances with no busy series,
# an exporter without utilization, one whose dcgm-exporter gives profiling fields only)
# is still there: told by one series a node of these fields, those of them not asked of
# every GPU now. The temperature is in every exporter's default counters read here (and
# our agent's); a profiling-only exporter without the busy fields (SM or engine active)
# still has the memory interface's or the tensor pipe's activity (a real mixed scrape:
# DCGM_FI_PROF_DRAM_ACTIVE alone). (Its GPUs are the inventory's.)
PRESENCE_GPU = ("temp", "dram_active", "tensor_active")


def dense_gpu(drawn: frozenset[str] | None) -> frozenset[str]:
    """The dense GPU fields a refresh asks, where the maps draw `drawn` (None: all)."""
    return DENSE_GPU if drawn is None else DENSE_GPU - (DRAWN_ONLY_GPU - drawn)


# The ports' traffic, likewise: asked only while a map draws the link utilization it
# makes, or while a node's screen is open (it shows its ports' rates; a port detail
# query of its own would need its exporter's labels). Live query -> the field it feeds.
DRAWN_ONLY_PORT = {"ib_tx": "tx_util", "ib_rx": "rx_util"}


def skipped(drawn: frozenset[str] | None, screen_open: bool) -> frozenset[str]:
    """The live queries a refresh leaves out, where the maps draw `drawn` (None: all)."""
    if drawn is None or screen_open:
        return frozenset()
    return frozenset(n for n, key in DRAWN_ONLY_PORT.items() if key not in drawn)


def unasked(dense: frozenset[str], skipped: frozenset[str]) -> frozenset[str]:
    """The sample fields a refresh that asked `dense` of every GPU and left out the
    live queries `skipped` did not ask: a map that draws one waits for the next."""
    return frozenset((DRAWN_ONLY_GPU - dense)
                     | {key for name, key in DRAWN_ONLY_PORT.items() if name in skipped})

# How busy a GPU is: the first of these it has (heat_levels.BUSY_FIELDS' order, as the
# maps and the busy proxy read it), one series a GPU.
BUSY = tuple(key for key, _ in BUSY_FIELDS)
# Health counters and marks: 0 on a healthy GPU, so only the others answer.
SPARSE_GPU = frozenset({"last_xid", "xid_total", "ecc_corrected", "ecc_uncorrected",
                        "retired_pages", "retired_pending", "remapped_rows", "remap_pending",
                        "remap_failed", "pcie_replays", "nvlink_replay_errors",
                        "nvlink_recovery_errors", "nvlink_crc_errors", "_throttle_bits"})
# What changes rarely: asked every INVENTORY_EVERY_S and kept between.
SLOW_GPU = frozenset({"mem_total", "mem_reserved", "power_limit", "pstate", "mem_clock",
                      "_max_sm_clock", "mig_mode"})
INVENTORY_EVERY_S = 60.0


def gpu_names(keys: Iterable[str] | None = None) -> list[str]:
    """The GPU series (ours and dcgm-exporter's) holding these wire keys (None: all)."""
    wanted = None if keys is None else set(keys)
    return [name for table in (TUIMON_GPU, DCGM_GPU) for name, (key, _, _) in table.items()
            if wanted is None or key in wanted]


# A GPU series keeps: its name, its GPU (and MIG instance), whose it is.
GPU_BY = "__name__, gpu, GPU_I_ID, GPU_I_PROFILE, {ids}"
# ...and for the inventory, what the GPU is.
INFO_BY = "gpu, GPU_I_ID, GPU_I_PROFILE, UUID, uuid, modelName, name, pci_bus_id, {ids}"
PORT_BY = "device, port, {ids}"


def gpus_query(keys: Iterable[str], after: str = "") -> str:
    """The template of one query for these GPU fields of every GPU, by name."""
    return ("max by (" + GPU_BY + ') ({{__name__=~"' + _names(gpu_names(keys)) + '"{m}}})'
            + after)


def _busy() -> str:
    """Each GPU's first busy measure: `or ignoring(__name__)` keeps a later one only for
    the GPUs without an earlier one."""
    return " or ignoring(__name__) ".join(f"({gpus_query([key])})" for key in BUSY)


FB_BY = "gpu, GPU_I_ID, GPU_I_PROFILE, {ids}"


def _fb(name: str) -> str:
    return f"max by ({FB_BY}) ({name}{{{{{{mm}}}}}})"


FB_TOTAL_QUERY = ("label_replace(" + _fb("DCGM_FI_DEV_FB_USED") + " + "
                  + _fb("DCGM_FI_DEV_FB_FREE") + " + (" + _fb("DCGM_FI_DEV_FB_RESERVED")
                  + " or " + _fb("DCGM_FI_DEV_FB_USED") + ' * 0), "__name__", "'
                  + FB_TOTAL + '", "", "")')


def _ports(query: str) -> str:
    return f"max by ({PORT_BY}) ({query})"


# Live rates from the last two scrapes (irate): a live view wants what happens now, and
# rate() over a range is an average that reads low for a minute after a series starts.
LIVE_RATE = "irate({sel}[1m])"


def _either(tuimon: str, node: str, how: str = LIVE_RATE) -> str:
    return f"{how.format(sel=tuimon)} or {how.format(sel=node)}"


def _counter(c: Counter) -> str:
    """A counter's live rate, by our agent's name or else node_exporter's."""
    return _either(c.metric + "_total{{{mm}}}", f"{c.node_exporter}{{{{{{mm}}}}}}")


def _nfs(kind: str) -> str:
    """NFS bytes through the page cache plus O_DIRECT bytes (which a training job's
    checkpoint writes often are), per mount as node_exporter labels it."""
    plain = f"irate(node_mountstats_nfs_{kind}_bytes_total{{{{{{mm}}}}}}[1m])"
    direct = f"irate(node_mountstats_nfs_direct_{kind}_bytes_total{{{{{{mm}}}}}}[1m])"
    return f"({plain} + {direct}) or {plain}"


def presence_query(keys: Iterable[str] = PRESENCE_GPU) -> str:
    """The template of `gpu_nodes`: one series a node with a series of these fields."""
    return 'max by ({ids}) ({{__name__=~"' + _names(gpu_names(keys)) + '"{m}}})'


# name -> PromQL template. A refresh runs them concurrently (a few at once), less those
# the map on screen does not need (skipped, the presence while every GPU's temperature
# is asked) and the error counters between their reads.
LIVE_QUERIES: dict[str, str] = {
    # (Separate queries: `or` matches series by their labels without the name, so two
    # of one GPU under different names would keep only the first.)
    "gpu": gpus_query(DENSE_GPU),
    "gpu_busy": _busy(),
    "gpu_sparse": gpus_query(SPARSE_GPU, " > 0"),
    "gpu_nodes": presence_query(),  # of the PRESENCE_GPU fields not asked of every GPU
    "clock_events": "tuimon_gpu_clock_event_active{{{mm}}} == 1",
    "host": 'max by (__name__, {ids}) ({{__name__=~"' + _names(HOST) + '"{m}}})',
    "host_cpu": ('1 - avg by ({ids}) (rate(node_cpu_seconds_total{{mode="idle"{m}}}'
                 '[1m]))'),
    # Who is who: node_exporter's host name for its instance; the targets whose last
    # scrape failed.
    "uname": "max by (instance, nodename) (node_uname_info{{{mm}}})",
    "up": "up{{{mm}}} == 0",
    # Only the ports not ACTIVE and LinkUp (no state reads as up).
    **{f"port_{key}": ("max by (__name__, " + PORT_BY + ') ({{__name__=~"'
                       + _names(n for n, k in PORT_GAUGES.items() if k == key) + '"{m}}}) != '
                       + str(healthy))
       for key, healthy in PORT_HEALTHY.items()},
    "ib_tx": _ports(_counter(_COUNTER["tx_bytes"])),
    "ib_rx": _ports(_counter(_COUNTER["rx_bytes"])),
    "ib_wait": _ports(_counter(_COUNTER["xmit_wait"])),
    # The port error counters as they stand, where not 0 (on a healthy fabric, few
    # ports), every port's state (PORT_READ_SERIES), and the counters our agent could
    # not read (PORT_UNREADABLE_METRIC, where any): the viewer counts what each grew by
    # since it last read them. One selection of the counters; the
    # difference to a minute ago took two, and was the most expensive query of a
    # refresh (4 s of the server's time at 4096 nodes).
    # (`or` matches series on their labels without the name: the second part's carry a
    # label of their own, so a port's state is not taken for its counters.)
    "ib_errors": "max by (__name__, " + PORT_BY + ') ({{__name__=~"'
                 + _names(PORT_ERROR_SERIES) + '"{m}}} > 0) or label_replace(max by '
                 '(__name__, ' + PORT_BY + ') ({{__name__=~"'
                 + _names(PORT_READ_SERIES) + '"{m}}}), "tuimon_read", "1", "", "")'
                 ' or max by (__name__, counter, ' + PORT_BY + ') ('
                 + PORT_UNREADABLE_METRIC + '{{counter=~"' + "|".join(PORT_ERROR_COUNTERS)
                 + '"{m}}})',
    "fs_read": f"irate({FS_COUNTERS_READ[0].metric}_total{{{{{{mm}}}}}}[1m]) or "
               + _nfs("read"),
    "fs_write": f"irate({FS_COUNTERS_READ[1].metric}_total{{{{{{mm}}}}}}[1m]) or "
                + _nfs("write"),
    "nfs_mounts": "node_mountstats_nfs_mountpoint_info{{{mm}}}",
    "fs_size": 'node_filesystem_size_bytes{{fstype=~"' + SHARED_FSTYPES_RE + '"{m}}}',
    "fs_avail": 'node_filesystem_avail_bytes{{fstype=~"' + SHARED_FSTYPES_RE + '"{m}}}',
    "disk_read": _counter(DISK_COUNTERS_READ[0]),
    "disk_write": _counter(DISK_COUNTERS_READ[1]),
    "job_wall": "rate(tuimon_job_wall_seconds_total{{{mm}}}[1m])",
    "job_compute": "rate(tuimon_job_compute_seconds_total{{{mm}}}[1m])",
    "job_samples": "rate(tuimon_job_samples_total{{{mm}}}[1m])",
    "job_steps": "rate(tuimon_job_steps_total{{{mm}}}[1m])",
    # Only the kinds a rank waited on lately (the agent exports every kind from zero).
    "job_waits": "rate(tuimon_job_wait_seconds_total{{{mm}}}[1m]) > 0",
}

# The error budget from the job counters: one query for the SLO window, one per burn
# window; run every `budget_every` seconds (they read a lot of data).
JOB_BY = "exported_job, job"

# Each node's last hour of each job, as its agent sends it (its steps' `windows`): the
# counters' increase over the hour, summed over the node's ranks; read with the budget
# and kept between. With the live rates (the last minute), the viewer reads a job's SLI
# windows and judges its efficiency drop from these as from the agents' own.
JOB_HOUR: dict[str, str] = {
    f"hour_{key}": ("sum by (" + JOB_BY + ", {ids}) (increase(" + name + "{{{mm}}}[1h]))")
    for key, name in (("wall", "tuimon_job_wall_seconds_total"),
                      ("compute", "tuimon_job_compute_seconds_total"),
                      ("samples", "tuimon_job_samples_total"))}
JOB_HOUR["hour_waits"] = ("sum by (" + JOB_BY + ", kind, {ids}) (increase("
                          "tuimon_job_wait_seconds_total{{{mm}}}[1h])) > 0")


def budget_queries(window_hours: float) -> dict[str, str]:
    wall = "sum by (" + JOB_BY + ") (increase(tuimon_job_wall_seconds_total{{{mm}}}[{w}]))"
    compute = ("sum by (" + JOB_BY + ") (increase(tuimon_job_compute_seconds_total{{{mm}}}"
               "[{w}]))")
    ranks = "count by (" + JOB_BY + ") (tuimon_job_wall_seconds_total{{{mm}}})"
    waits = ("sum by (" + JOB_BY + ", kind) (increase(tuimon_job_wait_seconds_total{{{mm}}}"
             "[{w}]))")
    out = {
        # run time and effective time, in hours of the job (rank-seconds / ranks)
        "budget_total": f"{wall} / {ranks} / 3600".replace("{w}", f"{int(window_hours)}h"),
        "budget_effective": f"{compute} / {ranks} / 3600".replace(
            "{w}", f"{int(window_hours)}h"),
        # what the rest was spent waiting on, by kind, in the same hours
        "budget_waits": (f"{waits} / on ({JOB_BY}) group_left () {ranks} / 3600"
                         .replace("{w}", f"{int(window_hours)}h")),
    }
    for w in BURN_WINDOWS_S:
        out[f"ratio_{w}"] = f"1 - {compute} / {wall}".replace("{w}", w)
    return out


# Every INVENTORY_EVERY_S (and at the first refresh): kept between, for the nodes the
# live queries answer for.
INVENTORY_QUERIES: dict[str, str] = {
    "gpu_slow": gpus_query(SLOW_GPU),
    "gpu_total": FB_TOTAL_QUERY,
    # The GPUs' names, UUIDs and bus ids: one series a GPU (and MIG instance), from the
    # labels of its memory-used series (or our agent's up mark: a failed GPU has only
    # that), or of its busy measure where it has neither (every series of a GPU carries
    # them; selecting all of them cost the server twice as much).
    "gpu_info": " or ".join(
        "group by (" + INFO_BY + ') ({{__name__=~"' + _names(gpu_names(keys)) + '"{m}}})'
        for keys in (["mem_used", "_up"], BUSY)),
    "port_rate": ('max by (__name__, ' + PORT_BY + ') ({{__name__=~"'
                  + _names(n for n, key in PORT_GAUGES.items() if key == "rate") + '"{m}}})'),
    # The GPUs with a series of the fields asked only while drawn, of those not asked
    # (gpu_drawn_query): while a map draws none of them, a GPU that has no other series
    # (a real A800 node's MIG GPUs export only their clock) is still there, not gone.
    "gpu_drawn": "",  # made per refresh
    # Which health counters each node's exporters export at all: those the sparse answer
    # leaves out are 0 there (a rule counting their increase needs where they start).
    "gpu_exported": 'group by (__name__, {ids}) ({{__name__=~"' + _names(gpu_names(SPARSE_GPU))
                    + '"{m}}})',
}


# The inventory's queries that give a GPU its memory's total, in the order they are
# read: the total made from used + free first, so that an exporter's own total wins.
TOTALS = ("gpu_total", "gpu_slow")


def gpu_drawn_query(unasked: Iterable[str]) -> str:
    """The template of the inventory's `gpu_drawn`: the GPUs with a series of these
    fields (those asked only while drawn, and not asked now)."""
    return ('group by (' + FB_BY + ') ({{__name__=~"' + _names(gpu_names(unasked))
            + '"{m}}})')


def detail_query(matchers: Iterable[str], match: str) -> str | None:
    """Every GPU series of the machines these label matchers select (the nodes whose
    screen is open), with their labels; None when there are none."""
    extra = f",{match}" if match else ""
    names = _names(gpu_names())
    parts = [f'{{__name__=~"{names}",{m}{extra}}}' for m in sorted(set(matchers))]
    return " or ".join(parts) or None


def render(template: str, match: str, ids: Iterable[str] = ()) -> str:
    """Fill a template with the extra matchers (`{m}` after other matchers, `{mm}` alone)
    and the labels that say whose a series is (`{ids}`)."""
    return template.format(m=f",{match}" if match else "", mm=match,
                           ids=", ".join(ids) or "instance")
