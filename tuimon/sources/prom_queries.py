"""The PromQL a Prometheus source runs, and how each result maps onto protocol fields.

A fixed set of instant queries per refresh, whatever the node count: each query selects
a family of series for every node at once (a `__name__` regex, or one `rate()` with the
agent's and node_exporter's names joined by `or`). Three vocabularies are understood,
all from the one name table (tuimon_core.protocol.fields):

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

from tuimon_core.filesystems import SHARED_FSTYPES as SHARED
from tuimon_core.protocol.fields import (
    CLOCK_EVENT_REASONS,
    DISK_COUNTERS_READ,
    FS_COUNTERS_READ,
    GPU_FIELDS,
    HOST_FIELDS,
    MIB,
    PORT_COUNTERS_READ,
    PORT_GAUGE_METRICS,
    Counter,
)

# Prometheus name -> (wire key, factor to the wire's unit, added to the others)
Mapping = dict[str, tuple[str, float, bool]]

TUIMON_GPU: Mapping = {f.exposed: (f.key, 1.0, False) for f in GPU_FIELDS if f.exposed}
TUIMON_GPU.update({"tuimon_gpu_up": ("_up", 1.0, False),
                   "tuimon_gpu_sm_clock_max_hertz": ("_max_sm_clock", 1.0, False)})
DCGM_GPU: Mapping = {d.name: (f.key, d.scale, d.add) for f in GPU_FIELDS for d in f.dcgm}
DCGM_GPU.update({
    "DCGM_FI_DEV_FB_FREE": ("_fb_free", MIB, False),
    # The clock-event (throttle) bit mask; renamed in DCGM 3.
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("_throttle_bits", 1.0, False),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("_throttle_bits", 1.0, False),
})
# Which of several dcgm names for one field wins: the earlier in the table.
DCGM_RANK = {d.name: i for f in GPU_FIELDS for i, d in enumerate(f.dcgm)}

HOST: Mapping = {f.exposed: (f.key, 1.0, False) for f in HOST_FIELDS if f.exposed}
HOST.update({f.node_exporter: (f.key, 1.0, False) for f in HOST_FIELDS if f.node_exporter})

PORT_GAUGES: dict[str, str] = {name: key for key, ours, theirs, _ in PORT_GAUGE_METRICS
                                for name in (ours, theirs)}

# dcgm-exporter's clock-event (throttle) bit mask, as NVML names the bits.
THROTTLE_BITS = dict(CLOCK_EVENT_REASONS)

_COUNTER = {c.key: c for c in PORT_COUNTERS_READ}
# The port error counters, by either exporter's name (each with `_total`).
IB_ERRORS_TUIMON = "|".join(c.metric for c in PORT_COUNTERS_READ if not c.rate)
IB_ERRORS_NODE = "|".join(c.node_exporter or "" for c in PORT_COUNTERS_READ if not c.rate)
# File systems worth showing from node_filesystem (capacity, and the mount point of an
# NFS export, which node_exporter's mountstats metrics do not carry).
# A regex in a PromQL string literal: `fuse\.weka`, its backslash escaped again.
SHARED_FSTYPES = "|".join(re.escape(t).replace("\\", "\\\\") for t in sorted(SHARED))


def _names(table: Iterable[str]) -> str:
    return "|".join(table)


# Live rates from the last two scrapes (irate): a live view wants what happens now, and
# rate() over a range is an average that reads low for a minute after a series starts.
LIVE_RATE = "irate({sel}[1m])"


def _either(tuimon: str, node: str, how: str = LIVE_RATE) -> str:
    return f"{how.format(sel=tuimon)} or {how.format(sel=node)}"


def _counter(c: Counter) -> str:
    """A counter's live rate, by our agent's name or else node_exporter's."""
    return _either(c.metric + "_total{{{mm}}}", f"{c.node_exporter}{{{{{{mm}}}}}}")


def _moved(by: str, selector: str) -> str:
    now = f"sum by ({by}) ({selector})"
    before = f"sum by ({by}) ({selector} offset 1m)"
    return f"clamp_min({now} - {before}, 0)"


def _nfs(kind: str) -> str:
    """NFS bytes through the page cache plus O_DIRECT bytes (which a training job's
    checkpoint writes often are), per mount as node_exporter labels it."""
    plain = f"irate(node_mountstats_nfs_{kind}_bytes_total{{{{{{mm}}}}}}[1m])"
    direct = f"irate(node_mountstats_nfs_direct_{kind}_bytes_total{{{{{{mm}}}}}}[1m])"
    return f"({plain} + {direct}) or {plain}"


# name -> PromQL template. Every refresh runs all of them, concurrently (a few at once).
LIVE_QUERIES: dict[str, str] = {
    "gpu": '{{__name__=~"' + _names(TUIMON_GPU) + '"{m}}}',
    "clock_events": "tuimon_gpu_clock_event_active{{{mm}}} == 1",
    "dcgm": '{{__name__=~"' + _names(DCGM_GPU) + '"{m}}}',
    "host": '{{__name__=~"' + _names(HOST) + '"{m}}}',
    "host_cpu": '1 - avg by (instance) (rate(node_cpu_seconds_total{{mode="idle"{m}}}[1m]))',
    # Who is who: node_exporter's host name for its instance, and every target's health.
    "uname": "node_uname_info{{{mm}}}",
    "up": "up{{{mm}}}",
    "port_gauges": '{{__name__=~"' + _names(PORT_GAUGES) + '"{m}}}',
    "ib_tx": _counter(_COUNTER["tx_bytes"]),
    "ib_rx": _counter(_COUNTER["rx_bytes"]),
    "ib_wait": _counter(_COUNTER["xmit_wait"]),
    # Error counters that moved in the last minute, all kinds summed per port. Not
    # increase() over a name regex: that would drop the names and collide.
    "ib_errors": (
        _moved("node, instance, device, port",
               '{{__name__=~"(' + IB_ERRORS_TUIMON.replace("|", "_total|") + '_total)"{m}}}')
        + " or " + _moved("instance, device, port",
                          '{{__name__=~"(' + IB_ERRORS_NODE + ')"{m}}}')),
    "fs_read": f"irate({FS_COUNTERS_READ[0].metric}_total{{{{{{mm}}}}}}[1m]) or "
               + _nfs("read"),
    "fs_write": f"irate({FS_COUNTERS_READ[1].metric}_total{{{{{{mm}}}}}}[1m]) or "
                + _nfs("write"),
    "nfs_mounts": "node_mountstats_nfs_mountpoint_info{{{mm}}}",
    "fs_size": 'node_filesystem_size_bytes{{fstype=~"' + SHARED_FSTYPES + '"{m}}}',
    "fs_avail": 'node_filesystem_avail_bytes{{fstype=~"' + SHARED_FSTYPES + '"{m}}}',
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
    for w in ("5m", "30m", "1h", "6h", "1d", "3d"):
        out[f"ratio_{w}"] = f"1 - {compute} / {wall}".replace("{w}", w)
    return out


def render(template: str, match: str) -> str:
    """Fill a template with the extra matchers: `{m}` after other matchers, `{mm}` alone."""
    return template.format(m=f",{match}" if match else "", mm=match)
